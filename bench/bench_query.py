"""Times the named audits over a synthetic 10M-row rollout history; reports bytes per rollout row.

Generates a store with realistic cardinalities (vectorised numpy -> pyarrow, written through the
same RolloutWriter the PPO trainer uses, which also derives each row's prompt_key): 50k pool
prompts from three source types in 50 topic clusters, four PPO runs of 1,000 rollouts a step
(10,000 steps in all; two runs forked from another's checkpoint), one RM score per scored
rollout, checkpoints every 100 steps, 200k annotator labels. Then runs every audit through the
locked connection and the statement gate (`rlhf audit`'s own path), and reports the first and
the best of `--repeat` wall-clock timings, the process CPU seconds of the best run (all DuckDB
threads; on a shared machine, CPU seconds / threads estimates the wall time on idle cores), the
files and row groups DuckDB scanned, the store's size and the load average.

    .venv/bin/python bench/bench_query.py                    # 10M rows under artifacts/bench/store
    .venv/bin/python bench/bench_query.py --rows 1000000     # smaller
    .venv/bin/python bench/bench_query.py --reuse            # time an existing store again

Figures, not a pass/fail test: the goals are each audit under 0.25 s on 2 cores and the
rollouts at most 32 bytes a row at 10M rows. The figures (with the bytes of every rollout column
per row) go to `--out` (bench/data/query.json) with the command, commit, machine and the load at
the start (docs/generated/scale-bench.md renders the committed files).
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from rlhf.store import rollup
from rlhf.store.catalog import connect
from rlhf.store.io import write_shard
from rlhf.store.query import list_audits, run_sql
from rlhf.store.rollouts import RolloutWriter, StepShardWriter
from rlhf.store.schemas import TABLES

N_PROMPTS = 50_000
N_TOPICS = 50
PER_STEP = 1_000
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
HEX = np.frombuffer(b"0123456789abcdef", np.uint8)


def hex_strings(rng: np.random.Generator, n: int) -> pa.Array:
    """n random 64-character hex strings (sha256-like), built without a Python loop."""
    return hex_of(rng.integers(0, 256, size=(n, 32), dtype=np.uint8))


def hex_keys(raw: np.ndarray) -> pa.Array:
    """`store.hashing.hex_key` of each row's hash: its first 8 bytes, big-endian, signed."""
    return pa.array(np.ascontiguousarray(raw[:, :8]).view(">i8").ravel().astype(np.int64))


def hex_of(raw: np.ndarray) -> pa.Array:
    """The [n, 32] bytes as n 64-character hex strings."""
    n = len(raw)
    chars = np.empty((n, 64), np.uint8)
    chars[:, 0::2] = HEX[raw >> 4]
    chars[:, 1::2] = HEX[raw & 15]
    offsets = np.arange(0, 64 * n + 1, 64, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets),
                                                  pa.py_buffer(chars.tobytes())])


def sha(i: int, salt: str = "") -> str:
    return hashlib.sha256(f"{salt}{i}".encode()).hexdigest()


# Runs: (run_id, first step, last step, parent checkpoint or None). r2 forks r1 at step 2000,
# r3 forks r2 at step 4000; r4 starts from SFT. 4000 + 3000 + 2000 + 1000 = 10,000 steps.
RUNS = [("r1", 1, 4000, None), ("r2", 2001, 5000, "r1-2000"), ("r3", 4001, 6000, "r2-4000"),
        ("r4", 1, 1000, None)]


