-- Reward-model confidence, low-confidence gating, fine-tune queueing and escalations per step window.
-- usage: rlhf audit rm [WINDOW=100] [THRESHOLD=0.6]
-- param: window BIGINT = 100 : steps per row
-- param: threshold DOUBLE = 0.6 : confidence below which a sample is gated (seed 000 §3.4)
-- Reads rm_scores. Seed 000 §3.4: a sample scored with confidence < 0.6 sits out the update and
-- goes to the RM fine-tune queue; seed 001 §4.1: Level-2 escalation (strong RM / human) should
-- stay under 7% of rollouts.
SELECT run_id,
       step // $window * $window AS step_from,
       rm_name,
       rm_version,
       count(*) AS scored,
       round(avg(score), 4) AS score_mean,
       round(avg(confidence), 4) AS confidence_mean,
       round(min(confidence), 4) AS confidence_min,
       round(avg(CASE WHEN confidence < $threshold THEN 1 ELSE 0 END), 4) AS low_confidence_share,
       count(*) FILTER (WHERE queued) AS queued,
       count(*) FILTER (WHERE escalated) AS escalated,
       round(avg(CASE WHEN escalated THEN 1 ELSE 0 END), 4) AS escalated_share
FROM rm_scores
GROUP BY ALL
ORDER BY run_id, step_from, rm_name, rm_version
