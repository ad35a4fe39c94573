"""params.yaml `tracking` (pipeline/tracking.py) on real runs: a tiny SFT run and a tiny PPO run
report every step to TensorBoard and to wandb in offline mode (its run file read back record by
record), with their params and the git commit, and a tracked run saves the weights an untracked
one does; a tracker that is not installed is one error line naming its pip package."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import ppo_tiny
import pytest
import wandb  # noqa: F401  (the real tracker the tests use: a missing package fails here)
from rlhf.cli.app import app
from rlhf.pipeline.tracking import TrackingConfig
from tiny_world import toy_gold, write_demonstrations, write_model_config, write_tokenizer
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[1]
TRACKED = TrackingConfig(report_to=("tensorboard", "wandb"), project="rlhf-test")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(autouse=True)
def _wandb_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb_cache"))


def wandb_run(folder: Path) -> tuple[dict, list[dict]]:
    """(config, history lines) of the one offline run under `folder`/wandb, read from its
    run-<id>.wandb file: records in 32 KiB blocks of (crc32, length, type) chunks after a 7-byte
    header (LevelDB's log format), each a wandb Record protobuf."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = (folder / "wandb").glob("offline-run-*/run-*.wandb")
    data, pos, chunk, records = path.read_bytes(), 7, b"", []
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk += data[pos + 7:pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):  # FULL or LAST: a whole record
            rec = pb.Record()
            rec.ParseFromString(chunk)
            records.append(rec)
            chunk = b""
    config, history = {}, []
    for rec in records:
        kind = rec.WhichOneof("record_type")
        if kind in ("run", "config"):
            updates = rec.run.config.update if kind == "run" else rec.config.update
            config.update({u.key: json.loads(u.value_json) for u in updates})
        elif kind == "history":
            history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                            for i in rec.history.item})
    return config, history


def head_commit() -> str:
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()


def scalars(folder: Path, tag: str) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(folder))
    ea.Reload()
    return {e.step: e.value for e in ea.Scalars(tag)}


def test_sft_reports_every_step_with_its_params_and_saves_the_untracked_weights(tmp_path):
    from rlhf.pipeline.sft import SftConfig, run
    from transformers import AutoTokenizer

    tok = write_tokenizer(tmp_path / "tokenizer")
    model_config = write_model_config(tmp_path / "model_config",
                                      len(AutoTokenizer.from_pretrained(tok)))
    demos = write_demonstrations(tmp_path / "demos.jsonl", n=48)
    cfg = SftConfig(epochs=2, batch_size=16, learning_rate=1e-2, eval_prompts=2,
                    eval_max_new_tokens=4, heldout_fraction=0.15)
    plain = run(cfg, demos, tmp_path / "plain" / "sft", tok, model_config, judge=toy_gold)
    tracked = run(cfg, demos, tmp_path / "tracked" / "sft", tok, model_config, judge=toy_gold,
                  tracking=TRACKED)
    # the trackers only read: the same weights, the same report
    assert ((tmp_path / "tracked" / "sft" / "model.safetensors").read_bytes()
            == (tmp_path / "plain" / "sft" / "model.safetensors").read_bytes())
    assert ({k: v for k, v in tracked.items() if k != "train_seconds"}
            == {k: v for k, v in plain.items() if k != "train_seconds"})
    assert not (tmp_path / "plain" / "tensorboard").exists()  # no tracker: no files
    logs = tmp_path / "tracked" / "tensorboard" / "sft"
    steps = len(scalars(logs, "sft/loss"))
    assert steps == 2 * 3 and sorted(scalars(logs, "sft/loss")) == list(range(1, steps + 1))
    assert scalars(logs, "sft/eval_loss")[steps] == pytest.approx(tracked["eval_loss"])
    config, history = wandb_run(logs)
    assert config["sft.learning_rate"] == 0.01 and config["sft.epochs"] == 2
    assert config["git_commit"] == head_commit() and config["stage"] == "sft"
    losses = [h for h in history if "sft/loss" in h]
    assert [h["_step"] for h in losses] == list(range(1, steps + 1))
    assert [h["sft/loss"] for h in losses] == pytest.approx(
        [scalars(logs, "sft/loss")[s] for s in range(1, steps + 1)])
    assert history[-1]["sft/train_loss"] == pytest.approx(tracked["train_loss"])


