"""Demonstrations from human data (the realdata profile's stand-in for the world's demonstrations).

    rlhf demos --store artifacts/store --out artifacts/demos

The SFT stage imitates demonstrations; without the world they come from the human labels ingest
kept: per prompt, the preferred response of a single-turn pair (hh-rlhf's `chosen`,
OpenAssistant's best-ranked reply), for prompts whose dedup cluster is not in an excluded split
(the eval split by default: the policy never imitates answers to the prompts it is judged on).
Writes `demonstrations.jsonl` ({"prompt", "response", "source", "prompt_id"}) and, for a base
model trained from scratch (`sft.base_model: ""`), a byte-level BPE `tokenizer/` trained on the
store's prompts and these responses and a tiny Llama `model_config/` (pipeline/world/tokenizer.py,
the same code the embedded default uses). With `sft.base_model` set, the sft stage ignores both.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlhf.pipeline import ranges
from rlhf.pipeline.world import ModelShape


@dataclass(frozen=True)
class DemosConfig:
    """params.yaml `demos:`."""

    exclude_splits: list[str] = field(default_factory=lambda: ["eval"])
    max_demos: int = 0  # 0 = one per eligible prompt
    tokenizer_vocab: int = 2000  # the from-scratch tokenizer (sft.base_model: "")
    model: ModelShape = field(default_factory=lambda: ModelShape(
        hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=256))

    def __post_init__(self) -> None:
        ranges.check_fields("demos", self)


def demonstrations(store_root: str | Path, cfg: DemosConfig) -> list[dict[str, Any]]:
    """One demonstration per eligible prompt, sorted by prompt id."""
    from rlhf.pipeline.preferences import _pool_splits
    from rlhf.store.io import read_table

    root = Path(store_root)
    if not (root / "external_pairs").is_dir() or not (root / "prompts").is_dir():
        raise ValueError(f"{root} has no prompts / external_pairs tables (run ingest first)")
    prompts = {r["prompt_id"]: r["text"]
               for r in read_table("prompts", root / "prompts").select(["prompt_id", "text"])
               .to_pylist()}
    split = _pool_splits(root)
    best: dict[str, tuple[int, str, str]] = {}
    for p in read_table("external_pairs", root / "external_pairs").to_pylist():
        pid = p["prompt_id"]
        if p["n_turns"] != 1 or pid not in prompts or split.get(pid) in cfg.exclude_splits:
            continue
        rank = p["chosen_rank"] if p["chosen_rank"] is not None else 0
        resp = p["chosen"].strip()
        if resp and (pid not in best or (rank, resp) < best[pid][:2]):
            best[pid] = (rank, resp, p["source"])
    rows = [{"prompt": prompts[pid], "response": resp, "source": src, "prompt_id": pid}
            for pid, (_, resp, src) in sorted(best.items())]
    return rows[: cfg.max_demos] if cfg.max_demos else rows


def run(cfg: DemosConfig, store_root: str | Path, out: str | Path,
        metrics_path: str | Path | None = None) -> dict[str, Any]:
    from rlhf.pipeline.world import tokenizer as tiny
    from rlhf.store.io import read_table, staged_folders, write_text_atomic

    rows = demonstrations(store_root, cfg)
    if not rows:
        raise ValueError(f"no single-turn human pairs in {store_root} to take demonstrations from")
    corpus = [r["text"] for r in read_table("prompts", Path(store_root) / "prompts")
              .select(["text"]).to_pylist()] + [r["response"] for r in rows]
    out = Path(out)
    with staged_folders([out]) as staged:
        d = staged[out]
        d.mkdir(parents=True, exist_ok=True)
        with open(d / "demonstrations.jsonl", "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows)
        vocab = tiny.train_tokenizer(corpus, cfg.tokenizer_vocab, d / "tokenizer")
        model = tiny.write_model_config(d / "model_config", d / "tokenizer", **asdict(cfg.model))
    by_source: dict[str, int] = {}
    for r in rows:
        by_source[r["source"]] = by_source.get(r["source"], 0) + 1
    metrics = {"n_demonstrations": len(rows), "by_source": by_source, "tokenizer_vocab": vocab,
               "model": model}
    if metrics_path:
        write_text_atomic(metrics_path, json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    return metrics
