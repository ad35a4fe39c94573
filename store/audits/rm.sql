-- Reward-model confidence, low-confidence gating, fine-tune queueing and escalations per step window.
-- usage: rlhf audit rm [WINDOW=100] [THRESHOLD=0.6]
-- param: window BIGINT = 100 : steps per row
-- param: threshold DOUBLE = 0.6 : confidence below which a sample is gated (seed 000 §3.4)
-- Reads rm_scores, written by `rlhf ppo --rm-scores`: one row per RM score PPO used (the light
-- RM's for every scored rollout, the strong RM's too for an escalated one). Seed 000 §3.4: a
-- score with confidence < 0.6 queues its sample for RM fine-tuning (`queued`, against each RM's
-- own gate; the seed also keeps it out of the update, which the trainer does not do yet);
-- seed 001 §4.1: Level-2 escalation (strong RM / human, `escalated`, marked on both rows of an
-- escalated rollout) should stay under 7% of rollouts: read it on the light RM's rows.
-- Issue 15: `by_*` count escalations by Level-2 trigger (from the rollouts' `l2_*` flags, on the
-- rows of the RM that re-scored them; a rollout may meet several), `human_labels` the human
-- queue's labels in the window (on the strong RM's rows), and `from_step` / `to_step` the steps
-- an RM version scored: RM evolution's hot-swap shows as a new light_rm version (`swap`, 1 on
-- the first row of each version after the run's first).
-- Read from the rollups rm_steps (scores per step and RM version) and rollout_steps (Level-2
-- flags as bits of `code`); the scores below the threshold, a parameter, from rm_scores itself.
WITH triggers AS (
    SELECT run_id, step // $window * $window AS step_from,
           sum(n) FILTER (WHERE code & 4 = 4) AS by_confidence,
           sum(n) FILTER (WHERE code & 8 = 8) AS by_low_score,
           sum(n) FILTER (WHERE code & 16 = 16) AS by_high_risk,
           sum(n) FILTER (WHERE code & 32 = 32) AS by_cluster
    FROM rollout_steps
    WHERE code >= 4
    GROUP BY ALL
), human AS (
    SELECT run_id, step // $window * $window AS step_from, count(*) AS human_labels
    FROM human_labels
    GROUP BY ALL
), low AS (
    SELECT run_id, step // $window * $window AS step_from, rm_name, rm_version,
           count(*) AS low_confidence
    FROM rm_scores
    WHERE confidence < $threshold
    GROUP BY ALL
), sums AS (
    SELECT run_id,
           step // $window * $window AS step_from,
           rm_name,
           rm_version,
           sum(scored) AS scored,
           sum(score_sum) AS score_sum,
           sum(confidence_sum) AS confidence_sum,
           min(confidence_min) AS confidence_min,
           sum(queued) AS queued,
           sum(escalated) AS escalated,
           min(step) AS first_step,
           max(step) AS last_step
    FROM rm_steps
    GROUP BY ALL
), versions AS (
    -- the steps each RM version scored, from the window sums
    SELECT run_id, rm_name, rm_version, min(first_step) AS from_step, max(last_step) AS to_step
    FROM sums
    GROUP BY ALL
)
SELECT s.run_id, s.step_from, s.rm_name, s.rm_version, scored::BIGINT AS scored,
       round(score_sum / scored, 4) AS score_mean,
       round(confidence_sum / scored, 4) AS confidence_mean,
       round(confidence_min, 4) AS confidence_min,
       round(coalesce(l.low_confidence, 0) / scored, 4) AS low_confidence_share,
       queued::BIGINT AS queued,
       escalated::BIGINT AS escalated,
       round(escalated / scored, 4) AS escalated_share,
       CASE WHEN s.rm_name = 'strong_rm' THEN coalesce(t.by_confidence, 0)::BIGINT
       END AS by_confidence,
       CASE WHEN s.rm_name = 'strong_rm' THEN coalesce(t.by_low_score, 0)::BIGINT
       END AS by_low_score,
       CASE WHEN s.rm_name = 'strong_rm' THEN coalesce(t.by_high_risk, 0)::BIGINT
       END AS by_high_risk,
       CASE WHEN s.rm_name = 'strong_rm' THEN coalesce(t.by_cluster, 0)::BIGINT
       END AS by_cluster,
       CASE WHEN s.rm_name = 'strong_rm' THEN coalesce(h.human_labels, 0) END AS human_labels,
       v.from_step, v.to_step,
       CASE WHEN s.rm_name = 'light_rm' AND s.step_from = v.from_step // $window * $window
                 AND v.from_step > min(v.from_step) OVER (PARTITION BY s.run_id, s.rm_name)
            THEN 1 ELSE 0 END AS swap
FROM sums s
JOIN versions v USING (run_id, rm_name, rm_version)
LEFT JOIN low l ON l.run_id = s.run_id AND l.step_from = s.step_from AND l.rm_name = s.rm_name
               AND l.rm_version IS NOT DISTINCT FROM s.rm_version
LEFT JOIN triggers t ON t.run_id = s.run_id AND t.step_from = s.step_from
LEFT JOIN human h ON h.run_id = s.run_id AND h.step_from = s.step_from
ORDER BY s.run_id, s.step_from, s.rm_name, s.rm_version
