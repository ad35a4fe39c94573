"""Dedup benchmark: wall time and peak memory of the clustering at 10k, 100k and 1M prompts, next
to scipy's exact linkage where it fits in memory. A figure, not a pass/fail test.

    .venv/bin/python bench/bench_dedup.py                       # 10k, 100k, 1M planted vectors
    .venv/bin/python bench/bench_dedup.py --sizes 10000 100000 --real 10000

Each measurement runs in its own subprocess (so peak RSS is that run's alone): it loads the
vectors from a .npy file, then times `cluster()` (the index path: faiss range search, connected
components, exact linkage in each) or exact scipy linkage.
Vectors: random unit vectors in 384-d with planted near-duplicate groups
(`planted_unit_vectors`: ~30% of rows in groups of 2-5 within cosine 0.15 of a centre), so the
embedding cost is excluded. `--real N` also embeds N real prompts (hh-rlhf human turns, the
world's framed questions) with MiniLM, reports the embedding time, and clusters those embeddings
both ways (the kept/dropped agreement on real text). Goals: 1M planted in <= 60 s on 2 cores and
<= 4 GiB, agreement >= 0.995 with the planted groups and >= 0.999 with exact linkage at <= 20k.
`--ann-probe` / `--ann-list-size` / `--ann-dim` trade recall for time (docs/scale-out.md). The
machine's load average is printed with every row: other jobs share the CPU. The rows go to
`--out` (bench/data/dedup.json) with the command, commit, machine and load at the start
(docs/generated/scale-bench.md renders the committed files).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
GENERATE = ("import sys, numpy as np\n"
            "from rlhf.pipeline.dedup_cluster import planted_unit_vectors\n"
            "x, groups = planted_unit_vectors(int(sys.argv[1]), seed=0)\n"
            "np.save(sys.argv[2], x)\n"
            "np.save(sys.argv[2].replace('.npy', '_groups.npy'), groups)\n")


def _peak_rss_gib() -> float:
    """This process's peak resident set (VmHWM). Not ru_maxrss: Linux carries that over from the
    parent across fork + exec, so a child of a big parent would report the parent's size."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20  # kB -> GiB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _child(args: argparse.Namespace) -> None:
    """Run one measurement and print one JSON line."""
    import scipy.cluster.hierarchy  # noqa: F401  (imports are not part of the timing)
    import sklearn.cluster  # noqa: F401
    from rlhf.pipeline.dedup import DedupConfig
    from rlhf.pipeline.dedup_cluster import cluster, exact_labels

    x = np.load(args.vectors)
    base_rss = _peak_rss_gib()  # the interpreter, libraries and the vectors
    t0 = time.perf_counter()
    if args.mode == "exact":
        labels = exact_labels(x, args.threshold, args.linkage)
        info = {"path": "exact", "partitions": 1, "merges": 0}
    else:
        cfg = DedupConfig(distance_threshold=args.threshold, linkage=args.linkage,
                          exact_max_size=args.exact_max_size, partition_size=args.partition_size,
                          merge_partitions=args.merge_partitions, ann_list_size=args.ann_list_size,
                          ann_probe=args.ann_probe, ann_dim=args.ann_dim, ann_margin=args.ann_margin)
        labels, ci = cluster(x, cfg)
        info = {"path": ci.path, "close_pairs": ci.close_pairs, "components": ci.components,
                "largest_component": ci.largest_component,
                "fallback_components": ci.fallback_components}
    wall = time.perf_counter() - t0
    np.save(args.labels_out, labels)
    print(json.dumps({
        "n": len(x), "mode": args.mode, "wall_s": round(wall, 2),
        "peak_rss_gib": round(_peak_rss_gib(), 3),
        "rss_before_gib": round(base_rss, 3),
        "clusters": int(labels.max()) + 1 if len(labels) else 0, **info}))


