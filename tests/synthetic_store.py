"""A tiny store with hand-countable contents, for the query and audit tests.

Prompts p1..p6 (+ p7, rolled out but not in the pool). Two PPO runs: run "a" (steps 1-4,
checkpoints a-2 and a-4) and run "b", forked from a-2 (steps 3-4, checkpoint b-4). Every figure
the audit tests expect can be re-derived by hand from the rows below.

    python tests/synthetic_store.py /tmp/demo-store
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from rlhf.store.hashing import content_hash, response_key
from rlhf.store.io import write_shard
from rlhf.store.rollouts import RolloutWriter, StepShardWriter

UTC = dt.timezone.utc
T0 = dt.datetime(2026, 1, 1, 9, 0, tzinfo=UTC)


def _prompt(pid: str, source_type: str, line: int) -> dict:
    return {"prompt_id": pid, "text": f"prompt {pid}", "source_type": source_type,
            "source_file": f"sources/{source_type}.jsonl", "source_line": line,
            "provenance": "{}", "created_at": T0, "n_tokens": 3}


PROMPTS = [_prompt("p1", "human", 1), _prompt("p2", "human", 2), _prompt("p3", "human", 3),
           _prompt("p4", "user_query", 1), _prompt("p5", "user_query", 2),
           _prompt("p6", "open_dataset", 1)]

REJECTED = [
    {"source_file": "sources/human.jsonl", "source_line": 4, "source_type": "human",
     "reasons": ["url"], "prompt_id": "x1", "raw": "see http://x"},
    {"source_file": "sources/human.jsonl", "source_line": 5, "source_type": "human",
     "reasons": ["email", "phone"], "prompt_id": "x2", "raw": "a@b.c 555-0100"},
    {"source_file": "sources/open_dataset.jsonl", "source_line": 2, "source_type": "open_dataset",
     "reasons": ["low_preference"], "prompt_id": "x3", "raw": "meh"},
    {"source_file": "sources/user_queries.jsonl", "source_line": 3, "source_type": None,
     "reasons": ["bad_json"], "prompt_id": None, "raw": "{oops"},
]


def _pool(pid: str, source_type: str, topic: int) -> dict:
    return {"prompt_id": pid, "text": f"prompt {pid}", "source_type": source_type,
            "source_file": f"{source_type}.jsonl", "source_line": int(pid[1:]),
            "dedup_cluster": int(pid[1:]), "cluster_size": 1, "topic_cluster": topic,
            "n_tokens": 3, "split": "ppo"}


POOL = [_pool("p1", "human", 0), _pool("p2", "human", 1), _pool("p4", "user_query", 0),
        _pool("p6", "open_dataset", 1)]

def _difficulty(pid: str, score: float, bucket: str, length: int, std: float, rm: float) -> dict:
    return {"prompt_id": pid, "text": f"prompt {pid}", "split": "ppo", "topic_cluster": 0,
            "length": length, "logprob_std": std, "rm_score": rm, "score": score, "bucket": bucket}


DIFFICULTY = [  # p6 has no difficulty row: it shows as '(unscored)'
    _difficulty("p1", 2.0, "low", 10, 0.5, 3.0),
    _difficulty("p2", 8.0, "high", 40, 1.5, 1.0),
    _difficulty("p4", 5.0, "mid", 20, 1.0, 2.0),
]

# (run, step, prompt, reward, tier, scorer)
ROLLOUTS = [
    ("a", 1, "p1", 1.0, 1, "light_rm"), ("a", 1, "p4", 2.0, 1, "light_rm"),
    ("a", 2, "p2", 3.0, 2, "strong_rm"), ("a", 2, "p6", None, 0, "reused"),
    ("a", 3, "p1", 5.0, 1, "light_rm"),
    ("a", 4, "p4", 0.0, 1, "light_rm"),
    ("b", 3, "p1", 2.0, 1, "light_rm"), ("b", 3, "p7", 1.0, 1, "light_rm"),
    ("b", 4, "p2", 4.0, 2, "strong_rm"),
]

CHECKPOINTS = [  # (id, run, step, parent, data_version)
    ("a-2", "a", 2, None, "v1"), ("a-4", "a", 4, "a-2", "v1"), ("b-4", "b", 4, "a-2", "v2"),
]

# (run, step, prompt, rm_name, rm_version, score, confidence, escalated, queued)
RM_SCORES = [
    ("a", 1, "p1", "light_rm", "v1", 1.0, 0.9, False, False),
    ("a", 1, "p4", "light_rm", "v1", 2.0, 0.5, False, True),
    ("a", 2, "p2", "strong_rm", "s1", 3.0, 0.7, True, False),
    ("a", 3, "p1", "light_rm", "v2", 5.0, 0.55, False, True),
    ("b", 3, "p1", "light_rm", "v2", 2.0, 0.8, False, False),
    ("b", 4, "p2", "strong_rm", "s1", 4.0, 0.65, True, False),
]

# (annotator, day offset, score)
PREFERENCES = [("ann1", 0, 3.8), ("ann1", 0, 3.8), ("ann1", 1, 4.2), ("ann1", 1, 4.4),
               ("ann2", 0, 4.0), ("ann2", 1, 4.0)]


def rollout_row(run: str, step: int, prompt: str, reward: float | None, tier: int, scorer: str,
                i: int = 0) -> dict:
    return {"run_id": run, "step": step, "prompt_id": prompt, "prompt_hash": "h" + prompt,
            "response_key": response_key(f"r-{run}-{step}-{prompt}-{i}"), "reward": reward, "scorer": scorer,
            "tier": tier, "prompt_tokens": 3, "response_tokens": 7, "kl": 0.01, "flags": [],
            "checkpoint_id": f"{run}-policy-{step - 1}", "created_at": T0 + dt.timedelta(minutes=step),
            "prompt_text": None, "response_text": None}


def build(root: Path) -> Path:
    """Write the whole tiny store under `root`; returns `root`."""
    write_shard("prompts", PROMPTS, root / "prompts" / "part-00000.parquet")
    write_shard("rejected", REJECTED, root / "rejected" / "part-00000.parquet")
    write_shard("pool", POOL, root / "pool" / "part-00000.parquet")
    write_shard("difficulty", DIFFICULTY, root / "difficulty" / "part-00000.parquet")
    for run in ("a", "b"):
        # steps_per_bucket=2 puts each run's steps into two step_bucket folders.
        with RolloutWriter(root / "rollouts", run, steps_per_bucket=2, row_group_size=2) as w:
            for r in ROLLOUTS:
                if r[0] == run:
                    w.write([rollout_row(*r)])
        with StepShardWriter("rm_scores", root / "rm_scores", run, steps_per_bucket=2) as w:
            w.write([{"run_id": r, "step": s, "prompt_id": p, "response_hash": content_hash(f"r-{r}-{s}-{p}-0"),
                      "rm_name": n, "rm_version": v, "score": sc, "confidence": c,
                      "escalated": e, "queued": q, "scored_at": T0 + dt.timedelta(minutes=s)}
                     for r, s, p, n, v, sc, c, e, q in RM_SCORES if r == run])
    write_shard("checkpoints", [
        {"checkpoint_id": c, "run_id": r, "step": s, "parent_id": parent, "data_version": dv,
         "params_hash": "ph", "path": f"models/{c}", "created_at": T0 + dt.timedelta(minutes=s)}
        for c, r, s, parent, dv in CHECKPOINTS], root / "checkpoints" / "part-00000.parquet")
    write_shard("preferences", [
        {"ranking_id": f"k{i // 3}", "prompt_id": "p1", "prompt": "prompt p1",
         "response_hash": f"resp{i}", "response": f"response {i}", "annotator_id": ann,
         "labeled_at": T0 + dt.timedelta(days=day, minutes=i), "score": score, "rank": i % 3,
         "source": "annotator", "response_source": "policy", "split": "train", "gold_score": None}
        for i, (ann, day, score) in enumerate(PREFERENCES)],
        root / "preferences" / "part-00000.parquet")
    return root


if __name__ == "__main__":
    # python tests/synthetic_store.py /tmp/demo-store   (docs/store.md's query examples use it)
    import sys

    if len(sys.argv) != 2:
        sys.exit("usage: python tests/synthetic_store.py OUT_DIR")
    out = Path(sys.argv[1])
    if out.exists() and any(out.iterdir()):
        sys.exit(f"{out} is not empty; pick a new folder")
    print(build(out))
