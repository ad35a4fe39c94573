"""Rankings -> pairs, and how often the annotators' pairs agree with the gold judge."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any


def expand_pairs(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """All (chosen, rejected) pairs of each ranking: k responses give k(k-1)/2 pairs.

    Identical responses (same hash) and equal annotator scores make no pair. Each pair carries
    its prompt_id, source, split, annotator_id and the gold scores of both sides when known.
    """
    by_ranking: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_ranking[r["ranking_id"]].append(r)
    pairs = []
    for rid in sorted(by_ranking):
        ranked = sorted(by_ranking[rid], key=lambda r: r["rank"])
        for i, a in enumerate(ranked):
            for b in ranked[i + 1:]:
                if a["response_hash"] == b["response_hash"]:
                    continue
                if a["score"] is not None and b["score"] is not None and a["score"] == b["score"]:
                    continue
                pairs.append({
                    "prompt": a["prompt"], "chosen": a["response"], "rejected": b["response"],
                    "prompt_id": a["prompt_id"], "source": a["source"], "split": a["split"],
                    "annotator_id": a["annotator_id"],
                    "gold_chosen": a.get("gold_score"), "gold_rejected": b.get("gold_score"),
                })
    return pairs



def _agreement(pairs: Sequence[dict]) -> float | None:
    """Share of annotator pairs whose order the gold judge agrees with (gold ties excluded)."""
    known = [p for p in pairs if p["gold_chosen"] is not None and p["gold_rejected"] is not None
             and p["gold_chosen"] != p["gold_rejected"]]
    if not known:
        return None
    return sum(p["gold_chosen"] > p["gold_rejected"] for p in known) / len(known)
