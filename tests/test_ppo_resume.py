"""Exact resume: a real `rlhf ppo` run killed with SIGKILL mid-way, then `--resume`, must give
the same metrics and rollout, RM-score and train-metric rows as an uninterrupted run (none
duplicated, none missing), with one process and with two under torchrun (gloo); and two
processes end with identical weights."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ppo_tiny
from rlhf.store.hashing import hex_key
from rlhf.store.io import read_table

pytestmark = pytest.mark.slow


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONHASHSEED="0")
    env.pop("WORLD_SIZE", None)
    return env


def _rlhf() -> str:
    exe = Path(sys.executable).with_name("rlhf")
    return str(exe) if exe.exists() else shutil.which("rlhf")


def _cmd(world, params, out, rollouts, *extra):
    return [_rlhf(), "ppo", "--policy", str(world["policy"]), "--reward", str(world["reward"]),
            "--prompts", str(world["prompts"]), "--out", str(out), "--rollouts", str(rollouts),
            "--params", str(params), "--run-id", "run", *extra]


def _rows(folder: Path, table: str = "rollouts") -> list[dict]:
    rows = read_table(table, folder).to_pylist()
    for r in rows:
        for stamp in ("created_at", "scored_at", "logged_at", "seconds_cum"):
            r.pop(stamp, None)  # wall-clock times, the fields that may differ
    return sorted(rows, key=lambda r: (r["step"], r.get("prompt_id") or "",
                                       r.get("response_hash") or "", r.get("response_key") or 0,
                                       r.get("rm_name") or ""))


def _metrics(out: Path) -> list[dict]:
    """Every metric of every step except wall times (seconds_*), which no two runs share."""
    return [{k: v for k, v in json.loads(x).items() if not k.startswith("seconds")}
            for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_sigkill_then_resume_equals_uninterrupted_run(tmp_path):
    # reward-stage RMs and a strong one: some rollouts escalate, so rm_scores has both kinds
    world = ppo_tiny.build_world(tmp_path / "world", reward_stage=True)
    params = ppo_tiny.write_params(tmp_path / "params.yaml", total_steps=6, checkpoint_every=2,
                                   escalate_below=0.6)

    def tables(name: str) -> list[str]:
        return ["--strong-reward", str(world["strong_reward"]),
                "--rm-scores", str(tmp_path / f"rm_{name}"),
                "--train-metrics", str(tmp_path / f"tm_{name}")]

    # the uninterrupted run: the same command in a fresh process, like the killed one. (It ran
    # in this process once; under pytest-xdist it then inherited whatever torch state the
    # worker's earlier test files left, and its policy-vs-reference KL at step 1 read 5e-8
    # where a fresh process reads 0.)
    a = subprocess.run(_cmd(world, params, tmp_path / "a", tmp_path / "rows_a", *tables("a")),
                       env=_env(), capture_output=True, text=True, timeout=300)
    assert a.returncode == 0, a.stderr[-3000:]

    out_b = tmp_path / "b"
    proc = subprocess.Popen(_cmd(world, params, out_b, tmp_path / "rows_b", *tables("b")),
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = out_b / "checkpoints" / "latest"
    deadline = time.monotonic() + 240
    while not latest.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (out_b / "summary.json").exists(), "the run finished before it was killed"
    killed_at = latest.read_text()
    assert killed_at in ("step-000002", "step-000004")

    res = subprocess.run(_cmd(world, params, out_b, tmp_path / "rows_b", *tables("b"), "--resume"),
                         env=_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert _metrics(out_b) == _metrics(tmp_path / "a")
    rows_a, rows_b = _rows(tmp_path / "rows_a"), _rows(tmp_path / "rows_b")
    assert len(rows_a) == 6 * 4
    assert rows_b == rows_a
    rm_a, rm_b = _rows(tmp_path / "rm_a", "rm_scores"), _rows(tmp_path / "rm_b", "rm_scores")
    escalated = sum(r["tier"] == 2 for r in rows_a)
    assert 0 < escalated < len(rows_a) and len(rm_a) == len(rows_a) + escalated
    assert rm_b == rm_a
    tm_a, tm_b = _rows(tmp_path / "tm_a", "train_metrics"), _rows(tmp_path / "tm_b", "train_metrics")
    assert [r["step"] for r in tm_a] == [2, 4, 6] and tm_b == tm_a
    assert (out_b / "weights-rank0.sha256").read_text() == \
        (tmp_path / "a" / "weights-rank0.sha256").read_text()
    csv_b = (out_b / "metrics.csv").read_text()
    assert csv_b == (tmp_path / "a" / "metrics.csv").read_text()
    assert [line.split(",")[0] for line in csv_b.splitlines()[1:]] == ["2", "4", "6"]


def test_resume_without_checkpoint_is_a_clean_error(tmp_path):
    world = ppo_tiny.build_world(tmp_path / "world")
    params = ppo_tiny.write_params(tmp_path / "params.yaml")
    out = subprocess.run(_cmd(world, params, tmp_path / "x", tmp_path / "r", "--resume"),
                         env=_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "no checkpoint" in out.stderr
    assert "Traceback" not in out.stderr
    bad = ppo_tiny.write_params(tmp_path / "bad.yaml", temperature=0.2)
    out = subprocess.run(_cmd(world, bad, tmp_path / "x", tmp_path / "r"), env=_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "ppo.temperature = 0.2: allowed > 0.3" in out.stderr
    assert "Traceback" not in out.stderr


def kill_at_first_checkpoint(cmd: list[str], out: Path, timeout: float = 300) -> str:
    """Start `cmd` in its own process group, SIGKILL the whole group (torchrun and every worker
    at once, as a lost node) as soon as its first checkpoint is written; the checkpoint's name."""
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    latest = out / "checkpoints" / "latest"
    deadline = time.monotonic() + timeout
    while not latest.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "summary.json").exists(), "the run finished before it was killed"
    return latest.read_text()


