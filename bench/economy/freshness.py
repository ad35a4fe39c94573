"""Are the benchmark's results made from the pipeline's current artifacts? The inputs `make bench`
read (bench/dvc.lock: the `setup` stage's deps under ../artifacts, i.e. the SFT policy, the light
RM, the pool, ...) against the same paths' hashes in the root dvc.lock (what `make run` made).

    python -m bench.economy.freshness          # exit 1 and one line per stale input

A stale input means BENCHMARKS.md's figures were measured on other models than `make run`'s, and
tests/test_bench_freshness.py fails until `make bench` reruns. Both locks are read as git's index
holds them: `make run` on another CPU model rewrites dvc.lock in the working tree (other float
kernels, other hashes) and leaves it unstaged (.dvc/config: no autostage), so the suite stays
green there; a relock staged or committed without its `make bench` is stale.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
SETUP = "setup"  # the stage every arm reads its inputs through (bench/dvc.yaml)


def _outs(lock: dict) -> dict[str, str]:
    """{path: md5} of every output a dvc.lock records."""
    return {o["path"]: o.get("md5", "") for stage in lock.get("stages", {}).values()
            for o in stage.get("outs", [])}


def committed(path: Path) -> str | None:
    """`path` as the index of the git checkout it lies in holds it (what the commit claims; a
    `make run` on another CPU rewrites the working tree's dvc.lock, docs/reliability.md), else
    as on disk (not in a checkout, or untracked), else None."""
    path = Path(path).resolve()
    try:
        return subprocess.run(["git", "show", f":./{path.name}"], cwd=path.parent,
                              capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return path.read_text(encoding="utf-8") if path.is_file() else None


def stale_inputs(bench_lock: Path = REPO / "bench" / "dvc.lock",
                 root_lock: Path = REPO / "dvc.lock") -> list[str]:
    """One line per pipeline artifact whose hash in `bench_lock` (as the benchmark read it)
    differs from `root_lock`'s (as `make run` wrote it), both as committed; [] when every input
    is current. A bench lock without the setup stage has run nothing: every root artifact it
    reads is stale."""
    text = committed(bench_lock)
    bench = yaml.safe_load(text) if text else {}
    outs = _outs(yaml.safe_load(committed(root_lock) or "{}"))
    deps = (bench or {}).get("stages", {}).get(SETUP, {}).get("deps")
    if deps is None:
        return [f"{bench_lock.name}: no `{SETUP}` stage recorded (make bench has not run)"]
    stale = []
    for dep in deps:
        path = dep["path"].removeprefix("../")
        if path.startswith("artifacts/") and path in outs and dep.get("md5") != outs[path]:
            stale.append(f"{path}: bench read {dep.get('md5', '?')[:12]}, "
                         f"dvc.lock has {outs[path][:12]}")
    return stale


def main() -> int:
    stale = stale_inputs()
    for line in stale:
        print(line)
    if not stale:
        print("bench/dvc.lock read the artifacts dvc.lock records")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
