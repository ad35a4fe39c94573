"""The human-label mode (`labels: human`, the realdata profile): the human pairs ingest kept
(`external_pairs`) and annotation-queue files, each checked against the store's prompts; what
fails goes to the `rejected_labels` quarantine with reason codes."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rlhf.pipeline.preferences.config import PreferencesConfig
from rlhf.pipeline.preferences.pairs import expand_pairs
from rlhf.pipeline.models.text import clean
from rlhf.store.hashing import content_hash, hash_fraction

QUEUE_PROVENANCE = ("annotator_id", "labeled_at")  # who labelled, when (seed 001 §3.1: drift)


def label_split(prompt_id: str, cfg: PreferencesConfig, pool_split: dict[str, str]) -> str:
    """gold (only the held-out gold RM trains on it) / heldout / train, by prompt hash; labels of
    an eval-split prompt are never trained on (they calibrate and test the RMs)."""
    x = hash_fraction("gold:" + prompt_id)
    if x < cfg.gold_fraction:
        return "gold"
    if pool_split.get(prompt_id) == "eval" or x < cfg.gold_fraction + cfg.heldout_fraction:
        return "heldout"
    return "train"


def _pool_splits(root: Path) -> dict[str, str]:
    """prompt_id -> its dedup cluster's split (pool representatives and their `similar` rows)."""
    from rlhf.store.io import read_table

    if not (root / "pool").is_dir():
        return {}
    out = {r["prompt_id"]: r["split"]
           for r in read_table("pool", root / "pool").select(["prompt_id", "split"]).to_pylist()}
    if (root / "similar").is_dir():
        for r in read_table("similar", root / "similar").select(
                ["prompt_id", "representative_id"]).to_pylist():
            out.setdefault(r["prompt_id"], out.get(r["representative_id"], ""))
    return out


def read_queue(path: str | Path, name: str) -> Iterable[tuple[int, str, dict | None, list[str]]]:
    """An annotation-queue JSONL file (what a labelling tool exports), one label per line:

        {"prompt": "<the prompt as ingested>" | "prompt_id": "<its content hash>",
         "chosen": "...", "rejected": "..."  |  "responses": ["best", "next", ...],
         "annotator_id": "alice", "labeled_at": "2026-01-05T10:00:00Z"}

    Yields (line number, raw line, parsed label or None, reason codes): the label as
    {"prompt_id", "prompt" (text or None), "ranked", "annotator_id", "labeled_at"}."""
    from rlhf.pipeline.ingest import _missing, _parse_timestamp

    with open(path, encoding="utf-8", errors="replace") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            raw = line.rstrip("\n")[:2000]
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):
                yield n, raw, None, ["bad_json"]
                continue
            if not isinstance(obj, dict):
                yield n, raw, None, ["bad_json"]
                continue
            reasons: list[str] = []
            ranked = obj.get("responses") if "responses" in obj else [obj.get("chosen"),
                                                                      obj.get("rejected")]
            prompt, pid = obj.get("prompt"), obj.get("prompt_id")
            if _missing(prompt) and _missing(pid):
                reasons.append("missing_provenance")
            elif not isinstance(prompt if not _missing(prompt) else pid, str):
                reasons.append("bad_type")
            if not isinstance(ranked, list) or len(ranked) < 2 \
                    or not all(isinstance(r, str) for r in ranked):
                reasons.append("bad_type")
            for key in QUEUE_PROVENANCE:
                if _missing(obj.get(key)):
                    reasons.append("missing_provenance")
                elif not isinstance(obj[key], str):
                    reasons.append("bad_type")
            labeled_at = None
            if not reasons:
                try:
                    labeled_at = _parse_timestamp(obj["labeled_at"])
                except ValueError:
                    reasons.append("bad_type")
            if reasons:
                yield n, raw, None, sorted(set(reasons))
                continue
            text = prompt.strip() if isinstance(prompt, str) and prompt.strip() else None
            yield n, raw, {"prompt_id": content_hash(text) if text else pid, "prompt": text,
                           "ranked": ranked, "annotator_id": obj["annotator_id"],
                           "labeled_at": labeled_at}, []