def _torchrun(world, params, out, rows, *extra) -> list[str]:
    torchrun = Path(sys.executable).with_name("torchrun")
    port = 29000 + (os.getpid() * 7 + len(str(out)) * 13 + int(time.monotonic() * 1000)) % 900
    return [str(torchrun), "--nproc_per_node", "2", "--master_port", str(port), "-m",
            "rlhf.cli.app", *_cmd(world, params, out, rows)[1:], *extra]


def test_sigkill_then_resume_under_torchrun_equals_uninterrupted_two_process_run(tmp_path):
    world = ppo_tiny.build_world(tmp_path / "world")
    params = ppo_tiny.write_params(tmp_path / "params.yaml", total_steps=4, batch_size=2,
                                   checkpoint_every=2)
    a = subprocess.run(_torchrun(world, params, tmp_path / "a", tmp_path / "rows_a"),
                       env=_env(), capture_output=True, text=True, timeout=300)
    assert a.returncode == 0, a.stderr[-3000:]

    out_b = tmp_path / "b"
    assert kill_at_first_checkpoint(_torchrun(world, params, out_b, tmp_path / "rows_b"),
                                    out_b) == "step-000002"

    res = subprocess.run(_torchrun(world, params, out_b, tmp_path / "rows_b", "--resume"),
                         env=_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert _metrics(out_b) == _metrics(tmp_path / "a")
    rows_a, rows_b = _rows(tmp_path / "rows_a"), _rows(tmp_path / "rows_b")
    assert len(rows_a) == 4 * 2 * 2  # steps x processes x batch per process
    assert rows_b == rows_a
    for rank in (0, 1):  # each process's weights equal the uninterrupted run's
        assert (out_b / f"weights-rank{rank}.sha256").read_text() == \
            (tmp_path / "a" / f"weights-rank{rank}.sha256").read_text()
    assert (out_b / "weights-rank0.sha256").read_text() == \
        (out_b / "weights-rank1.sha256").read_text()


def test_two_processes_under_torchrun_end_with_identical_weights(tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    world = ppo_tiny.build_world(tmp_path / "world", reward_stage=True)
    params = ppo_tiny.write_params(tmp_path / "params.yaml", total_steps=2, batch_size=2,
                                   checkpoint_every=2, escalate_below=0.6)
    cmd = [str(torchrun), "--nproc_per_node", "2", "--master_port", str(29500 + os.getpid() % 500),
           "-m", "rlhf.cli.app", *_cmd(world, params, tmp_path / "dp", tmp_path / "rows")[1:],
           "--strong-reward", str(world["strong_reward"]), "--rm-scores", str(tmp_path / "rm")]
    out = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    w0 = (tmp_path / "dp" / "weights-rank0.sha256").read_text()
    w1 = (tmp_path / "dp" / "weights-rank1.sha256").read_text()
    assert w0 == w1
    rows = read_table("rollouts", tmp_path / "rows").to_pylist()
    assert len(rows) == 2 * 2 * 2  # steps x processes x batch per process
    # both processes' RM scores, gathered into the main process's one writer
    scores = read_table("rm_scores", tmp_path / "rm").to_pylist()
    assert sorted((s["step"], hex_key(s["response_hash"])) for s in scores
                  if s["rm_name"] == "light_rm") == sorted((r["step"], r["response_key"]) for r in rows)
    assert sum(s["rm_name"] == "strong_rm" for s in scores) == sum(r["tier"] == 2 for r in rows)
    m = _metrics(tmp_path / "dp")
    assert [x["step"] for x in m] == [1, 2]  # logged once, by the main process
    initial = ppo_tiny.policy(ppo_tiny.tokenizer())
    from transformers import AutoModelForCausalLM

    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "dp" / "policy")
    assert any((a - b).abs().max() > 0 for a, b in zip(initial.state_dict().values(),
                                                       trained.state_dict().values()))
