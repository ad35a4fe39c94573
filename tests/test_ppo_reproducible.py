"""A clean clone stays clean: `dvc repro` of a real `rlhf ppo` stage, forced to run again on the
same inputs under SOURCE_DATE_EPOCH (what `make run` sets), leaves dvc.lock byte for byte as it
was, with the repository's own .dvcignore; the same rerun on the real clock changes the store's
hashes (its rows carry the time), which is what the fixed clock is for (pipeline/ppo/wallclock.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

import ppo_tiny
from conftest import REPO
from rlhf.pipeline.ppo import wallclock
from rlhf.store.io import read_table

pytestmark = pytest.mark.slow
EPOCH = 1767225600  # 2026-01-01 00:00:00 UTC
OUTS = ("run", "rollouts", "rm_scores", "train_metrics", "checkpoints")


def _repro(root: Path, epoch: int | None) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", RLHF_TORCH_THREADS="1", PYTHONHASHSEED="0")
    env.pop(wallclock.ENV, None)
    if epoch is not None:
        env[wallclock.ENV] = str(epoch)
    dvc = str(Path(sys.executable).with_name("dvc"))
    res = subprocess.run([dvc, "repro", "--force"], cwd=root, env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]["ppo"]["outs"]
    return {o["path"]: o["md5"] for o in lock}


def test_a_forced_rerun_leaves_the_lock_as_it_was_under_a_fixed_clock(tmp_path):
    root = tmp_path / "project"
    world = ppo_tiny.build_world(root / "world", reward_stage=True)
    ppo_tiny.write_params(root / "params.yaml", total_steps=4, checkpoint_every=2,
                          escalate_below=0.6)
    rlhf = str(Path(sys.executable).with_name("rlhf"))
    rel = {k: v.relative_to(root) for k, v in world.items()}
    cmd = (f"{rlhf} ppo --policy {rel['policy']} --reward {rel['reward']} "
           f"--strong-reward {rel['strong_reward']} --prompts {rel['prompts']} "
           "--out run --rollouts rollouts --rm-scores rm_scores --train-metrics train_metrics "
           "--checkpoint-table checkpoints --params params.yaml --run-id run")
    (root / "dvc.yaml").write_text(yaml.safe_dump(
        {"stages": {"ppo": {"cmd": cmd, "deps": ["world"], "outs": list(OUTS)}}}))
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run([str(Path(sys.executable).with_name("dvc")), "init", "-q"], cwd=root,
                   check=True)
    shutil.copy(REPO / ".dvcignore", root / ".dvcignore")

    first = _repro(root, EPOCH)
    # the machine's figures are still written, beside what DVC hashes
    assert (root / "run" / "timings.jsonl").read_text().count("seconds_generate") == 4
    assert any((root / "run" / "tensorboard").iterdir())
    assert sorted(p.parent.name for p in (root / "run" / "checkpoints").glob("*/timings.json")) \
        == ["step-000002", "step-000004"]
    assert not any("seconds" in line for line in
                   (root / "run" / "metrics.jsonl").read_text().splitlines())
    summary = json.loads((root / "run" / "summary.json").read_text())
    assert not any(k.startswith("seconds") for k in {**summary["final"], **summary["cost"]})
    # the rows: the epoch plus their step, and no seconds in the versioned table
    t0 = datetime.fromtimestamp(EPOCH, UTC)
    rows = read_table("rollouts", root / "rollouts").to_pylist()
    assert rows and all(r["created_at"] == t0 + timedelta(seconds=r["step"]) for r in rows)
    tm = read_table("train_metrics", root / "train_metrics").to_pylist()
    assert tm and all(r["seconds_cum"] is None for r in tm)
    assert {r["logged_at"] for r in tm} == {t0 + timedelta(seconds=r["step"]) for r in tm}

    assert _repro(root, EPOCH) == first  # the same bytes: dvc.lock and git status stay clean

    # the wrong variant: the real clock stamps every row with the time of the run
    real = _repro(root, None)
    changed = {p for p in first if real[p] != first[p]}
    assert {"rollouts", "rm_scores", "train_metrics", "checkpoints"} <= changed, changed


def test_a_bad_epoch_is_one_clear_error(monkeypatch):
    from rlhf.pipeline.config import ConfigError

    monkeypatch.setenv(wallclock.ENV, "yesterday")
    with pytest.raises(ConfigError, match="SOURCE_DATE_EPOCH='yesterday'"):
        wallclock.stamp(3)
    monkeypatch.setenv(wallclock.ENV, "")
    assert wallclock.fixed_epoch() is None and wallclock.measured(1.5) == 1.5
    monkeypatch.setenv(wallclock.ENV, "0")
    assert wallclock.stamp(3) == datetime(1970, 1, 1, 0, 0, 3, tzinfo=UTC)
    assert wallclock.measured(1.5) is None
    assert wallclock.split({"step": 2, "seconds_update": 0.1, "gpu_peak_gib_generate": 1.0,
                            "reward_mean": 0.5}) == (
        {"step": 2, "reward_mean": 0.5},
        {"step": 2, "seconds_update": 0.1, "gpu_peak_gib_generate": 1.0})
