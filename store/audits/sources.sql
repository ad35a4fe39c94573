-- Prompts kept and rejected, pool size, rollouts, reward and tier by source type.
-- usage: rlhf audit sources
-- Reads prompts, rejected, pool and rollouts. Source trust is seed 000 §4.2; tiers are seed 001
-- §4.1 (0 probe, 1 policy + light RM, 2 escalated to the strong RM / a human).
-- Rollouts are read from the rollups (store/rollups/): rollout_steps (per step and source type)
-- and run_prompts (the prompts each run rolled out, by prompt_key: store/hashing.py, 64 bits of
-- sha256(prompt_id)).
-- A key stands for one prompt unless two ids collide (odds about n^2 / 2^65 for n prompts): the
-- pool is checked for such a pair (milliseconds) and the audit stops with an error if it holds
-- one. Not checked (it would cost reading every row's id again): a rolled-out prompt outside the
-- pool colliding with another prompt, which would then count as that prompt (odds about
-- (pool size + other prompts) / 2^64 for each such prompt).
WITH kept AS (
    SELECT source_type, count(*) AS kept
    FROM prompts
    GROUP BY source_type
), quarantined AS (
    SELECT coalesce(source_type, '(unknown)') AS source_type, count(*) AS rejected
    FROM rejected
    GROUP BY ALL
), pooled AS (
    SELECT source_type, count(*) AS in_pool
    FROM pool
    GROUP BY source_type
), pool_by_key AS (
    SELECT prompt_key, source_type
    FROM pool
    WHERE (SELECT count(*) FROM (SELECT prompt_key FROM pool GROUP BY prompt_key
                                 HAVING count(DISTINCT prompt_id) > 1)) = 0
       OR error('two prompts of the pool share one prompt_key (a 64-bit hash collision, see '
                || 'store/hashing.py): this audit would merge them')
), spread AS (
    SELECT coalesce(prompts.source_type, '(not in pool)') AS source_type,
           count(*) AS prompts_rolled_out
    FROM (SELECT DISTINCT prompt_key FROM run_prompts) AS p
    LEFT JOIN pool_by_key AS prompts USING (prompt_key)
    GROUP BY ALL
), rolled AS (
    SELECT coalesce(source_type, '(not in pool)') AS source_type,
           sum(n)::BIGINT AS rollouts,
           sum(reward_sum) / nullif(sum(n_scored), 0) AS reward_mean,
           sum(tier0) / sum(n) AS tier0_share,
           sum(tier1) / sum(n) AS tier1_share,
           sum(tier2) / sum(n) AS tier2_share
    FROM rollout_steps
    GROUP BY ALL
), sources AS (
    SELECT source_type FROM kept
    UNION SELECT source_type FROM quarantined
    UNION SELECT source_type FROM pooled
    UNION SELECT source_type FROM rolled
)
SELECT source_type,
       coalesce(kept, 0) AS kept,
       coalesce(rejected, 0) AS rejected,
       round(coalesce(rejected, 0) / nullif(coalesce(kept, 0) + coalesce(rejected, 0), 0), 4)
           AS rejected_share,
       coalesce(in_pool, 0) AS in_pool,
       coalesce(rollouts, 0) AS rollouts,
       coalesce(prompts_rolled_out, 0) AS prompts_rolled_out,
       round(reward_mean, 4) AS reward_mean,
       round(tier0_share, 4) AS tier0_share,
       round(tier1_share, 4) AS tier1_share,
       round(tier2_share, 4) AS tier2_share
FROM sources
LEFT JOIN kept USING (source_type)
LEFT JOIN quarantined USING (source_type)
LEFT JOIN pooled USING (source_type)
LEFT JOIN rolled USING (source_type)
LEFT JOIN spread USING (source_type)
ORDER BY source_type
