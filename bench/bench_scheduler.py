"""The prompt scheduler over a pool of a million prompts: seconds per step of its gate, with the
neighbours from the index against the brute-force scan. A figure, not a pass/fail test.

    .venv/bin/python bench/bench_scheduler.py                       # 1M pool, 200k with history
    .venv/bin/python bench/bench_scheduler.py --pool 100000 --history 50000 --brute

Pool: `planted_unit_vectors` (384-d, near-duplicate groups), the shape of the dedup stage's
`pool_embeddings`. History: `--history` prompts with 1-4 rewards each, fed through observe() as
the trainer does. Then `--steps` steps of select() on a batch of `--batch` candidates drawn from
the historical prompts (each decision needs its 10 neighbours): the first step builds the index
(reported apart), the others are the steady state. `--brute` also times the brute-force path on
the same pool (one step; its cost grows with the history). The rows go to bench/data/scheduler.json
with the command, commit, machine and load at the start.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from run_meta import run_meta, write_json

REPO = Path(__file__).resolve().parents[1]


def _peak_rss_gib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", type=int, default=1_000_000)
    ap.add_argument("--history", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--brute", action="store_true", help="also time the brute-force path")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "data" / "scheduler.json")
    a = ap.parse_args()
    meta = run_meta()
    from rlhf.pipeline.config import build
    from rlhf.pipeline.dedup import planted_unit_vectors
    from rlhf.pipeline.ppo.config import PPOConfig
    from rlhf.pipeline.ppo.features.prompt_scheduler import PromptScheduler

    cfg = build(PPOConfig, {"schedule_on": True}, "ppo")
    t0 = time.perf_counter()
    x, _ = planted_unit_vectors(a.pool, seed=0)
    ids = [f"p{i:07d}" for i in range(a.pool)]
    print(f"pool of {a.pool:,} planted prompts in {time.perf_counter() - t0:.1f} s; load "
          f"{meta['load_1min_at_start']}", flush=True)
    rng = np.random.default_rng(0)
    hist_rows = rng.choice(a.pool, a.history, replace=False)
    depth = rng.integers(1, 5, a.history)
    rows_by_step = [[{"prompt_id": ids[r], "reward": float(rng.normal(2, 1))}
                     for r in hist_rows[depth > k]] for k in range(4)]
    out = []
    paths = [("index", 0)] + ([("brute force", 10 ** 12)] if a.brute else [])
    for name, min_history in paths:
        sched = PromptScheduler(cfg, ids, x, index_min_history=min_history)
        t0 = time.perf_counter()
        for k, rows in enumerate(rows_by_step):
            sched.observe(k + 1, rows, {})
        observe_s = time.perf_counter() - t0
        step = len(rows_by_step) + 1
        times, skips = [], 0
        for s in range(a.steps if name == "index" else 1):
            cand = [(ids[r], "") for r in rng.choice(hist_rows, a.batch, replace=False)]
            t0 = time.perf_counter()
            keep = sched.select(step + s, cand)
            times.append(time.perf_counter() - t0)
            skips += keep.count(False)
            sched.table_rows(step + s)
        row = {"path": name, "pool": a.pool, "history": a.history, "batch": a.batch,
               "observe_s": round(observe_s, 2), "first_step_s": round(times[0], 3),
               "step_s_median": round(float(np.median(times[1:] or times)), 3),
               "steps": len(times), "skipped": skips, "peak_rss_gib": round(_peak_rss_gib(), 2)}
        out.append(row)
        print(row, flush=True)
    write_json(a.out, meta, out)
    print(f"written {a.out}")


if __name__ == "__main__":
    main()
