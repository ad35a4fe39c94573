"""Held-out evaluation prompts: every member of the eval-split dedup clusters, none seen in training.

The pool keeps one representative per dedup cluster (~274 distinct questions in the embedded
default), and its `split` (reward / ppo / eval) is drawn per cluster, so the eval split alone has
only ~40 prompts. Its clusters' other members (the `similar` library: paraphrases and
rewordings of the same question, linked by `representative_id`) were never given to the reward
models or to PPO either, so evaluating on the representative plus every member gives >= 200
held-out prompts. A member whose text also occurs in a training cluster (cannot happen with
cluster-level splits, but is cheap to rule out) is left out.

    python -c "from rlhf.pipeline.heldout_prompts import held_out_prompts; \
print(len(held_out_prompts('artifacts/store')))"
"""

from __future__ import annotations

from pathlib import Path

EVAL_SPLIT = "eval"


def held_out_prompts(store_root: str | Path, split: str = EVAL_SPLIT) -> list[tuple[str, str]]:
    """(prompt_id, text) of every member of the `split` clusters of the store's pool: the pool
    representatives of that split and their `similar` rows, one per prompt id, sorted by id."""
    from rlhf.store.io import read_table

    root = Path(store_root)
    if not (root / "pool").is_dir():
        raise FileNotFoundError(f"no pool table in {root}")
    pool = read_table("pool", root / "pool").select(["prompt_id", "text", "split"]).to_pylist()
    similar = (read_table("similar", root / "similar")
               .select(["prompt_id", "text", "representative_id"]).to_pylist())
    split_of = {r["prompt_id"]: r["split"] for r in pool}
    held: dict[str, str] = {}
    seen_in_training: set[str] = set()
    for r in pool:
        (held.__setitem__(r["prompt_id"], r["text"]) if r["split"] == split
         else seen_in_training.add(r["text"]))
    for r in similar:
        if split_of.get(r["representative_id"]) == split:
            held.setdefault(r["prompt_id"], r["text"])
        else:
            seen_in_training.add(r["text"])
    return sorted((pid, text) for pid, text in held.items() if text not in seen_in_training)
