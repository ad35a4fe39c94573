"""The prompts the stage ranks responses for: the pool's reward split, or the demonstration
prompts when there is no pool."""

from __future__ import annotations

from pathlib import Path

from rlhf.pipeline.models.text import clean
from rlhf.store.hashing import content_hash, hashed_split


def reward_prompts_from_pool(pool_dir: str | Path) -> list[tuple[str, str]]:
    """(prompt_id, text) of the pool's reward split, sorted by prompt id."""
    from rlhf.store.io import read_table

    table = read_table("pool", pool_dir)
    if table.num_rows == 0:
        raise ValueError(f"the pool in {pool_dir} is empty")
    rows = [r for r in table.select(["prompt_id", "text", "split"]).to_pylist()
            if r["split"] == "reward"]
    return sorted((r["prompt_id"], r["text"]) for r in rows)


# Without a pool, the demonstration prompts stand in for it, split by prompt hash like the
# pool's reward / ppo / eval splits (shares of the pool's defaults).
FALLBACK_SPLITS: tuple[tuple[str, float], ...] = (("reward", 0.5), ("ppo", 0.3), ("eval", 0.2))


def fallback_split(prompt_id: str) -> str:
    return hashed_split("split:" + prompt_id, FALLBACK_SPLITS)


def prompts_from_demonstrations(demos_path: str | Path, split: str | None = None
                                ) -> list[tuple[str, str]]:
    """(prompt_id, text) of the distinct demonstration prompts (the fallback without a pool),
    only those of `split` (reward / ppo / eval, by `fallback_split`) when given."""
    from rlhf.pipeline.sft import read_demonstrations

    texts = {clean(r["prompt"]) for r in read_demonstrations(demos_path)}
    rows = [(content_hash(t), t) for t in texts]
    return sorted(r for r in rows if split is None or fallback_split(r[0]) == split)
