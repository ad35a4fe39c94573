-- What produced a checkpoint: per run of its ancestry, the steps, data versions, prompt sources,
-- rollouts (by scorer: light RM, strong RM, reused, other) and RM versions that trained it.
-- usage: rlhf audit lineage CHECKPOINT
-- param: checkpoint VARCHAR : checkpoint_id to trace (list them: rlhf query "FROM checkpoints")
-- Reads checkpoints, rollouts, pool and rm_scores. The ancestry is the chain of parent_id links
-- (a run resumed or forked from another run's checkpoint continues that run's lineage). From
-- each run in the chain, the rollouts up to the chain's last checkpoint of that run trained it.
-- One row per (run, source type), oldest run first; an empty result means an unknown checkpoint.
-- Rollouts are grouped per (run, prompt_key) and joined to the pool by prompt_key
-- (store/hashing.py: 64 bits of sha256(prompt_id); an 8-byte integer instead of a 64-character
-- string, bench/bench_query.py). A key stands for one prompt unless two ids collide (odds about
-- n^2 / 2^65 for n prompts): the pool is checked for such a pair (milliseconds) and the audit
-- stops with an error if it holds one. Not checked (it would cost reading every row's id again):
-- a rolled-out prompt outside the pool colliding with another prompt, which would then count as
-- that prompt (odds about (pool size + other prompts) / 2^64 for each such prompt).
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
), pool_by_key AS (
    SELECT prompt_key, source_type
    FROM pool
    WHERE (SELECT count(*) FROM (SELECT prompt_key FROM pool GROUP BY prompt_key
                                 HAVING count(DISTINCT prompt_id) > 1)) = 0
       OR error('two prompts of the pool share one prompt_key (a 64-bit hash collision, see '
                || 'store/hashing.py): this audit would merge them')
), per_prompt AS (
    -- One pass over the rollouts, grouped per (segment, prompt): the join to the pool is then
    -- one row per prompt, and scorers are counted, not listed, per rollout. Integers only in the
    -- grouping (the segment's depth, not its run_id string) and the step cut as a filter after
    -- an equi-join: each measured faster on 10M rows (bench/bench_query.py).
    SELECT s.depth, r.prompt_key,
           count(*) AS n, count(r.reward) AS n_scored, sum(r.reward) AS reward_sum,
           min(r.step) AS first_step, max(r.step) AS last_step,
           count(*) FILTER (WHERE r.scorer = 'light_rm') AS light_rm,
           count(*) FILTER (WHERE r.scorer = 'strong_rm') AS strong_rm,
           count(*) FILTER (WHERE r.scorer = 'reused') AS reused
    FROM rollouts AS r
    JOIN segments AS s ON r.run_id = s.run_id
    WHERE r.step <= s.last_step
    GROUP BY ALL
), rm_used AS (
    -- Each RM version's first step per run (a cheap grouping on short, repeated names); the
    -- versions that scored within the segment are those that started before its last step.
    SELECT run_id, rm_name, rm_version, min(step) AS first_step
    FROM rm_scores
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
       min(p.first_step) AS first_step,
       max(p.last_step) AS last_step,
       s.data_versions,
       coalesce(pool.source_type, '(not in pool)') AS source_type,
       sum(p.n)::BIGINT AS rollouts,
       count(*) AS prompts,
       round(sum(p.reward_sum) / nullif(sum(p.n_scored), 0), 4) AS reward_mean,
       sum(p.light_rm)::BIGINT AS by_light_rm,
       sum(p.strong_rm)::BIGINT AS by_strong_rm,
       sum(p.reused)::BIGINT AS reused,
       (sum(p.n) - sum(p.light_rm) - sum(p.strong_rm) - sum(p.reused))::BIGINT AS other_scorer,
       coalesce(any_value(v.rm_versions), []) AS rm_versions
FROM segments AS s
JOIN per_prompt AS p USING (depth)
LEFT JOIN pool_by_key AS pool USING (prompt_key)
LEFT JOIN rm_versions AS v ON v.run_id = s.run_id
GROUP BY s.run_id, s.started_from, s.data_versions, s.depth, source_type
ORDER BY s.depth DESC, source_type
