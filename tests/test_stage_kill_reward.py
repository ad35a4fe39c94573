"""SIGKILL at random points of `rlhf reward`, then the same command again: after each kill the RM
folders and metrics file are absent or the uninterrupted run's, and the rerun ends with the
uninterrupted run's (the members inline, as in tests/test_stage_kill.py); then kills as soon as
a trained model is kept, with the members in 2 worker processes as `make run` trains them: the
workers die with the stage, the reruns load each kept model instead of training it again and end
with the inline run's bytes. The reward part of tests/test_stage_kill.py (its helpers), in a
file of its own because it takes as long as all the others together: `make test`'s workers (a
file each at a time) run the two files side by side.

    python -m pytest -q -n 0 tests/test_stage_kill_reward.py
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from params_file import write_params
from test_stage_kill import _env, _hidden, _kill_then_rerun, _metrics_equal, _rlhf, _run

pytestmark = pytest.mark.slow

# the tiny config of tests/test_reward_stage.py, with fewer epochs and prompts: what this test
# proves (nothing half-written visible, kept models loaded, the uninterrupted run's bytes) does
# not depend on how well the RMs learn, and the stage runs about eight times here
REWARD_PARAMS = {"reward": {
    "n_ensemble": 2,
    "train": {"epochs": 3, "learning_rate": 0.003, "batch_size": 16, "max_length": 64},
    "light": {"epochs": 3, "groups_per_batch": 8},
    "rollout_prompts": 12, "rollout_k": 3, "eval_prompts": 8, "eval_k": 2,
    # the side RM trains on the annotators' rankings here (the realdata profile's hh-rlhf pairs
    # in production), so a kill can land in it too
    "max_new_tokens": 16, "external_sources": ["annotator"], "external_epochs": 1.0},
    "ppo": {},  # the reward stage reads PPO's sampling settings
    "judge": {}}  # ... and its judge


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def test_reward_killed_at_random_points_then_rerun(tmp_path_factory, tmp_path):
    from rlhf.pipeline import preferences
    from tiny_world import ToyAnnotatorPool, toy_gold, trained_policy, write_pool

    _, sft = trained_policy(tmp_path_factory)
    pool = write_pool(tmp_path / "pool", n=160)
    pcfg = preferences.PreferencesConfig(k=4, max_new_tokens=16, heldout_fraction=0.3,
                                         annotators=preferences.AnnotatorConfig(
                                             n_annotators=3, drift_per_day=0.5, noise_std=0.0,
                                             labels_per_day=10))
    preferences.run(pcfg, sft, tmp_path / "prefs", pool_dir=pool,
                    world=(ToyAnnotatorPool, toy_gold))
    write_params(tmp_path / "params.yaml", **REWARD_PARAMS)
    cmd = [_rlhf(), "reward", "--preferences", str(tmp_path / "prefs"), "--sft", str(sft),
           "--pool", str(pool), "--out-strong", "models/rm_strong", "--out-light",
           "models/rm_light", "--params", str(tmp_path / "params.yaml"),
           "--metrics", "metrics/reward.json"]
    ref, work = tmp_path / "ref", tmp_path / "work"
    ref.mkdir()
    work.mkdir()
    seconds = _run(cmd, ref)
    want = {name: _files(ref / "models" / name) for name in ("rm_strong", "rm_light")}
    assert "member_1/model.safetensors" in want["rm_strong"]

    def visible() -> None:
        for name in ("rm_strong", "rm_light"):
            if (work / "models" / name).exists():
                assert _files(work / "models" / name) == want[name], name
        if (work / "metrics" / "reward.json").exists():
            _metrics_equal(work / "metrics" / "reward.json", ref / "metrics" / "reward.json")

    def started() -> bool:
        models = work / "models"
        return models.is_dir() and any(".staging-" in p.name for p in models.iterdir())

    _kill_then_rerun(cmd, seconds, work, started, visible, seed=19, first_delay=2.0, trials=2)
    for name in ("rm_strong", "rm_light"):
        assert _files(work / "models" / name) == want[name], name
    _metrics_equal(work / "metrics" / "reward.json", ref / "metrics" / "reward.json")

    # Kill as soon as a trained model is kept (a point the stage reports by its kept folder's
    # mark, not a moment): the first strong member, the light RM, the external side RM. The
    # rerun loads each model kept before the kill instead of training it again and ends with the
    # uninterrupted (inline) run's RM folders and metrics. In 2 worker processes, as `make run`.
    from rlhf.pipeline.reward.keep import MARK, checkpoints_of

    for kill_after, loaded, trained in [
            ("member_0", ["strong RM member 1/2: trained before the last run was stopped"],
             ["distilling the light RM", "training an RM on"]),
            ("external", ["strong RM member 2/2: trained before", "light RM: trained before",
                          "external side RM: trained before"], [])]:
        again = tmp_path / f"again_{kill_after}"
        again.mkdir()
        kept = checkpoints_of(again / "models" / "rm_strong")
        proc = subprocess.Popen(cmd, cwd=again, env=_env(workers=2), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 300
            while not (kept / kill_after / MARK).is_file():
                assert proc.poll() is None, f"the stage ended before {kill_after} was kept"
                assert time.monotonic() < deadline
                time.sleep(0.005)
            workers = _children(proc.pid)  # the members' worker processes (ensemble.py)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            _gone(workers)  # they die with the stage, not train on
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        assert not (again / "models" / "rm_strong").exists()  # nothing visible until both RMs are
        rerun = subprocess.run(cmd, cwd=again, env=_env(workers=2), capture_output=True, text=True,
                               timeout=600, check=False)
        assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-3000:]
        said = " ".join((rerun.stdout + rerun.stderr).split())  # the log, unwrapped
        for line in loaded:
            assert line in said, (kill_after, line)
        for line in trained:
            assert line in said, (kill_after, line)
        assert "training strong RM member 1/2" not in said
        # member 2 trained beside member 1 in a second process: kept before the kill, or not
        # (then the rerun trains it in a worker, beside the distillation rollouts)
        assert ("training strong RM members 2/2 in worker processes" in said
                or "strong RM member 2/2: trained before" in said), said[-2000:]
        assert not kept.exists() and _hidden(again) == []
        for name in ("rm_strong", "rm_light"):
            assert _files(again / "models" / name) == want[name], (kill_after, name)
        _metrics_equal(again / "metrics" / "reward.json", ref / "metrics" / "reward.json")


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _gone(pids: list[int], seconds: float = 20.0) -> None:
    """Wait until none of `pids` runs (zombies reaped by init count as gone)."""
    def running(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    deadline = time.monotonic() + seconds
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if running(p)]
    assert not alive, f"processes {alive} outlived the killed stage"


