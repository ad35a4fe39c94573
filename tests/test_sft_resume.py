"""SFT after kill -9: a rerun resumes from the last complete epoch checkpoint and ends with the
weights an uninterrupted run ends with (equal within 1e-5: the resumed run restores the
optimizer, scheduler and RNG states, so only float summation order may differ)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_world import write_demonstrations, write_model_config, write_tokenizer

pytestmark = pytest.mark.slow

CFG = {"epochs": 4.0, "batch_size": 16, "learning_rate": 1e-2, "heldout_fraction": 0.15}

_CHILD = """
import json, sys
from rlhf.pipeline.sft import SftConfig, read_demonstrations, train_sft
cfg, demos, out, tok, model_config = sys.argv[1:]
m = train_sft(SftConfig(**json.loads(cfg)), read_demonstrations(demos), out, tok, model_config)
print(json.dumps(m))
"""


def _env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", RLHF_TORCH_THREADS="1", HF_HUB_OFFLINE="1",
                TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                TOKENIZERS_PARALLELISM="false", PYTHONHASHSEED="0")


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_sft_killed_after_an_epoch_resumes_to_the_uninterrupted_weights(tmp_path):
    from rlhf.pipeline.sft import CHECKPOINT_MARK, checkpoints_dir
    from transformers import AutoTokenizer

    tok = write_tokenizer(tmp_path / "tokenizer")
    model_config = write_model_config(tmp_path / "model_config",
                                      len(AutoTokenizer.from_pretrained(tok)))
    demos = write_demonstrations(tmp_path / "demos.jsonl", n=96)

    def cmd(out: Path) -> list[str]:
        return [sys.executable, "-c", _CHILD, json.dumps(CFG), str(demos), str(out), str(tok),
                str(model_config)]

    whole = subprocess.run(cmd(tmp_path / "whole"), env=_env(), capture_output=True, text=True,
                           timeout=600, check=False)
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert not checkpoints_dir(tmp_path / "whole").exists()  # removed once the policy is saved

    out = tmp_path / "killed"
    ckpt = checkpoints_dir(out)
    proc = subprocess.Popen(cmd(out), env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:  # the kill point: as soon as the first epoch's checkpoint is complete
        deadline = time.monotonic() + 300
        while not list(ckpt.glob(f"checkpoint-*/{CHECKPOINT_MARK}")):
            assert proc.poll() is None, "the run ended before its first checkpoint was complete"
            assert time.monotonic() < deadline
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "model.safetensors").exists()  # no policy until the run completes
    complete = [int(d.parent.name.rpartition("-")[2])
                for d in ckpt.glob(f"checkpoint-*/{CHECKPOINT_MARK}")]
    assert complete, "no checkpoint to resume from"
    steps_done = max(complete)

    rerun = subprocess.run(cmd(out), env=_env(), capture_output=True, text=True, timeout=600,
                           check=False)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert not ckpt.exists()
    a, b = _weights(tmp_path / "whole"), _weights(out)
    assert a.keys() == b.keys()
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst <= 1e-5, (worst, steps_done)
    # the rerun resumed where the kill left it (a fresh start would end with the same weights)
    last = lambda run: json.loads(run.stdout.strip().splitlines()[-1])
    assert last(rerun)["resumed_from_step"] == steps_done > 0
    assert last(whole)["resumed_from_step"] == 0


def test_checkpoints_of_other_inputs_are_not_resumed(tmp_path):
    from rlhf.pipeline.sft import CHECKPOINT_MARK, FINGERPRINT, last_checkpoint

    folder = tmp_path / ".sft.checkpoints"
    assert last_checkpoint(folder, "A") is None and (folder / FINGERPRINT).read_text() == "A"
    for step, complete in ((6, True), (12, True), (18, False)):
        (folder / f"checkpoint-{step}").mkdir()
        if complete:
            (folder / f"checkpoint-{step}" / CHECKPOINT_MARK).write_text("")
    # the newest complete one; the one cut short by the kill is removed
    assert last_checkpoint(folder, "A") == str(folder / "checkpoint-12")
    assert not (folder / "checkpoint-18").exists()
    # other inputs (a changed param, other demonstrations): start over
    assert last_checkpoint(folder, "B") is None
    assert not list(folder.glob("checkpoint-*")) and (folder / FINGERPRINT).read_text() == "B"