def generate(root: Path, rows: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    scale = rows / (PER_STEP * sum(last - first + 1 for _, first, last, _ in RUNS))
    prompt_ids = np.array([sha(i) for i in range(N_PROMPTS)])
    sources = rng.choice(["human", "user_query", "open_dataset"], N_PROMPTS, p=[0.5, 0.3, 0.2])
    topics = rng.integers(0, N_TOPICS, N_PROMPTS, dtype=np.int32)
    ids = pa.array(prompt_ids)
    pool = pa.table({
        "prompt_id": ids, "text": pa.array([f"prompt {i}" for i in range(N_PROMPTS)]),
        "source_type": pa.array(sources), "source_file": pa.array(["sources/x.jsonl"] * N_PROMPTS),
        "source_line": pa.array(np.arange(1, N_PROMPTS + 1)), "dedup_cluster": pa.array(np.arange(N_PROMPTS)),
        "cluster_size": pa.array(rng.integers(1, 4, N_PROMPTS, dtype=np.int32)),
        "topic_cluster": pa.array(topics), "n_tokens": pa.array(rng.integers(5, 60, N_PROMPTS, dtype=np.int32)),
        "split": pa.array(np.where(rng.random(N_PROMPTS) < 0.8, "ppo", "eval"))})
    write_shard("pool", pool, root / "pool" / "part-00000.parquet")
    extra = 10_000  # near-duplicates dedup folded away: in prompts, not in the pool
    prompts = pa.table({
        "prompt_id": pa.array(list(prompt_ids) + [sha(i, "dup") for i in range(extra)]),
        "text": pa.array([f"prompt {i}" for i in range(N_PROMPTS + extra)]),
        "source_type": pa.array(list(sources) + list(rng.choice(["human", "user_query"], extra))),
        "source_file": pa.array(["sources/x.jsonl"] * (N_PROMPTS + extra)),
        "source_line": pa.array(np.arange(1, N_PROMPTS + extra + 1)),
        "provenance": pa.nulls(N_PROMPTS + extra, pa.string()),
        "created_at": pa.array([T0] * (N_PROMPTS + extra), pa.timestamp("us", tz="UTC")),
        "n_tokens": pa.array(rng.integers(5, 60, N_PROMPTS + extra, dtype=np.int32))})
    write_shard("prompts", prompts, root / "prompts" / "part-00000.parquet")
    n_rej = 5_000
    write_shard("rejected", pa.table({
        "source_file": pa.array(["sources/x.jsonl"] * n_rej), "source_line": pa.array(np.arange(n_rej)),
        "source_type": pa.array(rng.choice(["human", "user_query", "open_dataset"], n_rej)),
        "reasons": pa.array([["url"]] * n_rej, pa.list_(pa.string())),
        "prompt_id": pa.array([sha(i, "rej") for i in range(n_rej)]), "raw": pa.array(["x"] * n_rej)}),
        root / "rejected" / "part-00000.parquet")
    difficulty = rng.uniform(0, 10, N_PROMPTS).astype(np.float32)
    write_shard("difficulty", pa.table({
        "prompt_id": ids, "text": pool["text"], "split": pool["split"], "topic_cluster": pa.array(topics),
        "length": pa.array(rng.integers(10, 200, N_PROMPTS, dtype=np.int32)),
        "logprob_std": pa.array(rng.uniform(0, 2, N_PROMPTS).astype(np.float32)),
        "rm_score": pa.array(rng.uniform(0, 5, N_PROMPTS).astype(np.float32)),
        "score": pa.array(difficulty),
        "bucket": pa.array(np.where(difficulty < 4, "low", np.where(difficulty < 7, "mid", "high")))}),
        root / "difficulty" / "part-00000.parquet")
    prompt_hashes = pa.array([sha(i, "fmt") for i in range(N_PROMPTS)])
    checkpoints = []
    ts = pa.timestamp("us", tz="UTC")
    for run, first, last, parent in RUNS:
        per_step = max(1, int(round(PER_STEP * scale)))
        rw = RolloutWriter(root / "rollouts", run)
        mw = StepShardWriter("rm_scores", root / "rm_scores", run)
        for lo in range(first, last + 1, 100):  # 100 steps per write
            hi = min(lo + 99, last)
            steps = np.repeat(np.arange(lo, hi + 1), per_step)
            n = len(steps)
            idx = rng.integers(0, N_PROMPTS, n)
            tier = rng.choice(np.array([0, 1, 2], np.int8), n, p=[0.03, 0.90, 0.07])
            reward = rng.normal(2.5 + steps / 4000.0, 1.0).astype(np.float32)
            reward_mask = tier == 0  # the probe tier reuses history: no fresh reward
            scorer = np.array(["reused", "light_rm", "strong_rm"])[tier]
            n_flags = (rng.random(n) < 0.05).astype(np.int32)
            created = pa.array((np.datetime64(T0.replace(tzinfo=None), "us")
                                + (steps * 30).astype("timedelta64[s]")).astype("datetime64[us]"), ts)
            raw_hash = rng.integers(0, 256, size=(n, 32), dtype=np.uint8)
            generated = rng.integers(10, 256, n, dtype=np.int32)
            # r3 and r4 ran with a drafter (ppo.draft): about one proposal per generated token,
            # 15 % accepted (spec_lookup's rate in BENCHMARKS.md); r1 and r2 drafted nothing
            drafted = (rng.binomial(generated, 0.9).astype(np.int32) if run in ("r3", "r4")
                       else np.zeros(n, np.int32))
            accepted = rng.binomial(drafted, 0.15).astype(np.int32)
            response_hash = hex_of(raw_hash)  # rm_scores keep the full hash, rollouts its key
            rw.write(pa.table({
                "run_id": pa.array([run] * n), "step": pa.array(steps),
                "prompt_id": ids.take(pa.array(idx)), "prompt_hash": prompt_hashes.take(pa.array(idx)),
                "response_key": hex_keys(raw_hash),
                "reward": pa.array(reward, mask=reward_mask), "scorer": pa.array(scorer),
                "tier": pa.array(tier),
                "prompt_tokens": pa.array(rng.integers(5, 60, n, dtype=np.int32)),
                "response_tokens": pa.array(rng.integers(10, 256, n, dtype=np.int32)),
                "generated_tokens": pa.array(generated),
                "drafted": pa.array(drafted), "accepted": pa.array(accepted),
                "kl": pa.array(rng.gamma(2.0, 0.02, n).astype(np.float32)),
                "flags": pa.ListArray.from_arrays(pa.array(np.concatenate([[0], np.cumsum(n_flags)]).astype(np.int32)),
                                                  pa.array(["pruned"] * int(n_flags.sum()), pa.string())),
                "checkpoint_id": pa.array([f"{run}-{(s - 1) // 100 * 100}" for s in steps]),
                "created_at": created,
                "prompt_text": pa.nulls(n, pa.string()), "response_text": pa.nulls(n, pa.string()),
                "rm_version": pa.array(np.where(tier == 0, None, [f"v{s // 1000}" for s in steps]))}))
            scored = tier > 0
            m = int(scored.sum())
            conf = rng.beta(6, 2, m).astype(np.float32)
            mw.write(pa.table({
                "run_id": pa.array([run] * m), "step": pa.array(steps[scored]),
                "prompt_id": ids.take(pa.array(idx[scored])),
                "response_hash": response_hash.filter(pa.array(scored)),
                "rm_name": pa.array(scorer[scored]),
                "rm_version": pa.array([f"v{s // 1000}" for s in steps[scored]]),
                "score": pa.array(reward[scored]), "confidence": pa.array(conf),
                "escalated": pa.array(tier[scored] == 2), "queued": pa.array(conf < 0.6),
                "scored_at": created.filter(pa.array(scored))}))
        rw.close()
        mw.close()
        prev = parent
        for step in range(first + 99, last + 1, 100):
            cid = f"{run}-{step // 100 * 100}"
            checkpoints.append({"checkpoint_id": cid, "run_id": run, "step": step // 100 * 100,
                                "parent_id": prev, "data_version": "pool-v1" if step < 3000 else "pool-v2",
                                "params_hash": "p", "path": f"models/{cid}", "created_at": T0})
            prev = cid
    write_shard("checkpoints", checkpoints, root / "checkpoints" / "part-00000.parquet")
    n_lab = 200_000
    annot = rng.integers(0, 20, n_lab)
    labeled = T0 + dt.timedelta(days=0)
    minutes = np.sort(rng.integers(0, 60 * 24 * 30, n_lab))
    print(f"  rollouts and rm_scores written ({len(checkpoints)} checkpoints)", flush=True)
    write_shard("preferences", pa.table({
        "ranking_id": pa.array([f"k{i // 4}" for i in range(n_lab)]),
        "prompt_id": ids.take(pa.array(rng.integers(0, N_PROMPTS, n_lab))),
        "prompt": pa.array(["p"] * n_lab),
        "response_hash": hex_strings(rng, n_lab), "response": pa.array(["r"] * n_lab),
        "annotator_id": pa.array([f"ann{a:02d}" for a in annot]),
        "labeled_at": pa.array((np.datetime64(labeled.replace(tzinfo=None), "us")
                                + minutes.astype("timedelta64[m]")).astype("datetime64[us]"), ts),
        "score": pa.array(np.clip(rng.normal(3.8 + minutes / (60 * 24 * 30) * 0.4, 0.7), 0, 5).astype(np.float32)),
        "rank": pa.array(rng.integers(0, 4, n_lab, dtype=np.int32)),
        "source": pa.array(["annotator"] * n_lab), "response_source": pa.array(["policy"] * n_lab),
        "split": pa.array(["train"] * n_lab), "gold_score": pa.nulls(n_lab, pa.float32())}),
        root / "preferences" / "part-00000.parquet")
    print()


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*.parquet"))


AUDIT_ARGS = {"lineage": ["r3-6000"]}
NARROW = ("SELECT count(*) AS rollouts, avg(reward) AS reward FROM rollouts "
          "WHERE run_id = 'r2' AND step BETWEEN 3000 AND 3099")


def column_bytes(folder: Path) -> dict[str, int]:
    """Compressed bytes of each column (leaf path) over every shard under `folder`."""
    import pyarrow.parquet as pq

    out: collections.Counter = collections.Counter()
    for path in folder.rglob("*.parquet"):
        md = pq.ParquetFile(path).metadata
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            for c in range(rg.num_columns):
                out[rg.column(c).path_in_schema] += rg.column(c).total_compressed_size
    return dict(out.most_common())


def files_of(store: Path, table: str) -> int:
    if table.startswith(rollup.FOLDER):
        return 1
    return len(list((store / table).rglob("*.parquet")))


def scans(con, sql: str, params: dict) -> list[tuple[str, int, str, int]]:
    """(table, files read, row groups scanned/total, rows scanned) of each parquet scan.

    The bench asks for JSON profiles directly (the `rlhf` gate allows only plain EXPLAIN).
    """
    profile = json.loads(con.sql("EXPLAIN (ANALYZE, FORMAT json) " + sql, params=params).fetchall()[0][1])
    found = []

    def walk(node: dict) -> None:
        info = node.get("extra_info", {})
        if info.get("Function") == "READ_PARQUET":
            first = str(info.get("Filename(s)", "")).split(",")[0]
            parts = Path(first).parts
            table = (f"{rollup.FOLDER}/{Path(first).stem}" if rollup.FOLDER in parts
                     else next((part for part in parts if part in TABLES), "?"))
            found.append((table, int(info.get("Total Files Read", 0)),
                          f"{node.get('row_groups_scanned')}/{node.get('total_row_groups_to_scan')}",
                          int(node.get("rows_scanned", 0))))
        for child in node.get("children", []):
            walk(child)

    for top in profile.get("operator", []):
        walk(top)
    return found


def open_raw(store: Path):
    """`rlhf audit`'s locked connection, its rollup views the rollups' SQL over the raw rows."""
    from rlhf.store.catalog import lock_down

    con = connect(store, with_rollups=False)
    rollup.attach(con, store, stored=False)
    lock_down(con, store)
    return con


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, default=Path("artifacts/bench/store"))
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--reuse", action="store_true", help="time the existing store, do not regenerate")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "data" / "query.json")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from run_meta import run_meta, write_json

    meta = run_meta()
    if not args.reuse:
        shutil.rmtree(args.store, ignore_errors=True)
        t = time.perf_counter()
        generate(args.store, args.rows)
        print(f"generated {args.store} in {time.perf_counter() - t:.1f} s")
    con = connect(args.store, locked=True)
    n_rows = con.execute("SELECT count(*) FROM rollouts").fetchone()[0]
    n_files = len(list((args.store / "rollouts").rglob("*.parquet")))
    size = folder_bytes(args.store / "rollouts")
    threads = con.execute("SELECT current_setting('threads')").fetchone()[0]
    print(f"rollouts: {n_rows:,} rows in {n_files} shards, {size / 2**20:.1f} MiB, "
          f"{size / n_rows:.1f} bytes per rollout row")
    print(f"rm_scores: {folder_bytes(args.store / 'rm_scores') / 2**20:.1f} MiB; "
          f"DuckDB threads={threads}; cpus={os.cpu_count()}; load average {os.getloadavg()[0]:.2f}")
    cols = column_bytes(args.store / "rollouts")
    print("bytes per row by column: " + ", ".join(f"{k} {v / n_rows:.2f}" for k, v in cols.items()))
    t = time.perf_counter()
    built = rollup.build(args.store)
    build_s = time.perf_counter() - t
    rolled = sum(r["bytes"] for r in built)
    print(f"rollups built in {build_s:.2f} s: " + ", ".join(
        f"{r['rollup']} {r['rows']:,} rows {r['bytes'] / 2**20:.2f} MiB" for r in built)
        + f"; {rolled / n_rows:.2f} bytes per rollout row, "
        f"{(size + rolled) / n_rows:.2f} with the rollouts")
    rows = [{"audit": "(store)", "rollout_rows": n_rows, "shards": n_files,
             "bytes_per_row": round(size / n_rows, 2), "duckdb_threads": threads,
             **{f"bytes_per_row.{k}": round(v / n_rows, 2) for k, v in cols.items()}},
            {"audit": "(rollups)", "build_s": round(build_s, 2),
             "bytes_per_row": round(rolled / n_rows, 2),
             "bytes_per_row_with_rollouts": round((size + rolled) / n_rows, 2),
             **{f"rows.{r['rollup']}": r["rows"] for r in built}}]
    print(f"{'audit':<11} {'rows out':>8} {'first s':>8} {'best s':>8} {'cpu s':>6}  "
          "scanned (rollouts / rm_scores)")
    # A narrow question first (one run, 100 steps): what the partitions and the step sort prune.
    jobs = [("narrow", NARROW, {}, True)] + [
        (a.name, a.sql, a.bind(AUDIT_ARGS.get(a.name, [])), True) for a in list_audits()]
    names = [r.name for r in rollup.list_rollups()]
    jobs += [(f"{name} (raw rows)", sql, params, False) for name, sql, params, _ in jobs
             if any(n in sql for n in names)]
    for name, sql, params, stored in jobs:
        times, cpus, out_rows = [], [], 0
        for _ in range(args.repeat):
            con = open_raw(args.store) if not stored else connect(args.store, locked=True)
            t, c = time.perf_counter(), time.process_time()
            out_rows = len(run_sql(con, sql, params).fetchall())
            times.append(time.perf_counter() - t)
            cpus.append(time.process_time() - c)
        scan_txt = "; ".join(f"{t}: files {f}/{files_of(args.store, t)}, row groups {g}, "
                             f"{n:,} rows" for t, f, g, n in scans(con, sql, params)
                             if t in ("rollouts", "rm_scores") or t.startswith(rollup.FOLDER))
        print(f"{name:<11} {out_rows:>8} {times[0]:>8.3f} {min(times):>8.3f} "
              f"{cpus[times.index(min(times))]:>6.2f}  {scan_txt}", flush=True)
        rows.append({"audit": name, "rows_out": out_rows, "first_s": round(times[0], 3),
                     "best_s": round(min(times), 3),
                     "cpu_s": round(cpus[times.index(min(times))], 2), "scanned": scan_txt})
    # timings on a shared machine mean little without the load they ran under
    print("load average (1, 5, 15 min) at the end: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    write_json(args.out, meta, rows, load_at_end=[round(x, 2) for x in os.getloadavg()])
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
