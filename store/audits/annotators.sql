-- Label drift by annotator over time: mean score per period, against the annotator's first period
-- and against all annotators in the same period.
-- usage: rlhf audit annotators [PERIOD=day]
-- param: period VARCHAR = day : date_trunc unit (hour, day, week, month)
-- Reads preferences and human_labels (PPO's human queue, issue 15). Seed 001 §3.1 ("annotation pollution"): an annotator's mean score drifted
-- from 3.8 over the first 50 labels to 4.2 over the last 50 of 300. `drift` is the period's mean
-- minus the annotator's first period's mean; `vs_all` is the period's mean minus the mean of all
-- annotators' labels in that period (drift that everyone shares is more likely the data);
-- `labels_so_far` counts the annotator's labels up to the end of the period (fatigue).
WITH labels AS (
    SELECT annotator_id,
           date_trunc($period, labeled_at AT TIME ZONE 'UTC') AS period_start,
           score
    FROM preferences
    UNION ALL
    -- the human queue's labels of PPO's Level-2 samples (issue 15), the same annotator pool
    SELECT annotator_id,
           date_trunc($period, labeled_at AT TIME ZONE 'UTC') AS period_start,
           score
    FROM human_labels
), per_period AS (
    SELECT annotator_id, period_start, count(*) AS labels, avg(score) AS mean_score
    FROM labels
    GROUP BY annotator_id, period_start
), everyone AS (
    SELECT period_start, avg(score) AS mean_all
    FROM labels
    GROUP BY period_start
)
SELECT annotator_id,
       period_start,
       labels,
       sum(labels) OVER (PARTITION BY annotator_id ORDER BY period_start) AS labels_so_far,
       round(mean_score, 4) AS mean_score,
       round(mean_score - first_value(mean_score) OVER (PARTITION BY annotator_id
                                                        ORDER BY period_start), 4) AS drift,
       round(mean_score - mean_all, 4) AS vs_all
FROM per_period
JOIN everyone USING (period_start)
ORDER BY annotator_id, period_start
