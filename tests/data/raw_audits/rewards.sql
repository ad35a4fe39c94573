-- Reward by difficulty bucket and step window, by difficulty bucket, and by topic cluster, per run.
-- usage: rlhf audit rewards [WINDOW=100]
-- param: window BIGINT = 100 : steps per row of the step breakdown
-- Reads rollouts, pool (topic_cluster: the KMeans diversity cluster, seed 000 §3.1) and
-- difficulty (bucket low 0-3 / mid 4-6 / high 7-10, seed 000 §4.2). A prompt with no difficulty
-- row is '(unscored)'; one not in the pool has topic_cluster NULL. `breakdown` says which
-- grouping a row belongs to; NULL in a grouping column means "all".
-- Every rollout is joined to its prompt's (topic, bucket) by prompt_key (store/hashing.py: 64 bits
-- of sha256(prompt_id); an 8-byte integer instead of a 64-character string, bench/bench_query.py).
-- A key stands for one prompt unless two ids collide (odds about n^2 / 2^65 for n prompts): the
-- pool and difficulty tables are checked for such a pair (milliseconds) and the audit stops with
-- an error if they hold one. Not checked (it would cost reading every row's id again): a
-- rolled-out prompt outside the pool colliding with a pool prompt, whose rollouts would then
-- count in that prompt's cell (odds about pool size / 2^64 for each such prompt).
WITH dims AS (
    SELECT pool.prompt_key, pool.topic_cluster,
           coalesce(difficulty.bucket, '(unscored)') AS bucket
    FROM pool
    LEFT JOIN difficulty USING (prompt_key)
    WHERE (SELECT count(*) FROM (SELECT prompt_key FROM (SELECT prompt_key, prompt_id FROM pool
                                                         UNION SELECT prompt_key, prompt_id FROM difficulty)
                                 GROUP BY prompt_key HAVING count(*) > 1)) = 0
       OR error('two prompts of the pool or the difficulty table share one prompt_key (a 64-bit '
                || 'hash collision, see store/hashing.py): this audit would merge them')
), cell_ids AS (
    -- one small integer per (topic, bucket) cell, so the join per rollout carries a single int
    SELECT DISTINCT topic_cluster, bucket, dense_rank() OVER (ORDER BY topic_cluster, bucket) AS cell
    FROM dims
), cell_of AS (
    SELECT dims.prompt_key, cell_ids.cell
    FROM dims
    JOIN cell_ids ON cell_ids.topic_cluster = dims.topic_cluster AND cell_ids.bucket = dims.bucket
), sums AS (
    -- One pass over the rollouts into (run, window, cell) sums; the three breakdowns are then
    -- grouped from these cells, not from the rollouts (bench/bench_query.py).
    SELECT r.run_id,
           r.step // $window * $window AS step_from,
           c.cell,
           count(*) AS n,
           count(r.reward) AS n_scored,
           sum(r.reward::DOUBLE) AS s,
           sum(r.reward::DOUBLE * r.reward::DOUBLE) AS ss
    FROM rollouts AS r
    LEFT JOIN cell_of AS c USING (prompt_key)
    GROUP BY ALL
), cells AS (
    SELECT run_id, step_from, coalesce(cell_ids.bucket, '(unscored)') AS difficulty_bucket,
           cell_ids.topic_cluster, n, n_scored, s, ss
    FROM sums
    LEFT JOIN cell_ids USING (cell)
)
SELECT CASE WHEN grouping(step_from) = 0 THEN 'bucket x step'
            WHEN grouping(difficulty_bucket) = 0 THEN 'bucket'
            ELSE 'topic' END AS breakdown,
       run_id,
       step_from,
       difficulty_bucket,
       topic_cluster,
       sum(n)::BIGINT AS rollouts,
       sum(n_scored)::BIGINT AS scored,
       round(sum(s) / nullif(sum(n_scored), 0), 4) AS reward_mean,
       -- sample standard deviation from the sums: sqrt((ss - s^2 / n) / (n - 1)), n > 1
       CASE WHEN sum(n_scored) > 1
            THEN round(sqrt(greatest((sum(ss) - sum(s) * sum(s) / sum(n_scored))
                                     / (sum(n_scored) - 1), 0)), 4) END AS reward_std
FROM cells
GROUP BY GROUPING SETS ((run_id, step_from, difficulty_bucket),
                        (run_id, difficulty_bucket),
                        (run_id, topic_cluster))
ORDER BY run_id,
         breakdown,
         step_from NULLS FIRST,
         CASE difficulty_bucket WHEN 'low' THEN 0 WHEN 'mid' THEN 1 WHEN 'high' THEN 2 ELSE 3 END,
         topic_cluster
