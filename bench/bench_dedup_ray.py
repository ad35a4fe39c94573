"""Dedup on Ray against the default path: the same clusters from `--engine ray` (a local cluster
of `--workers` workers) and the single process, and the embedding throughput per worker. A figure,
not a pass/fail test.

    .venv/bin/python bench/bench_dedup_ray.py                      # 100k planted + the real prompts
    .venv/bin/python bench/bench_dedup_ray.py --planted 20000 --real 2000

Planted: `--planted` unit vectors (bench_dedup.py's set, no embedding): the close pairs from the
Ray engine's search tasks against the default path's, then the clusters of both. Real: up to
`--real` real prompts (hh-rlhf human turns from ../shared/realdata, the world's framed
questions: about 10k distinct texts exist, fewer than 100k) embedded by the Ray engine's encoder
actors and by the single process (no cache), both clustered through the index path: the
embeddings' largest difference, the clusters of both, prompts embedded per second per worker.
The rows go to bench/data/dedup_ray.json with the command, commit, machine and load at the start.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from run_meta import run_meta, write_json

REPO = Path(__file__).resolve().parents[1]


def _same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    return len(set(zip(a.tolist(), b.tolist()))) == len(set(a.tolist())) == len(set(b.tolist()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--planted", type=int, default=100_000)
    ap.add_argument("--real", type=int, default=100_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "data" / "dedup_ray.json")
    a = ap.parse_args()
    meta = run_meta()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from bench_dedup import _real_texts
    from rlhf.pipeline.dedup import DedupConfig
    from rlhf.pipeline.dedup_cluster import cluster, planted_unit_vectors
    from rlhf.pipeline.dedup_embed import encode
    from rlhf.pipeline.dedup_ray import RayEngine

    cfg = DedupConfig(exact_max_size=2)  # the index path at every size
    rows = []
    with RayEngine(workers=a.workers) as engine:
        if a.planted:
            x, _ = planted_unit_vectors(a.planted, seed=0)
            t0 = time.perf_counter()
            local, info = cluster(x, cfg)
            local_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            pairs = engine.close_pairs(x, cfg)
            remote, rinfo = cluster(x, cfg, pairs=pairs)
            ray_s = time.perf_counter() - t0
            rows.append({"set": "planted", "n": a.planted, "local_s": round(local_s, 2),
                         "ray_s": round(ray_s, 2), "close_pairs_local": info.close_pairs,
                         "close_pairs_ray": rinfo.close_pairs,
                         "same_clusters": _same_partition(local, remote),
                         "search_tasks": engine.stats.get("search_tasks")})
            print(rows[-1], flush=True)
        if a.real:
            texts = _real_texts(a.real)
            t0 = time.perf_counter()
            x_local = encode(texts, cfg.model, cfg.batch_size)
            local_s = time.perf_counter() - t0
            x_ray = engine.encode(texts, cfg)
            stats = dict(engine.stats)
            local, info = cluster(x_local, cfg)
            remote, rinfo = cluster(x_ray, cfg)
            rows.append({"set": "real MiniLM", "n": len(texts),
                         "local_embed_s": round(local_s, 2),
                         "local_per_s": round(len(texts) / local_s, 1),
                         "ray_embed_s": stats["embed_s"],
                         "ray_per_worker_per_s": stats["embed_per_worker_per_s"],
                         "max_abs_embedding_diff": float(np.abs(x_local - x_ray).max()),
                         "close_pairs_local": info.close_pairs, "close_pairs_ray": rinfo.close_pairs,
                         "same_clusters": _same_partition(local, remote)})
            print(rows[-1], flush=True)
    write_json(a.out, meta, rows, workers=a.workers, address="local")
    print(f"written {a.out}")


if __name__ == "__main__":
    main()