def _run_child(vectors: Path, mode: str, labels_out: Path, a: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child", "--vectors", str(vectors), "--mode", mode,
           "--labels-out", str(labels_out), "--threshold", str(a.threshold), "--linkage",
           a.linkage, "--partition-size", str(a.partition_size), "--merge-partitions",
           str(a.merge_partitions), "--exact-max-size", str(a.exact_max_size),
           "--ann-list-size", str(a.ann_list_size), "--ann-probe", str(a.ann_probe),
           "--ann-dim", str(a.ann_dim), "--ann-margin", str(a.ann_margin)]
    load = os.getloadavg()[0]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return {"mode": mode, "error": (out.stderr or out.stdout).strip().splitlines()[-1:],
                "load_before": round(load, 1)}
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row["load_before"] = round(load, 1)
    return row


def _exact_fits(n: int, budget_gib: float) -> bool:
    # condensed float64 matrix plus scipy's working copy inside linkage
    return 2 * 8 * n * (n - 1) / 2 / 2**30 <= budget_gib


def _real_texts(n: int) -> list[str]:
    import gzip
    import random

    from rlhf.pipeline.ingest import split_dialogue
    from rlhf.pipeline.world.sources import FRAMES
    from rlhf.pipeline.world.topics import TOPICS

    texts: list[str] = []
    hh = REPO.parent / "shared" / "realdata" / "hh-rlhf__harmless-base_test.jsonl.gz"
    if hh.exists():
        with gzip.open(hh) as fh:
            for line in fh:
                texts += [t for role, t in split_dialogue(json.loads(line)["chosen"])
                          if role == "Human" and t]
    framed = [f.format(q=q) for t in TOPICS for q in t.questions for f in FRAMES]
    random.Random(0).shuffle(framed)
    texts += framed
    return list(dict.fromkeys(texts))[:n]


