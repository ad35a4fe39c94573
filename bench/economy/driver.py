"""The rollout-economy benchmark: held-out gold against generated tokens, arm by arm, seed by
seed, written to BENCHMARKS.md (docs/benchmarks.md; how sample efficiency is reported:
docs/methods.md).

    .venv/bin/python -m bench.economy --jobs 2          # every arm x seeds 0 1 2 -> BENCHMARKS.md
    .venv/bin/python -m bench.economy --arms plain seed   # two arms, one job at a time
    .venv/bin/python -m bench.economy --report-only         # the report from the saved results
    .venv/bin/python -m bench.economy --quick --out /tmp/q  # tiny world, 2 arms, 1 seed, < 90 s

Arms (`ARMS`, arms.py): `plain` = plain(params.yaml ppo), every feature switch off; `seed` =
params.yaml's ppo section as the ppo stage runs it (stratified batches from the difficulty table);
`grpo` and `rloo` = current TRL's trainers on the same SFT policy, light RM, prompts, sampling and
budget (peers.py). A rollout-economy feature becomes an arm by adding one line to arms.py: its
PPOConfig switches on top of `seed` (the feature alone) or of another arm.

Every arm x seed trains with the same budget: `--steps` PPO steps of `batch_size` rollouts and at
most `--tokens` generated tokens (default: steps x batch_size x max_new_tokens, the most `steps`
PPO steps can generate; the peers stop there, our trainer only at `--steps` until its config has
a token budget, and no comparison goes past it). Its saved checkpoints are scored by the gold judge on the held-out
prompts (pipeline/heldout_prompts.py) by `rlhf.pipeline.ppo.heldout_gold.gold_eval`, sampled as PPO
samples (`sampling_of`) with ppo.eval_seed for every policy, the SFT policy being the point at 0
tokens; curves are
interpolated on cumulative generated tokens. Each arm x seed is one subprocess with one torch
thread (RLHF_TORCH_THREADS=1) whose result lands in <out>/results/<arm>/seed<k>.json, so arms run
one at a time and a rerun skips what is there (unless --force) as long as the inputs (hashes of
the SFT policy, the light RM and the prompts) and the budget are unchanged.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .arms import ARMS, BASELINE, EVAL_POINTS, QUICK_POINTS
from .dvc_stages import BENCH, bench_params
from .job import run_job
from .prepare import prepare
from .results import REPO, load_result, result_path, spec_of

# seconds per PPO step (16 rollouts), per generation batch of a peer and per gold evaluation
# (211 prompts), measured on the embedded default on 2 shared cores, one thread a job (plain
# 2.8 s/step, seed 2.7, GRPO 1.5 with TRL's cached generation, eval 7.5 s); a projection uses
# the saved results' own timings where there are any
DEFAULT_SECONDS = {"ppo_step": 2.8, "peer_step": 1.5, "eval": 7.5, "startup": 15.0}


def projected_seconds(setup: dict, out: Path, jobs: list[tuple[str, int | None]]) -> float:
    total = 0.0
    for arm_name, seed in jobs:
        if arm_name == "sft":
            total += DEFAULT_SECONDS["startup"] + DEFAULT_SECONDS["eval"]
            continue
        done = [r for r in (load_result(p, spec_of(setup, arm_name))
                            for p in (out / "results" / arm_name).glob("seed*.json")) if r]
        if done:
            total += sum(d["seconds_train"] + d["seconds_eval"] for d in done) / len(done)
            total += DEFAULT_SECONDS["startup"]
            continue
        kind = "ppo_step" if ARMS[arm_name].trainer == "ppo" else "peer_step"
        scale = 0.05 if setup["quick"] else 1.0
        total += (DEFAULT_SECONDS["startup"] + scale * (
            setup["steps"] * DEFAULT_SECONDS[kind]
            + (setup["points"] + 1) * DEFAULT_SECONDS["eval"]))
    return total


def drive(args, setup: dict) -> list[str]:
    """Run the missing jobs, `args.jobs` subprocesses at a time; returns the failures."""
    from concurrent.futures import ThreadPoolExecutor

    todo = []
    for arm_name, seed in [("sft", None)] + [(a, s) for a in args.arms for s in args.seeds]:
        spec = spec_of(setup, arm_name)
        if args.force and arm_name != "sft" or load_result(
                result_path(args.out, arm_name, seed), spec) is None:
            todo.append((arm_name, seed))
    est = projected_seconds(setup, args.out, todo)
    print(f"economy: {len(todo)} job(s) to run ({', '.join(f'{a}:{s}' for a, s in todo) or '-'});"
          f" projected {est / 60:.1f} min of one core, ~{est / 60 / max(1, args.jobs):.1f} min "
          f"with --jobs {args.jobs}", flush=True)
    if args.dry_run:
        return []
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)

    def launch(job):
        arm_name, seed = job
        log = logs / f"{arm_name}-{seed}.log"
        cmd = [sys.executable, "-m", "bench.economy", "--out", str(args.out),
               "--job", arm_name, str(-1 if seed is None else seed)]
        t = time.perf_counter()
        with open(log, "w") as fh:
            rc = subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT,
                                 env={**os.environ, "ECONOMY_COMMAND": args.command})
        print(f"economy: {arm_name} seed {seed}: {'ok' if rc == 0 else f'FAILED rc={rc} ({log})'}"
              f" in {time.perf_counter() - t:.0f} s", flush=True)
        return None if rc == 0 else f"{arm_name}:{seed}"

    first = [j for j in todo if j[0] == "sft"]
    failed = [f for f in map(launch, first) if f]
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        failed += [f for f in pool.map(launch, [j for j in todo if j[0] != "sft"]) if f]
    return failed


def dvc_stage(what: list[str]) -> int:
    """One stage of bench/dvc.yaml, run from bench/ (paths repository-relative, so a clone
    elsewhere hashes the same setup)."""
    bp = bench_params()
    os.chdir(BENCH)
    args = argparse.Namespace(
        artifacts=Path("../artifacts"), params=Path("../params.yaml"), quick=False,
        judge_model=None, steps=bp["steps"] or None, tokens=bp["tokens"] or None,
        points=bp["points"], out=Path("."), setup_path=Path("results/setup.json"))
    stage = what[0]
    if stage == "setup":
        prepare(args, snapshot=False)
        return 0
    setup = json.loads(args.setup_path.read_text())
    if stage in ("report", "report_all"):
        from .report import write_report

        arms = bp["headline"] if stage == "report" else list(ARMS)
        unknown = sorted(set(arms) - set(ARMS))
        if unknown:
            raise SystemExit(f"bench/params.yaml headline: unknown arm(s) {', '.join(unknown)}")
        report = Path("../BENCHMARKS.md") if stage == "report" else Path("BENCHMARKS_ALL.md")
        command = "make bench" if stage == "report" else "make bench-all"
        write_report(setup, Path("."), report, arms, BASELINE, command, ARMS,
                     seeds=bp["seeds"], figures=Path("figures") / report.stem.lower(),
                     timing=bp.get("timing", "none"))
        print(f"economy: wrote {report} from {len(arms)} arm(s) x seeds {bp['seeds']}")
        return 0
    from rlhf.pipeline.models.policy import quiet_hf

    quiet_hf()
    if stage == "sft":
        run_job(setup, Path("."), "sft", None)
    elif stage in ARMS and len(what) == 2:
        run_job(setup, Path("."), stage, int(what[1]))
    else:
        raise SystemExit(f"unknown stage {' '.join(what)!r}: setup | sft | ARM SEED | report | "
                         "report_all")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.economy",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--artifacts", type=Path, default=Path("artifacts"))
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--out", type=Path, default=None,
                    help="results folder (default artifacts/bench/economy)")
    ap.add_argument("--report", type=Path, default=None,
                    help="the report (default BENCHMARKS.md; <out>/BENCHMARKS.md with --quick)")
    ap.add_argument("--judge-model", type=Path, default=None,
                    help="the judge's RM folder (params.yaml judge.kind heldout_rm: what `rlhf "
                         "judge` wrote; kind rm: overrides judge.model)")
    ap.add_argument("--arms", nargs="+", default=None, choices=list(ARMS))
    ap.add_argument("--seeds", nargs="+", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None,
                    help="PPO steps per run (default 2 x params.yaml ppo.total_steps)")
    ap.add_argument("--tokens", type=int, default=None,
                    help="generated-token budget per run (default steps x batch x max_new_tokens)")
    ap.add_argument("--points", type=int, default=None,
                    help=f"gold checkpoints a run (default {EVAL_POINTS}; --quick {QUICK_POINTS})")
    ap.add_argument("--jobs", type=int, default=1, help="arm x seed jobs in parallel")
    ap.add_argument("--force", action="store_true", help="rerun jobs that have results")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the jobs and the projected time, run nothing")
    ap.add_argument("--quick", action="store_true", help="tiny world, plain + seed, seed 0")
    ap.add_argument("--job", nargs=2, metavar=("ARM", "SEED"), help=argparse.SUPPRESS)
    ap.add_argument("--dvc", nargs="+", metavar="STAGE",
                    help="one bench/dvc.yaml stage: setup | sft | ARM SEED | report | report_all")
    args = ap.parse_args(argv)
    if args.dvc:
        return dvc_stage(args.dvc)
    args.out = args.out or (args.artifacts / "bench" / "economy")
    args.points = args.points or (QUICK_POINTS if args.quick else EVAL_POINTS)
    if args.job:  # one arm x seed, in its own process (what drive() launches)
        from rlhf.pipeline.models.policy import quiet_hf

        quiet_hf()  # one torch thread (RLHF_TORCH_THREADS): 2 threads on 2 busy cores crawl
        setup = json.loads((args.out / "setup.json").read_text())
        seed = int(args.job[1])
        run_job(setup, args.out, args.job[0], None if seed < 0 else seed)
        return 0
    args.arms = args.arms or (["plain", "seed"] if args.quick else list(ARMS))
    args.seeds = args.seeds if args.seeds is not None else ([0] if args.quick else [0, 1, 2])
    args.report = (args.report or (args.out / "BENCHMARKS.md" if args.quick
                                   else REPO / "BENCHMARKS.md")).resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    args.command = "python -m bench.economy " + " ".join(sys.argv[1:] if argv is None else argv)
    t = time.perf_counter()
    failed: list[str] = []
    if args.report_only:
        setup = json.loads((args.out / "setup.json").read_text())
    else:
        setup = prepare(args)
        failed = drive(args, setup)
        if args.dry_run:
            return 0
    from .report import write_report

    write_report(setup, args.out, args.report, list(ARMS), BASELINE, args.command, ARMS)
    print(f"economy: report {args.report} ({time.perf_counter() - t:.0f} s)"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0

