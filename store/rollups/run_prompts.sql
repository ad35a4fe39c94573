-- Each prompt a run rolled out, with the first step it did: the distinct prompts of the audits.
-- reads: rollouts
-- `rlhf audit lineage` counts a segment's prompts as those whose first step in the run is within
-- the segment, `rlhf audit sources` the distinct prompt_keys over all runs.
SELECT run_id, prompt_key, min(step) AS first_step
FROM rollouts
GROUP BY ALL
