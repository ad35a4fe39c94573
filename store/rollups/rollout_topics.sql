-- Rollouts per (run, topic cluster): counts and reward sums, for `rlhf audit rewards`' topic rows.
-- reads: rollouts, pool
-- topic_cluster is the prompt's pool row's KMeans diversity cluster (seed 000 §3.1); NULL for a
-- prompt not in the pool. Joined by prompt_key; the pool's key check is rollout_steps'.
SELECT r.run_id,
       pool.topic_cluster,
       count(*) AS n,
       count(r.reward) AS n_scored,
       sum(r.reward::DOUBLE) AS reward_sum,
       sum(r.reward::DOUBLE * r.reward::DOUBLE) AS reward_sumsq
FROM rollouts AS r
LEFT JOIN pool USING (prompt_key)
GROUP BY ALL
