"""The benchmark as a DVC pipeline: bench/dvc.yaml is generated here from the arms, never typed.

One stage per arm whose `matrix` runs it once per seed (`arm_<name>@<seed>`); its deps are
exactly the code that arm runs, the params it reads and the pipeline artifacts it starts from, so
touching one feature's module makes exactly the arms that switch that feature on stale and the
rest come from DVC's cache. Besides the arms: `setup` (what every job shares), `sft` (the SFT
policy's gold, the point at 0 tokens) and two reports, `report` (the headline arms, writes
BENCHMARKS.md) and `report_all` (every arm, bench/BENCHMARKS_ALL.md).

    .venv/bin/python -m bench.economy.dvc_stages            # rewrites bench/dvc.yaml
    .venv/bin/python -m bench.economy.dvc_stages --check    # exit 1 when bench/dvc.yaml is stale
    .venv/bin/python -m bench.economy.dvc_stages --run headline --jobs 2   # what `make bench` runs

DVC runs one stage at a time in a workspace (its repository lock), so on 2 cores a plain
`dvc repro` leaves one idle. `--run` reproduces `setup` and `sft` with DVC, asks `dvc status`
which arm x seed items are stale, runs exactly those items' own commands `--jobs` at a time, has
DVC record each finished item (`dvc commit`, one at a time: deps hashed as they are now, which the
driver checks are the ones it started from) and reproduces the report with DVC. The lock it
leaves is the one `dvc repro` would have left; a second run finds nothing stale and runs nothing.

Paths here are repository paths; the stage file names them from bench/ (`../pipeline/...`).
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .arms import ARMS, arm_config, reads
from .prepare import SETUP_PPO_KEYS

BENCH = Path(__file__).resolve().parents[1]
REPO = BENCH.parent

DVC_YAML = BENCH / "dvc.yaml"
BENCH_PARAMS = "params.yaml"  # bench/params.yaml: the budget, the seeds, the headline arms
A = "artifacts"
# the pipeline artifacts every job starts from (root dvc.yaml's outs)
COMMON_ARTIFACTS = (f"{A}/models/sft", f"{A}/models/rm_light", f"{A}/store/pool",
                    f"{A}/store/similar", f"{A}/store/difficulty")
# a feature input (arms.SETUP_KEY key) -> the artifact it is read from
INPUT_ARTIFACTS = {"pool_embeddings": f"{A}/store/pool_embeddings",
                   "rm_strong": f"{A}/models/rm_strong",  # with its score_map.json
                   "score_map": f"{A}/models/rm_strong", "routes": f"{A}/store/routes"}
# the package's modules every job runs (the driver's: arms, prepare, results, job, driver)
DRIVER_CODE = tuple(f"bench/economy/{m}.py" for m in (
    "__init__", "__main__", "driver", "arms", "prepare", "results", "job"))
# code every job runs (held-out gold, the store, the policy and RM loaders, the prompts, the setup)
SHARED_CODE = (*DRIVER_CODE, "pipeline/config.py", "pipeline/models/lora.py",
               "pipeline/models/policy.py", "pipeline/decode", "pipeline/models/text.py",
               "pipeline/heldout_prompts.py", "pipeline/models/judges.py", "pipeline/world/judge.py", "pipeline/reward/scorer.py",
               "pipeline/reward/confidence.py", "pipeline/models/scoring.py",
               "pipeline/models/code_rewards.py", "pipeline/samplers.py", "store/schemas.py",
               "store/io.py", "store/hashing.py", "store/rollouts.py")
# what the TRL peers run of ours besides SHARED_CODE
PEER_CODE = ("bench/economy/peers.py", "pipeline/ppo/accounting.py", "pipeline/ppo/config.py",
             "pipeline/ppo/schedules.py", "pipeline/ppo/heldout_gold.py", "pipeline/ppo/generate.py",
             "pipeline/ppo/core.py", "pipeline/ppo/rollout.py")
# the code of each feature, by the PPOConfig switches that turn it on. A module listed here is
# that feature's alone unless our trainer's own loop imports it for plain PPO too (SHARED_PPO).
FEATURE_MODULES: dict[tuple[str, ...], tuple[str, ...]] = {
    ("prune_on", "resample_on"): ("pipeline/ppo/features/sample_economy.py", "bench/economy/sample.py"),
    ("schedule_on",): ("pipeline/ppo/features/prompt_scheduler.py", "pipeline/dedup.py",
                       "bench/economy/schedule.py"),
    ("escalate_below", "escalate_score_quantile", "escalate_high_risk", "escalate_uncertain",
     "human_labels_per_step", "route_budget_on"): (
        "pipeline/ppo/features/tiers.py", "pipeline/reward/score_map.py", "pipeline/world/annotators.py",
        "pipeline/preferences", "pipeline/route.py", "bench/economy/tiers.py"),
    ("rm_evolve_on", "rm_gate_mask_on"): (
        "pipeline/ppo/features/rm_evolution.py", "pipeline/reward/onpolicy.py",
        "pipeline/reward/distill.py", "pipeline/reward/score_map.py", "bench/economy/tiers.py"),
    ("stratified",): ("pipeline/difficulty.py",),
}
# modules a feature names that plain PPO's loop runs as well: every ppo arm depends on them
# (update.py: the Learner every PPO step runs, though the schedule features name it too)
SHARED_PPO = ("pipeline/ppo/schedules.py", "pipeline/ppo/diagnostics.py",
              "pipeline/ppo/critic.py", "pipeline/ppo/generate.py", "pipeline/ppo/update.py")
REPORT_CODE = (*DRIVER_CODE, "bench/economy/report.py", "bench/economy/figures.py",
               "bench/economy/stats.py",
               "bench/economy/sample.py", "bench/economy/schedule.py", "bench/economy/tiers.py")


def _on(value) -> bool:
    return value not in (None, False, 0, 0.0, "none", "")


def feature_modules() -> set[str]:
    """Every module some feature owns (the feature registry's, when it declares `modules`,
    plus the bench-side ones; else FEATURE_MODULES), less what every arm runs anyway."""
    reg = _registry()
    mods = {m for ms in FEATURE_MODULES.values() for m in ms
            if reg is None or m.startswith("bench/") or m == "pipeline/difficulty.py"}
    if reg is not None:
        mods |= {m for f in reg.FEATURES.values() for m in f.modules}
    return {m for m in mods if (REPO / m).exists()} - set(SHARED_PPO) - set(SHARED_CODE)


def uses(module: str, arm_name: str, base_cfg) -> bool:
    """Whether `arm_name` switches on a feature that owns `module` (the registry's `on` rule
    where the checkout has a registry, else FEATURE_MODULES' switches)."""

    arm = ARMS[arm_name]
    if arm.trainer != "ppo":
        return False
    on = arm_switches(arm_name, base_cfg)
    local = any(_on(on.get(s)) for sw, mods in FEATURE_MODULES.items() if module in mods
                for s in sw)
    reg = _registry()
    if reg is None:
        return local
    cfg = arm_config(base_cfg, arm, seed=0, steps=2, points=1, tokens=1)
    bench_side = module.startswith("bench/") or module == "pipeline/difficulty.py"
    return (local and bench_side) or any(f.on(cfg) for f in reg.FEATURES.values()
                                         if module in f.modules)


def _registry():
    """The feature registry (pipeline/ppo/features) when this checkout has one, else None."""
    try:
        from rlhf.pipeline.ppo.features import registry
    except ImportError:
        return None
    return registry if any(f.modules for f in registry.FEATURES.values()) else None


def arm_switches(arm_name: str, base_cfg) -> dict:
    """{switch: value} an arm turns on against plain PPO (its config, as it trains)."""
    from rlhf.pipeline.ppo.config import features_on

    arm = ARMS[arm_name]
    if arm.trainer != "ppo":
        return {}
    cfg = arm_config(base_cfg, arm, seed=0, steps=2, points=1, tokens=1)
    return {**features_on(cfg), **({"stratified": True} if arm.stratified else {})}


def arm_code(arm_name: str, base_cfg) -> list[str]:
    """The repository files an arm runs: shared code, the trainer's (ours: every pipeline/ppo
    module that is no feature's alone; a peer: peers.py and what it imports of ours) and
    the modules of the features it switches on."""

    arm = ARMS[arm_name]
    code = set(SHARED_CODE)
    if arm.trainer != "ppo":
        return sorted(code | set(PEER_CODE))
    owned = feature_modules()
    core = {str(p.relative_to(REPO)) for p in (REPO / "pipeline" / "ppo").rglob("*.py")}
    code |= (core - owned) | set(SHARED_PPO)
    on = arm_switches(arm_name, base_cfg)
    reg = _registry()
    if reg is not None:
        cfg = arm_config(base_cfg, arm, seed=0, steps=2, points=1, tokens=1)
        code |= {m for f in reg.on(cfg) for m in f.modules}
    for switches, mods in FEATURE_MODULES.items():
        if any(_on(on.get(s)) for s in switches):
            code |= {m for m in mods if reg is None or m.startswith("bench/")
                     or m == "pipeline/difficulty.py"}
    return sorted(p for p in code if (REPO / p).exists())


def arm_artifacts(arm_name: str) -> list[str]:

    arm = ARMS[arm_name]
    extra = {INPUT_ARTIFACTS[k] for k in INPUT_ARTIFACTS if reads(arm, k)}
    if arm.trainer == "ppo" and arm.overrides.get("schedule_on"):
        extra.add(INPUT_ARTIFACTS["pool_embeddings"])
    return sorted(set(COMMON_ARTIFACTS) | extra)


def arm_params(arm_name: str, base_cfg, params: Path = REPO / "params.yaml") -> dict[str, list[str]]:
    """{params file (repository path): keys} an arm reads."""

    arm = ARMS[arm_name]
    root = [*arm_ppo_keys(arm_name, params), "judge"]
    cfg = arm_config(base_cfg, arm, seed=0, steps=2, points=1, tokens=1)
    if arm.trainer == "ppo" and (cfg.human_labels_per_step or (
            cfg.rm_evolve_on and cfg.rm_label_source == "annotators")):
        root.append("preferences")  # the human queue's annotator pool
    return {"params.yaml": root,
            f"bench/{BENCH_PARAMS}": ["economy.steps", "economy.tokens", "economy.points"]}


# the PPOConfig fields arm_config sets itself, whatever params.yaml says
ARM_SET = ("seed", "total_steps", "checkpoint_every", "total_tokens")


def arm_ppo_keys(arm_name: str, params: Path = REPO / "params.yaml") -> list[str]:
    """The `ppo.<key>`s of params.yaml an arm's run takes its value from: every key of the
    section but those arm_config sets, the arm's own overrides and, for an arm based on plain
    PPO, the feature switches plain() resets. So changing a seed switch's default (or the
    critic's, or the engine's) stales the seed-based arms alone, never plain PPO's."""
    import yaml
    from rlhf.pipeline.ppo.features.registry import plain_values

    arm = ARMS[arm_name]
    section = yaml.safe_load(params.read_text()).get("ppo") or {}
    fixed = set(ARM_SET) | set(arm.overrides)
    if arm.base == "plain":
        fixed |= set(plain_values())
    return [f"ppo.{k}" for k in section if k not in fixed]


def bench_params(path: Path = BENCH / BENCH_PARAMS) -> dict:
    """bench/params.yaml's `economy:` section."""
    import yaml

    return yaml.safe_load(path.read_text())["economy"]


def _rel(path: str) -> str:
    """A repository path as bench/dvc.yaml names it (from bench/)."""
    return path[len("bench/"):] if path.startswith("bench/") else "../" + path


def stages(params: Path = REPO / "params.yaml") -> dict:
    """bench/dvc.yaml's `stages:` mapping."""
    from rlhf.pipeline.config import load_section

    base = load_section(params, "ppo")
    results = "results"
    setup_json = f"{results}/setup.json"
    budget_keys = {BENCH_PARAMS: ["economy.steps", "economy.tokens", "economy.points"]}
    out: dict = {"setup": {
        "cmd": "cd .. && python -m bench.economy --dvc setup",
        "deps": [_rel(p) for p in (*COMMON_ARTIFACTS, *SHARED_CODE)],
        "params": [{"../params.yaml": [*(f"ppo.{k}" for k in SETUP_PPO_KEYS),
                                       "judge"]}, budget_keys],
        "outs": [setup_json]}}
    out["sft"] = {"cmd": "cd .. && python -m bench.economy --dvc sft",
                  "deps": [setup_json, *(_rel(p) for p in (*COMMON_ARTIFACTS, *SHARED_CODE))],
                  "outs": [f"{results}/sft.json"]}
    for name in ARMS:
        ps = arm_params(name, base, params)
        out[f"arm_{name}"] = {
            "matrix": {"seed": list(bench_params()["seeds"])},
            "cmd": f"cd .. && python -m bench.economy --dvc {name} ${{item.seed}}",
            "deps": [setup_json, *(_rel(p) for p in arm_artifacts(name)),
                     *(_rel(p) for p in arm_code(name, base))],
            "params": [{"../" + f if not f.startswith("bench/") else f[len("bench/"):]: keys}
                       for f, keys in ps.items()],
            "outs": [f"{results}/{name}/seed${{item.seed}}.json"]}
    bp = bench_params()
    for stage, arms, report in (("report", bp["headline"], "../BENCHMARKS.md"),
                                ("report_all", list(ARMS), "BENCHMARKS_ALL.md")):
        out[stage] = {
            "cmd": f"cd .. && python -m bench.economy --dvc {stage}",
            "deps": [setup_json, f"{results}/sft.json",
                     *(f"{results}/{a}/seed{s}.json" for a in arms for s in bp["seeds"]),
                     *(_rel(p) for p in REPORT_CODE)],
            # the whole ppo section: every arm's spec (results.spec_of) is read from it
            "params": [{"../params.yaml": ["ppo"]},
                       {BENCH_PARAMS: ["economy.headline", "economy.seeds", "economy.timing"]}],
            "outs": [{report: {"cache": False}},
                     {f"figures/{Path(report).stem.lower()}": {"cache": False}}]}
    return out


HEADER = """\
# The rollout-economy benchmark as a DVC pipeline (docs/benchmarks.md). GENERATED by
# bench/economy/dvc_stages.py from bench/economy/arms.py: rerun it, never edit by hand.
#   make bench        the headline arms (bench/params.yaml economy.headline) x economy.seeds
#   make bench-all    every arm
# One stage per arm, run once per seed (matrix); its deps are the code it runs, the params it
# reads and the artifacts it starts from, so a change reruns only the arms it touches.
"""


def render(params: Path = REPO / "params.yaml") -> str:
    import yaml

    return HEADER + yaml.safe_dump({"stages": stages(params)}, sort_keys=False, width=100)


def targets(which: str) -> list[str]:
    """The bench stages `make bench` / `make bench-all` reproduce, upstream first. They run
    one by one (`dvc repro --single-item`): the pipeline's own stages are never rebuilt from
    here (`make bench` refuses to start while `dvc status dvc.yaml` reports a change)."""

    arms = bench_params()["headline"] if which == "headline" else list(ARMS)
    report = "report" if which == "headline" else "report_all"
    return [f"bench/dvc.yaml:{s}" for s in ("setup", "sft", *(f"arm_{a}" for a in arms),
                                            report)]


def _dvc() -> str:
    here = Path(sys.executable).parent / "dvc"
    return str(here) if here.exists() else (shutil.which("dvc") or "dvc")


def stale_items(items: list[str]) -> list[str]:
    """Those of the `bench/dvc.yaml:arm_<name>@<seed>` items `dvc status` reports changed (a
    changed dep or param, or a missing out)."""
    if not items:
        return []
    proc = subprocess.run([_dvc(), "status", "--json", *items], cwd=REPO, capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"dvc status failed: {proc.stderr.strip() or proc.stdout.strip()}")
    changed = json.loads(proc.stdout or "{}")
    return [i for i in items if i in changed]


def _code_state(paths: list[str]) -> str:
    """git's view of `paths` on disk (object ids): what a job ran, to compare after it."""
    on_disk = [p for p in paths if (REPO / p).is_file()]
    return subprocess.run(["git", "hash-object", "--", *on_disk], cwd=REPO, capture_output=True,
                          text=True, check=False).stdout


def item_code(item: str) -> list[str]:
    """The repository files (code and params) an `arm_<name>@<seed>` item depends on, a code
    folder's (pipeline/decode) listed file by file as DVC hashes them (.dvcignore: no byte-code)."""
    stage = yaml_stages()[item.split(":", 1)[1].split("@")[0]]
    files = [d for d in stage["deps"] if not d.startswith(("results/", "../artifacts/"))]
    files += [f for p in stage["params"] for f in p]
    paths = {(BENCH / f).resolve() for f in files}
    paths = {q for p in paths for q in (sorted(p.rglob("*")) if p.is_dir() else [p])
             if not (q.is_dir() or "__pycache__" in q.parts or q.suffix == ".pyc")}
    return sorted(str(p.relative_to(REPO)) for p in paths)


@functools.cache
def yaml_stages() -> dict:
    """bench/dvc.yaml's stages as DVC reads them (parsed once a process)."""
    import yaml

    return yaml.safe_load(DVC_YAML.read_text())["stages"]


def run(which: str, jobs: int) -> int:
    """`make bench` / `make bench-all`: the stale stages of `targets(which)`, arm x seed items
    `jobs` at a time (module docstring)."""

    bp = bench_params()
    arms = bp["headline"] if which == "headline" else list(ARMS)
    tg = targets(which)
    dvc = _dvc()
    if subprocess.call([dvc, "repro", "--single-item", *tg[:2]], cwd=REPO) != 0:
        return 1
    items = [f"bench/dvc.yaml:arm_{a}@{s}" for a in arms for s in bp["seeds"]]
    todo = stale_items(items)
    if not todo:
        print(f"bench: every arm x seed ({len(items)}) is up to date in DVC's cache: nothing to run")
    else:
        print(f"bench: {len(todo)} of {len(items)} arm x seed items to run, {jobs} at a time: "
              + ", ".join(i.split(":arm_")[1] for i in todo), flush=True)
    logs = BENCH / "results" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()
    failed: list[str] = []

    def one(item: str) -> None:
        name, seed = item.split(":arm_")[1].split("@")
        code = item_code(item)
        before = _code_state(code)
        out = BENCH / "results" / name / f"seed{seed}.json"
        out.unlink(missing_ok=True)  # as dvc repro removes a stage's outs before its cmd
        t = time.perf_counter()
        with open(logs / f"{name}-{seed}.log", "w") as fh:
            rc = subprocess.call([sys.executable, "-m", "bench.economy", "--dvc", name, seed],
                                 cwd=REPO,
                                 stdout=fh, stderr=subprocess.STDOUT)
        why = f"rc={rc}, log bench/results/logs/{name}-{seed}.log"
        if rc == 0 and _code_state(code) != before:
            rc, why = 1, "its code or params changed while it ran, so it is not recorded"
        with lock:
            if rc == 0 and subprocess.call([dvc, "commit", "--force", "--quiet", item],
                                           cwd=REPO) != 0:
                rc, why = 1, "dvc commit failed"
            print(f"bench: {name} seed {seed}: " + ("ok" if rc == 0 else f"FAILED ({why})")
                  + f" in {time.perf_counter() - t:.0f} s", flush=True)
            if rc != 0:
                failed.append(item)

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        list(pool.map(one, todo))
    if failed:
        print(f"bench: {len(failed)} item(s) failed, the report is not written: "
              + ", ".join(failed))
        return 1
    return subprocess.call([dvc, "repro", "--single-item", tg[-1]], cwd=REPO)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.economy.dvc_stages",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when bench/dvc.yaml is stale")
    ap.add_argument("--targets", choices=("headline", "all"),
                    help="print the stages of `make bench` (headline) or `make bench-all`, in "
                         "order, as `dvc repro --single-item` takes them")
    ap.add_argument("--run", choices=("headline", "all"),
                    help="reproduce `make bench` (headline) or `make bench-all`: the stale arm x "
                         "seed items --jobs at a time, each recorded by dvc commit")
    ap.add_argument("--jobs", type=int, default=2, help="arm x seed items in parallel (--run)")
    args = ap.parse_args(argv)
    if args.run:
        return run(args.run, args.jobs)
    if args.targets:
        print(" ".join(targets(args.targets)))
        return 0
    text = render()
    if args.check:
        if not DVC_YAML.exists() or DVC_YAML.read_text() != text:
            print("bench/dvc.yaml is out of date: run `python -m bench.economy.dvc_stages`")
            return 1
        print("bench/dvc.yaml is up to date")
        return 0
    DVC_YAML.write_text(text)
    print(f"wrote {DVC_YAML.relative_to(REPO)} ({len(stages())} stages)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
