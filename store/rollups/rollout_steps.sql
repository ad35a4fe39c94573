-- Rollouts per (run, step, difficulty bucket, source type, flag code): counts, reward sums, tokens.
-- reads: rollouts, pool, difficulty
-- What `rlhf audit rewards / economy / lineage / rm / sources` read instead of every rollout row
-- (store/rollup.py): about 20 rows a step, where a step holds a thousand rollouts. `bucket` is the
-- prompt's difficulty bucket as a number (0 low, 1 mid, 2 high, 3 no difficulty row or not in the
-- pool; seed 000 §4.2), `source_type` its pool row's (NULL: not in the pool). `code` holds the
-- row's flags as bits: 1 pruned, 2 resampled, and on a Level-2 row (tier 2) 4 l2_confidence,
-- 8 l2_low_score, 16 l2_high_risk, 32 l2_uncertain_cluster. Rollouts join their prompt by
-- prompt_key (store/hashing.py), after a check that no two prompts of the pool or the difficulty
-- table share a key.
WITH dims AS (
    SELECT pool.prompt_key, pool.source_type,
           CASE difficulty.bucket WHEN 'low' THEN 0 WHEN 'mid' THEN 1 WHEN 'high' THEN 2
                ELSE 3 END::UTINYINT AS bucket
    FROM pool
    LEFT JOIN difficulty USING (prompt_key)
    WHERE (SELECT count(*)
           FROM (SELECT prompt_key
                 FROM (SELECT prompt_key, prompt_id FROM pool
                       UNION SELECT prompt_key, prompt_id FROM difficulty)
                 GROUP BY prompt_key HAVING count(*) > 1)) = 0
       OR error('two prompts of the pool or the difficulty table share one prompt_key (a 64-bit '
                || 'hash collision, see store/hashing.py): the audits would merge them')
)
SELECT r.run_id,
       r.step,
       coalesce(d.bucket, 3)::UTINYINT AS bucket,
       d.source_type,
       r.code,
       count(*) AS n,
       count(r.reward) AS n_scored,
       sum(r.reward::DOUBLE) AS reward_sum,
       sum(r.reward::DOUBLE * r.reward::DOUBLE) AS reward_sumsq,
       sum(r.generated_tokens) AS generated_tokens,
       count(*) FILTER (WHERE r.tier = 0) AS tier0,
       count(*) FILTER (WHERE r.tier = 1) AS tier1,
       count(*) FILTER (WHERE r.tier = 2) AS tier2,
       count(*) FILTER (WHERE r.scorer = 'light_rm') AS light_rm,
       count(*) FILTER (WHERE r.scorer = 'strong_rm') AS strong_rm,
       count(*) FILTER (WHERE r.scorer = 'reused') AS reused
FROM (SELECT run_id, step, prompt_key, generated_tokens, reward, tier, scorer,
             CASE WHEN len(flags) = 0 THEN 0
                  ELSE list_contains(flags, 'pruned')::UTINYINT
                       + 2 * list_contains(flags, 'resampled')::UTINYINT
                       + 4 * (tier = 2 AND list_contains(flags, 'l2_confidence'))::UTINYINT
                       + 8 * (tier = 2 AND list_contains(flags, 'l2_low_score'))::UTINYINT
                       + 16 * (tier = 2 AND list_contains(flags, 'l2_high_risk'))::UTINYINT
                       + 32 * (tier = 2 AND list_contains(flags, 'l2_uncertain_cluster'))::UTINYINT
             END::UTINYINT AS code
      FROM rollouts) AS r
LEFT JOIN dims AS d USING (prompt_key)
GROUP BY ALL
