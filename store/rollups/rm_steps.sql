-- Reward-model scores per (run, step, RM name, RM version): counts, sums, the lowest confidence.
-- reads: rm_scores
-- What `rlhf audit rm` and `rlhf audit lineage` read instead of every score row. The share of
-- scores below the audit's confidence threshold, a parameter, is counted from rm_scores itself.
SELECT run_id,
       step,
       rm_name,
       rm_version,
       count(*) AS scored,
       sum(score::DOUBLE) AS score_sum,
       sum(confidence::DOUBLE) AS confidence_sum,
       min(confidence) AS confidence_min,
       count(*) FILTER (WHERE queued) AS queued,
       count(*) FILTER (WHERE escalated) AS escalated
FROM rm_scores
GROUP BY ALL
