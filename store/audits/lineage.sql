-- What produced a checkpoint: per run of its ancestry, the steps, data versions, prompt sources,
-- rollouts (by scorer: light RM, strong RM, reused, other) and RM versions that trained it.
-- usage: rlhf audit lineage CHECKPOINT
-- param: checkpoint VARCHAR : checkpoint_id to trace (list them: rlhf query "FROM checkpoints")
-- Reads checkpoints, rollouts, pool and rm_scores. The ancestry is the chain of parent_id links
-- (a run resumed or forked from another run's checkpoint continues that run's lineage). From
-- each run in the chain, the rollouts up to the chain's last checkpoint of that run trained it.
-- One row per (run, source type), oldest run first; an empty result means an unknown checkpoint.
-- Read from the rollups (store/rollups/): rollout_steps (rollouts per step and source type),
-- run_prompts (each prompt's first step in a run: a segment's prompts are those it reached by
-- its last step) and rm_steps (scores per step and RM version). Rollouts join the pool by
-- prompt_key (store/hashing.py: 64 bits of sha256(prompt_id)). A key stands for one prompt unless
-- two ids collide (odds about n^2 / 2^65 for n prompts): the pool is checked for such a pair and
-- the audit stops with an error if it holds one. Not checked (it would cost reading every row's
-- id again): a rolled-out prompt outside the pool colliding with another prompt, which would then
-- count as that prompt (odds about (pool size + other prompts) / 2^64 for each such prompt).
WITH RECURSIVE chain AS (
    SELECT checkpoint_id, run_id, step, parent_id, data_version, 0 AS depth
    FROM checkpoints
    WHERE checkpoint_id = $checkpoint
    UNION ALL
    SELECT c.checkpoint_id, c.run_id, c.step, c.parent_id, c.data_version, chain.depth + 1
    FROM checkpoints AS c
    JOIN chain ON c.checkpoint_id = chain.parent_id
    WHERE chain.depth < 100000  -- a parent_id cycle must not loop forever
), segments AS (
    SELECT run_id,
           max(step) AS last_step,
           max(depth) AS depth,
           arg_max_null(parent_id, depth) AS started_from,
           list_sort(list_distinct(list(data_version))) AS data_versions
    FROM chain
    GROUP BY run_id
), per_source AS (
    -- the segment's steps of the rollup, per source type
    SELECT s.run_id,
           coalesce(r.source_type, '(not in pool)') AS source_type,
           min(r.step) AS first_step,
           max(r.step) AS last_step,
           sum(r.n) AS n,
           sum(r.n_scored) AS n_scored,
           sum(r.reward_sum) AS reward_sum,
           sum(r.light_rm) AS light_rm,
           sum(r.strong_rm) AS strong_rm,
           sum(r.reused) AS reused
    FROM rollout_steps AS r
    JOIN segments AS s ON r.run_id = s.run_id
    WHERE r.step <= s.last_step
    GROUP BY ALL
), pool_by_key AS (
    SELECT prompt_key, source_type
    FROM pool
    WHERE (SELECT count(*) FROM (SELECT prompt_key FROM pool GROUP BY prompt_key
                                 HAVING count(DISTINCT prompt_id) > 1)) = 0
       OR error('two prompts of the pool share one prompt_key (a 64-bit hash collision, see '
                || 'store/hashing.py): this audit would merge them')
), prompts AS (
    SELECT s.run_id, coalesce(pool.source_type, '(not in pool)') AS source_type, count(*) AS prompts
    FROM run_prompts AS p
    JOIN segments AS s ON p.run_id = s.run_id
    LEFT JOIN pool_by_key AS pool USING (prompt_key)
    WHERE p.first_step <= s.last_step
    GROUP BY ALL
), rm_used AS (
    -- Each RM version's first step per run; the versions that scored within the segment are
    -- those that started before its last step.
    SELECT run_id, rm_name, rm_version, min(step) AS first_step
    FROM rm_steps
    WHERE run_id IN (SELECT run_id FROM segments)
    GROUP BY ALL
), rm_versions AS (
    SELECT u.run_id, list_sort(list(u.rm_name || ':' || u.rm_version)) AS rm_versions
    FROM rm_used AS u
    JOIN segments AS s ON u.run_id = s.run_id AND u.first_step <= s.last_step
    GROUP BY u.run_id
)
SELECT s.run_id,
       s.started_from,
       p.first_step,
       p.last_step,
       s.data_versions,
       p.source_type,
       p.n::BIGINT AS rollouts,
       q.prompts,
       round(p.reward_sum / nullif(p.n_scored, 0), 4) AS reward_mean,
       p.light_rm::BIGINT AS by_light_rm,
       p.strong_rm::BIGINT AS by_strong_rm,
       p.reused::BIGINT AS reused,
       (p.n - p.light_rm - p.strong_rm - p.reused)::BIGINT AS other_scorer,
       coalesce(v.rm_versions, []) AS rm_versions
FROM segments AS s
JOIN per_source AS p USING (run_id)
JOIN prompts AS q USING (run_id, source_type)
LEFT JOIN rm_versions AS v ON v.run_id = s.run_id
ORDER BY s.depth DESC, p.source_type