def human_rows(store_root: str | Path, queue_paths: Sequence[str | Path],
               cfg: PreferencesConfig) -> tuple[list[dict], list[dict], dict[str, Any]]:
    """(preferences rows, rejected_labels rows, counts) from the store's `external_pairs` (the
    human pairs ingest kept with their prompts) and the annotation-queue files."""
    from collections import Counter

    from rlhf.store.io import read_table

    root = Path(store_root)
    if not (root / "prompts").is_dir():
        raise ValueError(f"no prompts table in {root} (run ingest first)")
    prompts = {r["prompt_id"]: r["text"]
               for r in read_table("prompts", root / "prompts").select(["prompt_id", "text"])
               .to_pylist()}
    pool_split = _pool_splits(root)
    rows: list[dict] = []
    rejected: list[dict] = []
    counts: dict[str, Counter] = defaultdict(Counter)
    reasons_seen: Counter = Counter()

    def add(source, source_file, line, pid, prompt, ranked, annotator, labeled_at, raw, reasons):
        counts[source]["input"] += 1
        reasons = list(reasons)
        if not reasons:
            if pid not in prompts:
                reasons.append("unknown_prompt")
            texts = [r.strip() for r in ranked]
            if any(not t for t in texts):
                reasons.append("empty")
            if len(set(texts)) < len(texts):
                reasons.append("equal_responses")
        if reasons:
            counts[source]["rejected"] += 1
            reasons_seen.update(reasons)
            rejected.append({"source_file": source_file, "source_line": line, "source_type": source,
                             "reasons": reasons, "prompt_id": pid, "raw": raw})
            return
        counts[source]["kept"] += 1
        prompt = prompt or prompts[pid]
        rid = content_hash(f"{source}|{source_file}|{line}|" + "|".join(ranked))[:16]
        split = label_split(pid, cfg, pool_split)
        for rank, resp in enumerate(ranked):
            resp = resp.strip()
            rows.append({"ranking_id": rid, "prompt_id": pid, "prompt": prompt,
                         "response_hash": content_hash(resp), "response": resp,
                         "annotator_id": annotator, "labeled_at": labeled_at, "score": None,
                         "rank": rank, "source": source, "response_source": "human",
                         "split": split, "gold_score": None})

    if (root / "external_pairs").is_dir():
        for p in read_table("external_pairs", root / "external_pairs").to_pylist():
            # a one-turn context is the prompt itself; a longer one is the dialogue so far
            prompt = None if p["n_turns"] == 1 else clean(p["context"])
            raw = json.dumps({"chosen": p["chosen"], "rejected": p["rejected"]},
                             ensure_ascii=True)[:2000]
            add(p["source"], p["source_file"], p["source_line"], p["prompt_id"], prompt,
                [p["chosen"], p["rejected"]], p["source"], None, raw, [])
    for qp in queue_paths:
        qp = Path(qp)
        for n, raw, label, reasons in read_queue(qp, qp.name):
            if label is None:
                add("queue", qp.name, n, None, None, [], "", None, raw, reasons)
                continue
            add("queue", qp.name, n, label["prompt_id"], None, label["ranked"],
                label["annotator_id"], label["labeled_at"], raw, [])
    by_source = {k: {"input": c["input"], "kept": c["kept"], "rejected": c["rejected"]}
                 for k, c in sorted(counts.items())}
    return rows, rejected, {"by_source": by_source, "by_reason": dict(sorted(reasons_seen.items()))}


def run_human(cfg: PreferencesConfig, store_root: str | Path, out_dir: str | Path,
              rejected_dir: str | Path, queue_paths: Sequence[str | Path] = (),
              metrics_path: str | Path | None = None) -> dict[str, Any]:
    """The `preferences` stage on human labels only: write `preferences` and `rejected_labels`."""
    from rlhf.store.io import staged_folders, write_shard, write_text_atomic

    rows, rejected, counts = human_rows(store_root, queue_paths, cfg)
    if not rows:
        raise ValueError(f"no usable human preference labels in {store_root} "
                         f"(or the queue files): {counts['by_source']}")
    out_dir, rejected_dir = Path(out_dir), Path(rejected_dir)
    with staged_folders([out_dir, rejected_dir]) as staged:
        write_shard("preferences", rows, staged[out_dir] / "part-00000.parquet")
        write_shard("rejected_labels", rejected, staged[rejected_dir] / "part-00000.parquet")
    pairs = expand_pairs(rows)
    metrics = {
        "labels": "human", "prompt_source": "human labels",
        "n_prompts": len({r["prompt_id"] for r in rows}),
        "n_rankings": len({r["ranking_id"] for r in rows}), "n_pairs": len(pairs),
        **{f"n_pairs_{s}": sum(p["split"] == s for p in pairs) for s in ("train", "heldout", "gold")},
        "n_annotators": len({r["annotator_id"] for r in rows}),
        "labels_by_source": counts["by_source"], "rejected_by_reason": counts["by_reason"],
        "invariant_holds": all(c["input"] == c["kept"] + c["rejected"]
                               for c in counts["by_source"].values()),
    }
    if metrics_path:
        write_text_atomic(metrics_path, json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    return metrics