def _agreement(a_path: Path, b_path: Path, lengths: np.ndarray) -> float:
    from rlhf.pipeline.dedup_cluster import kept_agreement

    return kept_agreement(np.load(a_path), np.load(b_path), lengths)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--real", type=int, default=0, help="also embed and cluster N real prompts")
    ap.add_argument("--exact-budget-gib", type=float, default=8.0,
                    help="run exact scipy linkage only where its matrices fit in this")
    ap.add_argument("--cache", type=Path, default=REPO / "artifacts" / "cache" / "bench_embeddings")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "data" / "dedup.json")
    ap.add_argument("--threshold", type=float, default=0.35)
    ap.add_argument("--linkage", default="complete")
    from rlhf.pipeline.dedup import DedupConfig

    ap.add_argument("--partition-size", type=int, default=DedupConfig().partition_size)
    ap.add_argument("--merge-partitions", type=int, default=DedupConfig().merge_partitions)
    ap.add_argument("--ann-list-size", type=int, default=DedupConfig().ann_list_size)
    ap.add_argument("--ann-probe", type=int, default=DedupConfig().ann_probe)
    ap.add_argument("--ann-dim", type=int, default=DedupConfig().ann_dim)
    ap.add_argument("--ann-margin", type=float, default=DedupConfig().ann_margin)
    ap.add_argument("--exact-max-size", type=int, default=0,
                    help="the stage's exact_max_size; 0 forces the index path at every size")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--vectors", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="scalable", help=argparse.SUPPRESS)
    ap.add_argument("--labels-out", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        _child(a)
        return
    a.exact_max_size = max(a.exact_max_size, 2)
    sys.path.insert(0, str(Path(__file__).parent))
    from run_meta import run_meta, write_json

    meta = run_meta()

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f} (CPU shared with other jobs); "
          f"index lists of ~{a.ann_list_size} rows, {a.ann_probe} probed, {a.ann_dim} dims; "
          f"{a.linkage} linkage at {a.threshold}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_dedup_") as tmp:
        tmp = Path(tmp)
        jobs: list[tuple[str, int, Path, np.ndarray]] = []
        if a.real:
            from rlhf.pipeline.dedup import DedupConfig
            from rlhf.pipeline.dedup_embed import embed_with_cache
            from rlhf.store.hashing import content_hash

            texts = _real_texts(a.real)
            t0 = time.perf_counter()
            x, info = embed_with_cache({content_hash(t): t for t in texts}, DedupConfig(), a.cache)
            emb_s = time.perf_counter() - t0
            print(f"real: embedded {info['embedded_new']} new + {info['embedded_cached']} cached "
                  f"prompts in {emb_s:.1f} s ({len(texts)} texts)", flush=True)
            path = tmp / "real.npy"
            np.save(path, x)
            jobs.append(("real MiniLM", len(texts), path, np.array([len(t) for t in texts])))
            rows.append({"set": "real MiniLM", "n": len(texts), "mode": "embedding",
                         "wall_s": round(emb_s, 2), "embedded_new": info["embedded_new"]})
        for n in a.sizes:
            t0 = time.perf_counter()
            path = tmp / f"planted_{n}.npy"
            subprocess.run([sys.executable, "-c", GENERATE, str(n), str(path)], check=True)
            print(f"planted {n:,}: generated in {time.perf_counter() - t0:.1f} s", flush=True)
            lengths = np.random.default_rng(1).integers(5, 300, n)
            jobs.append(("planted", n, path, lengths))
        for name, n, path, lengths in jobs:
            got = {}
            for mode in ("scalable", "exact"):
                if mode == "exact" and not _exact_fits(n, a.exact_budget_gib):
                    rows.append({"set": name, "n": n, "mode": "exact",
                                 "skipped": f"needs ~{16 * n * (n - 1) / 2 / 2**30:.0f} GiB"})
                    print(f"{name} {n:,} exact: skipped (does not fit)", flush=True)
                    continue
                labels = tmp / f"{name.replace(' ', '_')}_{n}_{mode}.npy"
                row = {"set": name, **_run_child(path, mode, labels, a)}
                if "error" not in row:
                    got[mode] = labels
                rows.append(row)
                print(json.dumps(row), flush=True)
            groups = path.with_name(path.stem + "_groups.npy")
            if "scalable" in got and groups.exists():
                # exact linkage recovers the planted groups (it does at 10k), so where exact does
                # not fit, agreement with the planted groups stands in for agreement with it
                agree = _agreement(got["scalable"], groups, lengths)
                rows.append({"set": name, "n": n, "mode": "vs planted",
                             "kept_state_agreement": round(agree, 5)})
                print(f"{name} {n:,}: scalable vs planted groups kept/dropped agreement "
                      f"{agree:.4f}", flush=True)
            if len(got) == 2:
                agree = _agreement(got["scalable"], got["exact"], lengths)
                rows.append({"set": name, "n": n, "mode": "agreement", "kept_state_agreement":
                             round(agree, 5)})
                print(f"{name} {n:,}: scalable vs exact kept/dropped agreement {agree:.4f}",
                      flush=True)
    write_json(a.out, meta, rows, index={"list_size": a.ann_list_size, "probe": a.ann_probe,
                                         "dim": a.ann_dim, "margin": a.ann_margin,
                                         "linkage": a.linkage, "threshold": a.threshold})
    print(f"\n{'set':<12} {'n':>9} {'mode':<10} {'wall s':>8} {'peak RSS GiB':>13} "
          f"{'pairs':>10} {'clusters':>9}  note")
    for r in rows:
        note = r.get("skipped") or r.get("error") or (
            f"agreement {r['kept_state_agreement']:.4f}" if "kept_state_agreement" in r else
            f"load {r.get('load_before', '')}")
        print(f"{r['set']:<12} {r['n']:>9,} {r['mode']:<10} {r.get('wall_s', ''):>8} "
              f"{r.get('peak_rss_gib', ''):>13} {r.get('close_pairs', ''):>10} "
              f"{r.get('clusters', ''):>9}  {note}")
    print(f"written {a.out}")


if __name__ == "__main__":
    main()
