"""The strong RM ensemble's scoring (`RMEnsemble._raw`, pipeline/reward/scorer.py) at one torch
thread, four ways, on the real ensemble and real texts: its members one after the other
(`inline`), a (member, chunk) forward per job for one thread per core (`chunk_threads`: what
`RLHF_WORKERS=0` runs), a member per thread (`member_threads`), and a member per spawned worker
process (`processes`: pipeline/workers.py's pool, started before the clock; each job loads its
member from disk and scores the pre-tokenized texts). The ways run interleaved, `--repeats`
rounds; every way's scores must be bit-identical to the inline ones.

    RLHF_TORCH_THREADS=1 .venv/bin/python bench/ensemble_threads.py --artifacts artifacts

Prints one JSON line per way (median seconds, every repeat's seconds, the median CPU seconds of
this process: the processes' work is not in it; for the thread ways, the share of the time the
two busiest threads were running or runnable, not waiting for the GIL) and a last line with the
speed-ups over inline. On a machine other sessions keep busy (Linux's autogroup gives each
session an equal share of the cores) the speed-ups shrink towards 1: say so with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def _texts(artifacts: Path, n: int) -> tuple[list[str], list[str]]:
    """The first `n` (prompt, response) rows of the preferences store: the texts the reward
    stage scores."""
    import pyarrow.parquet as pq

    prompts: list[str] = []
    responses: list[str] = []
    for part in sorted((artifacts / "store" / "preferences").glob("*.parquet")):
        table = pq.read_table(part, columns=["prompt", "response"]).to_pydict()
        prompts += table["prompt"]
        responses += table["response"]
    if len(prompts) < n:
        raise SystemExit(f"only {len(prompts)} preference rows under {artifacts}, asked for {n}")
    return prompts[:n], responses[:n]


def _member_job(folder: str, ids: list[list[int]], batch_size: int, precision: str):
    """A worker's job: load one member and score the texts."""
    from rlhf.pipeline.models.policy import load_tokenizer
    from rlhf.pipeline.reward.scorer import batch_scores, load_rm

    return batch_scores(load_rm(folder), load_tokenizer(folder), ids, batch_size, precision)


def _runnable_shares(run):
    """(`run()`, each busy thread's share of 10 ms samples in which Linux had it running or
    runnable (state R), busiest first): a thread that waits for the GIL sleeps on a futex
    (state S), so two scoring threads near 1.0 are not held back by the GIL, whatever share
    of the cores other processes leave them. Linux only ([] elsewhere)."""
    import threading
    from collections import Counter

    if not Path("/proc/self/task").is_dir():
        return run(), []
    running, seen, stop = Counter(), Counter(), threading.Event()
    skip = {str(threading.get_native_id())}  # the calling thread: it waits for the jobs

    def probe():
        skip.add(str(threading.get_native_id()))
        while not stop.wait(0.01):
            for task in Path("/proc/self/task").iterdir():
                try:
                    state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
                except OSError:  # the thread ended
                    continue
                if task.name not in skip:
                    seen[task.name] += 1
                    running[task.name] += state == "R"

    watcher = threading.Thread(target=probe, daemon=True)
    watcher.start()
    try:
        out = run()
    finally:
        stop.set()
        watcher.join()
    return out, sorted((round(running[t] / seen[t], 2) for t in running if running[t]),
                       reverse=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifacts", type=Path, default=Path("artifacts"))
    ap.add_argument("--texts", type=int, default=600)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import torch
    from rlhf.pipeline.models.policy import quiet_hf
    from rlhf.pipeline.reward.scorer import (
        batch_scores,
        encode_texts,
        load_ensemble,
        member_threads,
    )
    from rlhf.pipeline.workers import worker_pool

    quiet_hf()
    if torch.get_num_threads() != 1:
        raise SystemExit("run at one torch thread (RLHF_TORCH_THREADS=1), as make run does")
    folder = args.artifacts / "models" / "rm_strong"
    ens = load_ensemble(folder)
    prompts, responses = _texts(args.artifacts, args.texts)
    ids = encode_texts(ens.tokenizer, prompts, responses, ens.max_length)
    members = [str(folder / m) for m in ens.meta["members"]]

    os.environ["RLHF_WORKERS"] = "0"  # make run's: one per core
    t = time.perf_counter()
    with worker_pool(len(members)) as pool:
        spawn = time.perf_counter() - t
        if pool is None:
            raise SystemExit("one core: nothing to run in parallel")
        for up in [pool.submit(time.sleep, 1.0) for _ in range(2)]:
            up.result()  # both processes are up (torch imported) before the clock starts

        def processes():
            jobs = [pool.submit(_member_job, m, ids, ens.batch_size, ens.precision)
                    for m in members]
            return torch.stack([j.result() for j in jobs])

        def chunk_threads():
            os.environ["RLHF_WORKERS"] = "0"
            return ens._raw(prompts, responses)

        def member_threads_():
            with ThreadPoolExecutor(member_threads(ens.models)) as threads:
                return torch.stack(list(threads.map(
                    lambda m: batch_scores(m, ens.tokenizer, ids, ens.batch_size, ens.precision),
                    ens.models)))

        def inline():
            os.environ["RLHF_WORKERS"] = "1"
            return ens._raw(prompts, responses)

        ways = {"inline": inline, "chunk_threads": chunk_threads,
                "member_threads": member_threads_, "processes": processes}
        seconds: dict[str, list[float]] = {w: [] for w in ways}
        cpu: dict[str, list[float]] = {w: [] for w in ways}  # this process's, all its threads
        runnable: dict[str, list[list[float]]] = {w: [] for w in ways}
        scores = {}
        for _ in range(args.repeats):
            for way, run in ways.items():
                t, c = time.perf_counter(), time.process_time()
                scores[way], shares = (_runnable_shares(run) if "threads" in way
                                       else (run(), []))
                seconds[way].append(round(time.perf_counter() - t, 2))
                cpu[way].append(round(time.process_time() - c, 2))
                runnable[way].append(shares[:2])
                print(f"round {len(seconds[way])} {way}: {seconds[way][-1]} s, "
                      f"{cpu[way][-1]} s CPU here, runnable shares {shares[:2]}",
                      file=sys.stderr, flush=True)
    os.environ["RLHF_WORKERS"] = "0"
    medians = {w: statistics.median(s) for w, s in seconds.items()}
    for way, s in seconds.items():
        print(json.dumps({"way": way, "texts": len(ids), "members": len(members),
                          "median_s": medians[way], "seconds": s,
                          "cpu_here_median_s": statistics.median(cpu[way]),
                          "thread_runnable_shares": runnable[way],
                          "identical_to_inline": bool(torch.equal(scores[way],
                                                                  scores["inline"]))}))
    print(json.dumps({"threads_granted": member_threads(ens.models),
                      "pool_spawn_s": round(spawn, 2), "cpus": os.cpu_count(),
                      **{f"speedup_{w}": round(medians["inline"] / medians[w], 2)
                         for w in ways if w != "inline"}}))


if __name__ == "__main__":
    main()
