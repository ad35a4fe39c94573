"""A job's saved result: the spec it must share with the current setup to be reused, where it
lives, and its provenance (the commit and the files the job ran).

    .venv/bin/python -m bench.economy --report-only   # reads the saved results
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from .arms import ARMS, Arm, reads
from .prepare import WORLD_JUDGE

REPO = Path(__file__).resolve().parents[2]


def base_of(setup: dict, arm: Arm):
    """The PPOConfig `arm` starts from, before arm_config: plain(ppo) for arms based on plain
    PPO, the ppo section as it is for the seed's. From setup.json's `base_config` where it holds
    one (the snapshot runs), else read from the params file (the DVC stages, whose params
    declare exactly the keys this takes from it)."""
    from rlhf.pipeline.config import load_section
    from rlhf.pipeline.ppo.config import PPOConfig, plain

    base = (PPOConfig(**setup["base_config"]) if "base_config" in setup
            else load_section(Path(setup["params"]), "ppo"))
    return plain(base) if arm.base == "plain" else base


def spec_of(setup: dict, arm_name: str) -> dict:
    """What a saved result must share with the current setup to be reused."""
    if arm_name == "sft":
        return {"hashes": setup["hashes"], "eval": setup["eval"], "judge": judge_spec(setup)}
    spec = {"arm": asdict(ARMS[arm_name]), "steps": setup["steps"], "points": setup["points"],
            "token_budget": setup["token_budget"], "hashes": setup["hashes"],
            "eval": setup["eval"], "base_config": json.loads(json.dumps(asdict(base_of(setup, ARMS[arm_name])))),
            "judge": judge_spec(setup)}
    used = {k: v for k, v in setup.get("feature_hashes", {}).items()
            if reads(ARMS[arm_name], k)}
    if used:
        spec["feature_hashes"] = used
    return spec


def judge_spec(setup: dict) -> dict:
    """Who gives the verdict (params.yaml `judge:`, pipeline/models/judges.py): its kind, its name and
    the hash of its model folder, so results of two judges never mix."""
    return setup.get("judge", {}).get("spec", WORLD_JUDGE)


def result_path(out: Path, arm: str, seed: int | None) -> Path:
    return out / "results" / ("sft.json" if arm == "sft" else f"{arm}/seed{seed}.json")


def spec_matches(saved: dict | None, spec: dict) -> bool:
    """Whether a saved result's spec is the current one. A PPOConfig field that did not exist
    when the result was saved counts as its dataclass default: a new feature switch defaults to
    off (the behaviour the saved run had), so adding one does not invalidate every result; a
    result saved before the judge was recorded was judged by the world's gold judge."""
    if not saved:
        return False
    saved = {"judge": WORLD_JUDGE, **saved}  # saved before the judge was a choice: the world's
    if {k: v for k, v in saved.items() if k != "base_config"} != {
            k: v for k, v in spec.items() if k != "base_config"}:
        return False
    from dataclasses import fields

    from rlhf.pipeline.ppo.config import PPOConfig

    defaults = {f.name: f.default for f in fields(PPOConfig)}
    old, new = saved.get("base_config", {}), spec.get("base_config", {})
    return all(old.get(k, defaults.get(k)) == new.get(k, defaults.get(k))
               for k in set(old) | set(new))


def load_result(path: Path, spec: dict) -> dict | None:
    if not path.exists():
        return None
    res = json.loads(path.read_text())
    return res if spec_matches(res.get("spec"), spec) else None


def code_version() -> str:
    """The checkout's commit, `+dirty` when tracked files differ from it."""
    def git(*a):
        return subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True,
                              check=False).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def provenance(paths: list[str]) -> dict:
    """What a result was made by: the commit, the git object id of each file it ran (as it was
    on disk) and the files that differed from the commit (a dirty tree, as far as this job's
    code goes; the DVC lock files and the reports a stage writes do not count)."""
    def git(*a):
        return subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True,
                              check=False).stdout.split()

    head = (git("rev-parse", "HEAD") or ["unknown"])[0]
    # a folder an arm runs (pipeline/decode/) counts as its tracked files: a folder itself has
    # no blob id, so comparing it with the commit's tree id would call every tree dirty
    paths = [f for p in paths for f in (git("ls-files", "--", p) if (REPO / p).is_dir() else [p])]
    on_disk = [p for p in paths if (REPO / p).is_file()]
    ids = dict(zip(on_disk, git("hash-object", "--", *on_disk))) if on_disk else {}
    committed = committed_ids(paths)
    return {"commit": head, "deps": {p: ids.get(p) for p in paths},
            "dirty": sorted(p for p in paths if ids.get(p) != committed.get(p))}


def committed_ids(paths: list[str], commit: str = "HEAD") -> dict[str, str]:
    """{path: git object id at `commit`} of those of `paths` the commit has."""
    if not paths:
        return {}
    proc = subprocess.run(["git", "ls-tree", commit, "--", *paths], cwd=REPO,
                          capture_output=True, text=True, check=False)
    out = {}
    for line in proc.stdout.splitlines():
        meta, path = line.split("\t", 1)
        out[path] = meta.split()[2]
    return out


def job_code(setup: dict, arm: str) -> list[str]:
    """The repository files a job runs (bench/economy/dvc_stages.py: the DVC stage's code deps)."""
    from . import dvc_stages

    if arm == "sft":
        return sorted(dvc_stages.SHARED_CODE)
    return dvc_stages.arm_code(arm, base_of(setup, ARMS[arm]))


def save_result(out: Path, arm: str, seed: int | None, res: dict, setup: dict | None = None) -> dict:
    res["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    res["code"] = code_version()
    if setup is not None:
        res["provenance"] = provenance(job_code(setup, arm))
    res["command"] = os.environ.get("ECONOMY_COMMAND", "")
    path = result_path(out, arm, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(res, indent=1))
    tmp.replace(path)
    return res

