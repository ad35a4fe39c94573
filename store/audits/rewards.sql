-- Reward by difficulty bucket and step window, by difficulty bucket, and by topic cluster, per run.
-- usage: rlhf audit rewards [WINDOW=100]
-- param: window BIGINT = 100 : steps per row of the step breakdown
-- Reads rollouts, pool (topic_cluster: the KMeans diversity cluster, seed 000 §3.1) and
-- difficulty (bucket low 0-3 / mid 4-6 / high 7-10, seed 000 §4.2). A prompt with no difficulty
-- row is '(unscored)'; one not in the pool has topic_cluster NULL. `breakdown` says which
-- grouping a row belongs to; NULL in a grouping column means "all".
-- Read from the rollups rollout_steps and rollout_topics (store/rollups/, store/rollup.py): the
-- rollouts summed per step and bucket, and per topic, once, instead of every rollout row. Every
-- rollout is joined to its prompt's bucket and topic there, by prompt_key (store/hashing.py: 64
-- bits of sha256(prompt_id)). A key stands for one prompt unless two ids collide (odds about
-- n^2 / 2^65 for n prompts): the pool and difficulty tables are checked for such a pair and the
-- audit stops with an error if they hold one. Not checked (it would cost reading every row's id
-- again): a rolled-out prompt outside the pool colliding with a pool prompt, whose rollouts would
-- then count in that prompt's cell (odds about pool size / 2^64 for each such prompt).
WITH windows AS (
    SELECT run_id, step // $window * $window AS step_from, bucket,
           sum(n) AS n, sum(n_scored) AS n_scored, sum(reward_sum) AS s, sum(reward_sumsq) AS ss
    FROM rollout_steps
    GROUP BY ALL
), cells AS (
    -- the bucket rows from the step windows, the topic rows from the per-topic sums
    SELECT CASE WHEN grouping(step_from) = 0 THEN 'bucket x step' ELSE 'bucket' END AS breakdown,
           run_id, step_from, bucket, NULL::INTEGER AS topic_cluster,
           sum(n) AS n, sum(n_scored) AS n_scored, sum(s) AS s, sum(ss) AS ss
    FROM windows
    GROUP BY GROUPING SETS ((run_id, step_from, bucket), (run_id, bucket))
    UNION ALL
    SELECT 'topic', run_id, NULL, NULL, topic_cluster,
           sum(n), sum(n_scored), sum(reward_sum), sum(reward_sumsq)
    FROM rollout_topics
    GROUP BY ALL
)
SELECT breakdown,
       run_id,
       step_from,
       ['low', 'mid', 'high', '(unscored)'][bucket + 1] AS difficulty_bucket,
       topic_cluster,
       n::BIGINT AS rollouts,
       n_scored::BIGINT AS scored,
       round(s / nullif(n_scored, 0), 4) AS reward_mean,
       -- sample standard deviation from the sums: sqrt((ss - s^2 / n) / (n - 1)), n > 1
       CASE WHEN n_scored > 1
            THEN round(sqrt(greatest((ss - s * s / n_scored) / (n_scored - 1), 0)), 4)
       END AS reward_std
FROM cells
ORDER BY run_id, breakdown, step_from NULLS FIRST, bucket, topic_cluster
