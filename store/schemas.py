"""Every artifact table's pyarrow schema, in one place.

A stage that writes a table asks `schema_for(name)`; readers, the DuckDB views and the tests use
the same objects. Add a table here, never inline in a stage.

    python -c "from rlhf.store.schemas import TABLES; [print(n, s) for n, s in TABLES.items()]"
"""

from __future__ import annotations

import pyarrow as pa

# Quarantine reason codes (ARCHITECTURE house style 3: keep, or drop with a reason code).
# The world generator labels its planted defects with the same codes, so tests can check that
# every planted defect is quarantined for the right reason.
REASON_CODES: dict[str, str] = {
    "bad_json": "line is not a JSON object",
    "invalid_utf8": "line (or its text) is not valid UTF-8: undecodable bytes or lone surrogates",
    "bad_type": "a field has the wrong type (text not a string, score not a number, ...)",
    "unknown_source": "source type is not one of the three trusted types (seed 000 §4.2)",
    "missing_provenance": "a provenance field required by the source type is missing or empty",
    "low_preference": "open-dataset row with human preference score <= threshold (seed 000 §4.2)",
    "empty": "prompt is empty or whitespace only",
    "too_long": "prompt has more tokens or characters than the limits (or its line more bytes)",
    "url": "prompt contains a URL",
    "email": "prompt contains an e-mail address",
    "phone": "prompt contains a phone number",
    "code_block": "prompt contains a fenced or indented code block",
    "bad_record": "an hh-rlhf dialogue, OpenAssistant tree or `messages` conversation the adapter "
                  "cannot read (no human turn)",
    "synthetic": "OpenAssistant prompt written by a model, not a human (its `synthetic` flag)",
    "unreadable": "the rest of a source file could not be read (corrupt archive or parquet file)",
    "control_char": "prompt holds a control character (NUL, ESC, DEL, ...; tab and newlines are text)",
    # preference labels (the `preferences` stage's human-label mode, table `rejected_labels`)
    "unknown_prompt": "a preference label for a prompt that is not in the store's prompts table",
    "equal_responses": "a preference pair (or ranking) whose responses are the same text",
}

# Codes the embedded world does not plant: those only adapters of external formats or unreadable
# files produce, and control characters (real-world exports; tests plant them). The world plants
# every other code in its sources.
EXTERNAL_ONLY_CODES: frozenset[str] = frozenset({"bad_record", "synthetic", "unreadable",
                                                 "control_char", "unknown_prompt",
                                                 "equal_responses"})

SOURCE_TYPES: tuple[str, ...] = ("human", "user_query", "open_dataset")

_TS = pa.timestamp("us", tz="UTC")

# `prompt_key` (int64) is derived from `prompt_id` by `store.hashing.prompt_key`, never chosen by
# a writer: `store.io.to_arrow` fills it in (and refuses a wrong one) for every table that has
# both columns. It lives in the tables the audits group or join by prompt over millions of rows
# (`rollouts`, and `pool` / `difficulty` that they join with): an 8-byte key instead of a
# 64-character string made those audits 2-3x faster (docs/README.md; the key's collision
# odds are in hashing.prompt_key).


def _schema(*fields: pa.Field, doc: str) -> pa.Schema:
    return pa.schema(list(fields), metadata={"doc": doc})


