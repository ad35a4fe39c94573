"""Exact resume: a real `rlhf ppo` run killed with SIGKILL mid-way, then `--resume`, must give
the same metrics and rollout rows as an uninterrupted run (none duplicated, none missing); and
two processes under torchrun (gloo) end with identical weights."""

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


def _rows(rollouts: Path) -> list[dict]:
    rows = read_table("rollouts", rollouts).to_pylist()
    for r in rows:
        r.pop("created_at")  # wall-clock time, the one field that may differ
    return sorted(rows, key=lambda r: (r["step"], r["prompt_id"], r["response_hash"]))


def _metrics(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_sigkill_then_resume_equals_uninterrupted_run(tmp_path):
    world = ppo_tiny.build_world(tmp_path / "world")
    params = ppo_tiny.write_params(tmp_path / "params.yaml", total_steps=6, checkpoint_every=2)
    # the uninterrupted run: the same entry point, in this process (one thread, like the child)
    import torch

    from rlhf.pipeline.config import load_section
    from rlhf.pipeline.ppo.trainer import run

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run(load_section(params, "ppo"), world["policy"], world["reward"], world["prompts"],
            tmp_path / "a", tmp_path / "rows_a", run_id="run", progress=False)
    finally:
        torch.set_num_threads(threads)

    out_b = tmp_path / "b"
    proc = subprocess.Popen(_cmd(world, params, out_b, tmp_path / "rows_b"), env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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

    res = subprocess.run(_cmd(world, params, out_b, tmp_path / "rows_b", "--resume"), env=_env(),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert _metrics(out_b) == _metrics(tmp_path / "a")
    rows_a, rows_b = _rows(tmp_path / "rows_a"), _rows(tmp_path / "rows_b")
    assert len(rows_a) == 6 * 4
    assert rows_b == rows_a
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
    assert out.returncode == 2 and "temperature must be > 0.3" in out.stderr
    assert "Traceback" not in out.stderr


def test_two_processes_under_torchrun_end_with_identical_weights(tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    world = ppo_tiny.build_world(tmp_path / "world")
    params = ppo_tiny.write_params(tmp_path / "params.yaml", total_steps=2, batch_size=2,
                                   checkpoint_every=2)
    cmd = [str(torchrun), "--nproc_per_node", "2", "--master_port", str(29500 + os.getpid() % 500),
           "-m", "rlhf.cli.app", *_cmd(world, params, tmp_path / "dp", tmp_path / "rows")[1:]]
    out = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    w0 = (tmp_path / "dp" / "weights-rank0.sha256").read_text()
    w1 = (tmp_path / "dp" / "weights-rank1.sha256").read_text()
    assert w0 == w1
    rows = read_table("rollouts", tmp_path / "rows").to_pylist()
    assert len(rows) == 2 * 2 * 2  # steps x processes x batch per process
    m = _metrics(tmp_path / "dp")
    assert [x["step"] for x in m] == [1, 2]  # logged once, by the main process
    initial = ppo_tiny.policy(ppo_tiny.tokenizer())
    from transformers import AutoModelForCausalLM

    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "dp" / "policy")
    assert any((a - b).abs().max() > 0 for a, b in zip(initial.state_dict().values(),
                                                       trained.state_dict().values()))