def test_ppo_reports_every_metric_of_every_step_to_wandb(tmp_path):
    from rlhf.pipeline.config import build
    from rlhf.pipeline.ppo.config import PPOConfig
    from rlhf.pipeline.ppo.trainer import PPOTrainer, RunPaths

    tok = ppo_tiny.tokenizer()
    cfg = build(PPOConfig, {**ppo_tiny.PARAMS, "total_steps": 2}, "ppo")
    prompts = [(f"p{i:02d}", p) for i, p in enumerate(ppo_tiny.PROMPTS)]
    paths = RunPaths(tmp_path / "run", tmp_path / "rollouts", "test-run")
    PPOTrainer(cfg, ppo_tiny.policy(tok), ppo_tiny.policy(tok), tok, ppo_tiny.WordScorer(),
               prompts, paths, tracking=TRACKED).train()
    logged = [json.loads(x)
              for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    config, history = wandb_run(tmp_path / "run" / "tensorboard")
    assert config["ppo.total_steps"] == 2 and config["ppo.kl_coef"] == cfg.kl_coef
    assert config["git_commit"] == head_commit()
    assert [h["_step"] for h in history] == [1, 2]
    for h, m in zip(history, logged):
        for k in ("reward_mean", "kl_div_mean", "critic_loss", "entropy_mean"):
            assert h[f"ppo/{k}"] == pytest.approx(m[k])
    # TensorBoard, as without wandb
    assert sorted(scalars(tmp_path / "run" / "tensorboard", "ppo/reward_mean")) == [1, 2]


def _params_with(tmp_path: Path, tracking: dict) -> Path:
    import yaml

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["tracking"] = {**params["tracking"], **tracking}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


@pytest.mark.parametrize("tracker", ["mlflow", "trackio"])
@pytest.mark.parametrize("stage", ["sft", "reward", "ppo"])
def test_a_tracker_not_installed_is_one_error_line_naming_its_package(tmp_path, monkeypatch,
                                                                        stage, tracker):
    """mlflow and trackio are not in the lock (their dependencies would grow its set-up): each
    training stage that names one where it is missing stops before any model loads."""
    monkeypatch.setitem(sys.modules, tracker, None)  # as in an environment without it
    params = _params_with(tmp_path, {"report_to": ["tensorboard", tracker]})
    demos = write_demonstrations(tmp_path / "demos.jsonl", n=4)
    out = tmp_path / "o"
    args = {"sft": ["--demos", str(demos), "--out", str(out)],
            "reward": ["--preferences", str(tmp_path), "--sft", str(tmp_path / "sft"),
                       "--out-strong", str(out / "s"), "--out-light", str(out / "l")],
            "ppo": ["--policy", str(tmp_path / "sft"), "--reward", str(tmp_path / "rm"),
                    "--prompts", str(demos), "--out", str(out), "--rollouts", str(out / "r")]}
    res = CliRunner().invoke(app, [stage, *args[stage], "--params", str(params)],
                             env={"COLUMNS": "400"})
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit)
    assert res.output.strip().splitlines() == [
        f"error: tracking.report_to names {tracker}, which is not installed: pip install "
        f"{tracker}"]
    assert not out.exists()


@pytest.mark.parametrize("report_to, message", [
    (["neptune"], "unknown tracker(s) neptune"),
    (["none", "wandb"], "`none` cannot be combined"),
])
def test_a_bad_report_to_is_one_error_line(tmp_path, report_to, message):
    params = _params_with(tmp_path, {"report_to": report_to})
    res = CliRunner().invoke(app, ["ppo", "--policy", "p", "--reward", "r", "--prompts", "x",
                                   "--out", str(tmp_path / "o"), "--rollouts", "r",
                                   "--params", str(params)], env={"COLUMNS": "400"})
    assert res.exit_code == 2, res.output
    assert len(res.output.strip().splitlines()) == 1 and message in res.output
