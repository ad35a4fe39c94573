"""A killed ZeRO-3 run resumes exactly (pipeline/ppo/sharding.py, `ppo.sharding: zero3`): two
real processes under torchrun (gloo, CPUs) are SIGKILLed at their first checkpoint and resumed
from it. The part of tests/test_ppo_sharding.py (its torchrun command) that resumes, in a file of
its own so that `make test`'s workers (a file each at a time) run it beside that one.

    python -m pytest -q -n 0 tests/test_ppo_sharding_resume.py
"""

from __future__ import annotations

import os
import subprocess

import ppo_tiny
import pytest
from test_ppo_resume import _env, _metrics, _rows, kill_at_first_checkpoint
from test_ppo_sharding import _torchrun

pytestmark = pytest.mark.slow


def test_zero3_sigkill_then_resume_equals_uninterrupted_run(tmp_path, repo):
    """Each process's optimizer share (checkpoints/step-N/zero3/) brings a killed ZeRO-3 run back
    exactly: same metrics, rows and weights as the uninterrupted run."""
    pytest.importorskip("deepspeed")
    world = ppo_tiny.build_world(tmp_path / "world")
    params = ppo_tiny.write_params(tmp_path / "p.yaml", total_steps=3, batch_size=4,
                                   mini_batch_size=2, checkpoint_every=2, sharding="zero3",
                                   gradient_accumulation_steps=2)
    port = 29000 + (os.getpid() * 17 + 3) % 900
    a = subprocess.run(_torchrun(world, params, tmp_path / "a", tmp_path / "rows_a", port),
                       env=_env(), capture_output=True, text=True, timeout=600, check=False)
    assert a.returncode == 0, a.stderr[-3000:]
    out_b = tmp_path / "b"
    assert kill_at_first_checkpoint(
        _torchrun(world, params, out_b, tmp_path / "rows_b", port + 1), out_b) == "step-000002"
    res = subprocess.run(
        _torchrun(world, params, out_b, tmp_path / "rows_b", port + 2, "--resume"),
        env=_env(), capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    assert _metrics(out_b) == _metrics(tmp_path / "a")
    assert _rows(tmp_path / "rows_b") == _rows(tmp_path / "rows_a")
    for rank in (0, 1):
        assert (out_b / f"weights-rank{rank}.sha256").read_text() == \
            (tmp_path / "a" / "weights-rank0.sha256").read_text()