TABLES: dict[str, pa.Schema] = {
    # Raw rows as read from a source file, before any filter (ingest keeps them only in memory;
    # the table exists so adapters can materialise external sources with one schema).
    "raw_prompts": _schema(
        pa.field("source_file", pa.string(), nullable=False),
        pa.field("source_line", pa.int64(), nullable=False),  # 1-based line (or row) number
        pa.field("source_type", pa.string()),
        pa.field("text", pa.string()),
        pa.field("provenance", pa.string()),  # JSON object of the source's provenance fields
        doc="Rows read from prompt sources, unfiltered.",
    ),
    # Prompts that passed the ingest filters.
    "prompts": _schema(
        pa.field("prompt_id", pa.string(), nullable=False),  # content_hash(text)
        pa.field("text", pa.string(), nullable=False),
        pa.field("source_type", pa.string(), nullable=False),
        pa.field("source_file", pa.string(), nullable=False),
        pa.field("source_line", pa.int64(), nullable=False),
        pa.field("provenance", pa.string()),  # JSON object: writer_id / session_id / score ...
        pa.field("created_at", _TS),  # writing date, query timestamp, or null
        pa.field("n_tokens", pa.int32(), nullable=False),
        doc="Prompts kept by ingest (source trust + content filters).",
    ),
    # Rows ingest rejected, with every reason that applied.
    "rejected": _schema(
        pa.field("source_file", pa.string(), nullable=False),
        pa.field("source_line", pa.int64(), nullable=False),
        pa.field("source_type", pa.string()),
        pa.field("reasons", pa.list_(pa.string()), nullable=False),  # codes of REASON_CODES
        pa.field("prompt_id", pa.string()),  # null when the text could not be decoded
        pa.field("raw", pa.string()),  # the offending line, truncated to 2,000 characters
        doc="Quarantine: rows rejected by ingest, each with its reason codes.",
    ),
    # Preference labels the `preferences` stage rejected (human-label mode: ingest's
    # external_pairs and the annotation queue), the same columns as `rejected`; source_type holds
    # the label source (hh-rlhf / oasst / queue).
    "rejected_labels": _schema(
        pa.field("source_file", pa.string(), nullable=False),
        pa.field("source_line", pa.int64(), nullable=False),
        pa.field("source_type", pa.string()),
        pa.field("reasons", pa.list_(pa.string()), nullable=False),  # codes of REASON_CODES
        pa.field("prompt_id", pa.string()),
        pa.field("raw", pa.string()),
        doc="Quarantine of preference labels, each with its reason codes.",
    ),
    # Preference pairs that public datasets ship with their prompts (hh-rlhf chosen/rejected,
    # OpenAssistant ranked sibling replies), kept by ingest for the reward stage. `context` is the
    # dialogue before the two responses ("\n\nHuman: ...\n\nAssistant: ..." ending with a human
    # turn); when n_turns == 1 the context is the prompt alone and both responses answer it.
    "external_pairs": _schema(
        pa.field("prompt_id", pa.string(), nullable=False),  # content_hash of the first human turn
        pa.field("source", pa.string(), nullable=False),  # "hh-rlhf" or "oasst"
        pa.field("source_file", pa.string(), nullable=False),
        pa.field("source_line", pa.int64(), nullable=False),
        pa.field("context", pa.string(), nullable=False),
        pa.field("n_turns", pa.int32(), nullable=False),  # human turns in context
        pa.field("chosen", pa.string(), nullable=False),  # the human-preferred response
        pa.field("rejected", pa.string(), nullable=False),
        pa.field("chosen_rank", pa.int32()),  # OpenAssistant rank (0 = best); null for hh-rlhf
        pa.field("rejected_rank", pa.int32()),
        doc="Human preference pairs shipped with public prompt datasets (kept prompts only).",
    ),
    # Sentence embeddings cached by dedup, keyed by (content_hash, model_id), so a rerun embeds
    # only new prompts. Lives under the cache folder given on the command line, not the store.
    "embeddings": _schema(
        pa.field("content_hash", pa.string(), nullable=False),
        pa.field("model_id", pa.string(), nullable=False),
        pa.field("embedding", pa.list_(pa.float32()), nullable=False),  # L2-normalised
        doc="Embedding cache of the dedup stage.",
    ),
    # The deduplicated prompt pool: one representative per semantic cluster.
    "pool": _schema(
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("prompt_key", pa.int64(), nullable=False),  # hashing.prompt_key(prompt_id)
        pa.field("text", pa.string(), nullable=False),
        pa.field("source_type", pa.string(), nullable=False),
        pa.field("source_file", pa.string(), nullable=False),  # as in `prompts`
        pa.field("source_line", pa.int64(), nullable=False),
        pa.field("dedup_cluster", pa.int64(), nullable=False),  # agglomerative cluster id
        pa.field("cluster_size", pa.int32(), nullable=False),
        pa.field("topic_cluster", pa.int32(), nullable=False),  # KMeans diversity cluster
        pa.field("n_tokens", pa.int32(), nullable=False),
        pa.field("split", pa.string(), nullable=False),  # reward / ppo / eval, by prompt-id hash
        doc="The filtered and deduplicated prompt pool (seed 000 §4.2, §3.1 level one).",
    ),
    # Near-duplicates that dedup set aside, each linked to its cluster's representative. An exact
    # copy of the representative's text has the same prompt_id (distance 0). Quote it in SQL:
    # SIMILAR is a DuckDB keyword (SELECT * FROM "similar").
    "similar": _schema(
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("source_file", pa.string(), nullable=False),  # as in `prompts`
        pa.field("source_line", pa.int64(), nullable=False),
        pa.field("representative_id", pa.string(), nullable=False),
        pa.field("dedup_cluster", pa.int64(), nullable=False),
        pa.field("distance", pa.float32(), nullable=False),  # cosine distance to representative
        doc="The similar library: near-duplicates of pool prompts (seed 000 §4.2).",
    ),
    # One row per rollout (seed 001 §3.2: prompt hash, response hash, final reward; §5.2: minimal
    # logs, full text only in debug rollout mode). Partitioned by run, sorted by step.
    "rollouts": _schema(
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("step", pa.int64(), nullable=False),
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("prompt_key", pa.int64(), nullable=False),  # hashing.prompt_key(prompt_id)
        pa.field("prompt_hash", pa.string(), nullable=False),
        # hashing.response_key(response): 64 bits of its content_hash, not the 64-character hash
        # (which alone cost ~34 bytes a row; rm_scores and human_labels keep the full hash)
        pa.field("response_key", pa.int64(), nullable=False),
        pa.field("reward", pa.float32()),  # final scalar reward fed to PPO (null: skipped)
        # light_rm / strong_rm / reused / fallback / unscored (a reward function declined it)
        pa.field("scorer", pa.string(), nullable=False),
        pa.field("tier", pa.int8(), nullable=False),  # 0 probe, 1 policy + light RM, 2 escalated
        pa.field("prompt_tokens", pa.int32(), nullable=False),
        pa.field("response_tokens", pa.int32(), nullable=False),
        # tokens the policy generated for this row (pruned, regenerated and timed-out ones too);
        # null in rows written before the step accounting existed
        pa.field("generated_tokens", pa.int32()),
        # of this row's generation, tokens a drafter proposed (ppo.draft) and of those the ones
        # the verification rule accepted (reuse: kept from the old response); 0 without a
        # drafter and in a replayed row (counted in the row of the step that generated it);
        # null in rows written before the per-row counts existed. int32 like the token counts
        # (parquet stores int16 as INT32 too: a narrower type saves no byte on disk)
        pa.field("drafted", pa.int32()),
        pa.field("accepted", pa.int32()),
        pa.field("kl", pa.float32()),  # sum over response tokens of the per-token KL to reference
        pa.field("flags", pa.list_(pa.string()), nullable=False),  # timeout, pruned, resampled, ...
        pa.field("checkpoint_id", pa.string(), nullable=False),  # policy version that generated it
        pa.field("created_at", _TS, nullable=False),
        pa.field("prompt_text", pa.string()),  # debug rollout mode only
        pa.field("response_text", pa.string()),  # debug rollout mode only
        # version of the RM whose score is `reward` (light RM, evolved light RM `<hash>+e<k>-..`,
        # or the strong RM for tier 2; a reward function's `python:...@<hash>`, a reward server's
        # URL); null for a fallback and in rows written before the tiers existed
        pa.field("rm_version", pa.string()),
        doc="Rollout provenance: one row per generated response.",
    ),
    # Rankings of k >= 3 policy responses per prompt (seed 000 §3.4) by the annotator pool, and
    # external human rankings (hh-rlhf chosen/rejected, OpenAssistant ranked replies). One row per
    # ranked response; `rlhf.pipeline.preferences.expand_pairs` turns a ranking into its pairs.
    "preferences": _schema(
        pa.field("ranking_id", pa.string(), nullable=False),  # one annotator's ranking of a set
        pa.field("prompt_id", pa.string(), nullable=False),  # content_hash(prompt)
        pa.field("prompt", pa.string(), nullable=False),
        pa.field("response_hash", pa.string(), nullable=False),  # content_hash(response)
        pa.field("response", pa.string(), nullable=False),
        pa.field("annotator_id", pa.string(), nullable=False),  # "hh-rlhf" / "oasst" if external
        pa.field("labeled_at", _TS),  # null for external rankings (no timestamp in the source)
        pa.field("score", pa.float32()),  # the annotator's 0-5 score; null if only ranked
        pa.field("rank", pa.int32(), nullable=False),  # 0 = best within the ranking
        pa.field("source", pa.string(), nullable=False),  # annotator / hh-rlhf / oasst
        pa.field("response_source", pa.string(), nullable=False),  # policy / demonstration / human
        pa.field("split", pa.string(), nullable=False),  # train / heldout / gold, by prompt hash
        pa.field("gold_score", pa.float32()),  # the world's gold judge (analysis only) or null
        doc="Preference rankings with annotator id and time (seed 000 §3.4, seed 001 §3.1).",
    ),
    # Seed 000 §4.2 layer three: one row per pool prompt.
    "difficulty": _schema(
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("prompt_key", pa.int64(), nullable=False),  # hashing.prompt_key(prompt_id)
        pa.field("text", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),  # the pool's split
        pa.field("topic_cluster", pa.int32(), nullable=False),
        pa.field("length", pa.int32(), nullable=False),  # baseline response tokens
        pa.field("logprob_std", pa.float32(), nullable=False),  # std of its token log-probs
        pa.field("rm_score", pa.float32(), nullable=False),  # strong RM reward of the response
        pa.field("score", pa.float32(), nullable=False),  # composite difficulty 0-10
        pa.field("bucket", pa.string(), nullable=False),  # low 0-3 / mid 4-6 / high 7-10
        doc="Difficulty score and bucket per pool prompt (seed 000 §4.2).",
    ),
    # The Level-0 router's decision per pool prompt (`rlhf route`, seed 001 §4.1),
    # with the labels it was trained / measured on where known, so SQL can audit it.
    "routes": _schema(
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("prompt_key", pa.int64(), nullable=False),  # hashing.prompt_key(prompt_id)
        pa.field("pool_split", pa.string(), nullable=False),  # the pool's reward / ppo / eval
        pa.field("split", pa.string(), nullable=False),  # the router's train / held_out
        pa.field("complexity", pa.string(), nullable=False),  # predicted low / mid / high
        pa.field("high_risk", pa.bool_(), nullable=False),  # predicted (False: no labels known)
        pa.field("max_new_tokens", pa.int32(), nullable=False),  # router.max_new_tokens[complexity]
        pa.field("label_complexity", pa.string()),  # the difficulty table's bucket
        pa.field("label_score", pa.float32()),  # its difficulty score 0-10
        pa.field("label_topic", pa.string()),  # the world's topic (null: no world / no topic)
        pa.field("label_high_risk", pa.bool_()),  # its high_risk flag (null: no world)
        doc="Level-0 router decisions per pool prompt: complexity, high risk, token budget.",
    ),
    # Tables the query layer and its audits read, written by PPO (`rlhf ppo --rm-scores`).
    # Every reward-model score PPO uses: the light RM's for each scored rollout, and the strong
    # RM's too for a rollout escalated to Level 2 (seed 001 §4.1); a confidence below the RM's
    # gate queues the sample for RM fine-tuning (seed 000 §3.4, 0.6).
    "rm_scores": _schema(
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("step", pa.int64(), nullable=False),
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("response_hash", pa.string(), nullable=False),
        pa.field("rm_name", pa.string(), nullable=False),  # strong_rm / light_rm / ensemble member
        # hashing.tree_hash of the RM folder (a reward function's or server's spec: code_rewards.py)
        pa.field("rm_version", pa.string(), nullable=False),
        pa.field("score", pa.float32(), nullable=False),
        pa.field("confidence", pa.float32(), nullable=False),  # 1 - H2(calibrated BT probability)
        pa.field("escalated", pa.bool_(), nullable=False),  # the rollout went to Level 2 (both rows)
        pa.field("queued", pa.bool_(), nullable=False),  # confidence < the RM's gate: fine-tune queue
        pa.field("scored_at", _TS, nullable=False),
        doc="Reward-model scores with confidence, escalations and fine-tune queueing.",
    ),
    # The human queue (seed 001 §4.1): Level-2 samples PPO sent to the annotator pool
    # (the world's stand-in for human annotation), within ppo.human_labels_per_step a step.
    "human_labels": _schema(
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("step", pa.int64(), nullable=False),
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("prompt_hash", pa.string(), nullable=False),
        pa.field("response_hash", pa.string(), nullable=False),
        pa.field("annotator_id", pa.string(), nullable=False),
        pa.field("labeled_at", _TS, nullable=False),  # the run's simulated labelling clock
        pa.field("score", pa.float32(), nullable=False),  # the annotator's 0-5 score
        pa.field("light_score", pa.float32()),  # the light RM's, for comparison (null: an RM check)
        # why it was labelled: its Level-2 triggers, or ["rm_check"] (RM evolution's check,
        # ppo.rm_label_source annotators)
        pa.field("triggers", pa.list_(pa.string()), nullable=False),
        doc="Human-queue labels of Level-2 samples, with annotator and time.",
    ),
    # One row per saved policy checkpoint: what `rlhf audit lineage CHECKPOINT` starts from.
    "checkpoints": _schema(
        pa.field("checkpoint_id", pa.string(), nullable=False),
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("step", pa.int64(), nullable=False),  # last PPO step folded into the weights
        pa.field("parent_id", pa.string()),  # checkpoint it started or resumed from (null: SFT)
        pa.field("data_version", pa.string(), nullable=False),  # version (hash) of the prompt pool
        pa.field("params_hash", pa.string()),  # hash of the ppo params section
        pa.field("path", pa.string()),  # save_pretrained folder, relative to the artifacts root
        pa.field("created_at", _TS, nullable=False),
        doc="Policy checkpoints and their parents (the lineage audit walks them).",
    ),
    # Training metrics, one row per CSV line (seed 000 §4.4: the six metrics, every `csv_every` =
    # 10 steps), written by `rlhf ppo --train-metrics`; null where a step had no update.
    "train_metrics": _schema(
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("step", pa.int64(), nullable=False),
        pa.field("rollout_success", pa.float32()),
        pa.field("rew_mean", pa.float32()),
        pa.field("rew_std", pa.float32()),
        pa.field("kl_div", pa.float32()),
        pa.field("clip_ratio", pa.float32()),
        pa.field("critic_loss", pa.float32()),
        pa.field("entropy", pa.float32()),
        # the run's cost so far (pipeline/ppo/accounting.py): every generated token counts
        pa.field("tokens_generated_cum", pa.int64()),
        pa.field("tokens_trained_cum", pa.int64()),
        pa.field("rollouts_started_cum", pa.int64()),
        pa.field("rollouts_trained_cum", pa.int64()),
        pa.field("light_rm_calls_cum", pa.int64()),
        pa.field("strong_rm_calls_cum", pa.int64()),
        pa.field("seconds_cum", pa.float32()),
        pa.field("logged_at", _TS, nullable=False),
        doc="PPO training metrics per logged step (seed 000 §4.4) and the run's cost so far.",
    ),
    # The pool prompts' sentence embeddings (dedup stage, the same vectors it clusters), what the
    # PPO rollout scheduler (seed 001 §4.3) finds a prompt's neighbours with.
    "pool_embeddings": _schema(
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("prompt_key", pa.int64(), nullable=False),
        pa.field("model_id", pa.string(), nullable=False),  # encoder name==version
        pa.field("embedding", pa.list_(pa.float32()), nullable=False),  # L2-normalised
        doc="MiniLM embeddings of the pool prompts (the rollout scheduler's prompt space).",
    ),
    # One row per decision of the PPO rollout scheduler (`rlhf ppo --schedule`, seed
    # 001 §4.3): every candidate prompt a step's batch drew, rolled out or skipped, and why.
    "schedule": _schema(
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("step", pa.int64(), nullable=False),
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("prompt_key", pa.int64(), nullable=False),
        pa.field("topic_cluster", pa.int64()),  # the pool's topic cluster (null: unknown)
        # rollout | skip | unused (kept, but the batch was already full or another gate skipped it)
        pa.field("decision", pa.string(), nullable=False),
        # cold_start | few_history | varied | low_variance | explore | high_uncertainty
        pa.field("reason", pa.string(), nullable=False),
        pa.field("own_rollouts", pa.int64(), nullable=False),  # its rewards in the window
        pa.field("steps_since_rollout", pa.int64()),  # null: never rolled out
        pa.field("n_neighbours", pa.int64(), nullable=False),
        pa.field("n_low", pa.int64(), nullable=False),  # neighbours with variance < low
        pa.field("neighbour_mean", pa.float32()),  # mean reward (RM units): a skip's estimate
        pa.field("neighbour_var", pa.float32()),  # their mean variance (on the threshold scale)
        pa.field("reward_var", pa.float32()),  # the run's reward variance (the scale's unit)
        pa.field("explore_p", pa.float32()),  # retry probability of a rule skip (null: no skip)
        pa.field("high_uncertainty", pa.bool_(), nullable=False),  # marks its topic cluster
        pa.field("neighbour_ids", pa.list_(pa.string())),  # the neighbours, nearest first
        doc="Rollout scheduler decisions per candidate prompt (skip / roll out, neighbours).",
    ),
}


def schema_for(table: str) -> pa.Schema:
    """The schema of `table`, or a KeyError that lists the known tables."""
    try:
        return TABLES[table]
    except KeyError:
        raise KeyError(f"unknown table {table!r}; known tables: {', '.join(sorted(TABLES))}") from None
