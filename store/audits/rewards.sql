-- Reward by difficulty bucket and step window, by difficulty bucket, and by topic cluster, per run.
-- usage: rlhf audit rewards [WINDOW=100]
-- param: window BIGINT = 100 : steps per row of the step breakdown
-- Reads rollouts, pool (topic_cluster: the KMeans diversity cluster, seed 000 §3.1) and
-- difficulty (bucket low 0-3 / mid 4-6 / high 7-10, seed 000 §4.2). A prompt with no difficulty
-- row is '(unscored)'; one not in the pool has topic_cluster NULL. `breakdown` says which
-- grouping a row belongs to; NULL in a grouping column means "all".
WITH dims AS (
    SELECT pool.prompt_id, pool.topic_cluster, coalesce(difficulty.bucket, '(unscored)') AS bucket
    FROM pool
    LEFT JOIN difficulty USING (prompt_id)
), cells AS (
    -- One pass over the rollouts into (run, window, bucket, topic) cells of sums; the three
    -- breakdowns are then grouped from the cells, not from the rollouts (bench/bench_query.py).
    SELECT r.run_id,
           r.step // $window * $window AS step_from,
           coalesce(dims.bucket, '(unscored)') AS difficulty_bucket,
           dims.topic_cluster,
           count(*) AS n,
           count(r.reward) AS n_scored,
           sum(r.reward::DOUBLE) AS s,
           sum(r.reward::DOUBLE * r.reward::DOUBLE) AS ss
    FROM rollouts AS r
    LEFT JOIN dims USING (prompt_id)
    GROUP BY ALL
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
