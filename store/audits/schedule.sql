-- Rollout-scheduler skip rate by step window, by difficulty bucket and by topic cluster, per run.
-- usage: rlhf audit schedule [WINDOW=20]
-- param: window BIGINT = 20 : steps per row of the step breakdown
-- Reads schedule, written by `rlhf ppo --schedule` when ppo.schedule_on (issue 14, seed 001
-- §4.3: skip a prompt when >= 7 of its 10 nearest historical prompts have reward variance below
-- the low threshold), joined to difficulty (bucket low / mid / high, seed 000 §4.2) by
-- prompt_key; the topic cluster is the row's own (the pool's). A decision is `rollout`, `skip`
-- or `unused` (kept, but the refilled batch was already full): skip_rate = skips / (rollouts +
-- skips); trigger_rate = 1 - skip_rate (plain PPO: 1). `explored`: rule skips rolled out anyway
-- (exploration); `high_uncertainty`: roll-outs that marked their topic cluster for Level 2.
-- The join is by prompt_key (store/hashing.py), checked for a collision in the difficulty table
-- as the other keyed audits check theirs. `breakdown` says which grouping a row belongs to; NULL in a grouping column means "all".
WITH decided AS (
    SELECT s.run_id, s.step, s.decision, s.reason, s.high_uncertainty, s.topic_cluster,
           s.neighbour_mean, coalesce(d.bucket, '(unscored)') AS bucket
    FROM schedule AS s
    LEFT JOIN difficulty AS d USING (prompt_key)
    WHERE s.decision IN ('rollout', 'skip')
      AND ((SELECT count(*) FROM (SELECT prompt_key FROM (SELECT DISTINCT prompt_key, prompt_id
                                                          FROM difficulty)
                                  GROUP BY prompt_key HAVING count(*) > 1)) = 0
           OR error('two prompts of the difficulty table share one prompt_key (a 64-bit hash '
                    || 'collision, see store/hashing.py): this audit would merge them'))
)
SELECT run_id,
       CASE WHEN GROUPING(step_from) = 0 THEN 'step window'
            WHEN GROUPING(bucket) = 0 THEN 'difficulty bucket'
            WHEN GROUPING(topic_cluster) = 0 THEN 'topic cluster'
            ELSE 'run' END AS breakdown,
       step_from, bucket, topic_cluster,
       count(*) AS decisions,
       count(*) FILTER (WHERE decision = 'skip') AS skips,
       round(count(*) FILTER (WHERE decision = 'skip') / count(*), 4) AS skip_rate,
       round(1 - count(*) FILTER (WHERE decision = 'skip') / count(*), 4) AS trigger_rate,
       count(*) FILTER (WHERE reason = 'explore') AS explored,
       count(*) FILTER (WHERE high_uncertainty) AS high_uncertainty,
       round(avg(neighbour_mean) FILTER (WHERE decision = 'skip'), 4) AS skip_estimate_mean
FROM (SELECT *, (step - 1) // $window * $window + 1 AS step_from FROM decided)
GROUP BY GROUPING SETS ((run_id), (run_id, step_from), (run_id, bucket), (run_id, topic_cluster))
ORDER BY run_id, breakdown, step_from NULLS FIRST, bucket NULLS FIRST, topic_cluster NULLS FIRST
