"""`rlhf export` (pipeline/export.py): a tiny PPO run, recorded by a real DVC project (`dvc
commit`), exported from a mid-run checkpoint: AutoModelForCausalLM loads the folder back with
the checkpoint's very weights and logits, and its model card names the run, the md5 DVC recorded
of each input and the run's figures. Bad exports are one error line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import ppo_tiny
import pytest
import torch
import yaml
from rlhf.cli.app import app
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A DVC project whose `ppo` stage ran `rlhf ppo` on the tiny world (2 steps, a checkpoint
    each) and whose dvc.lock records it."""
    root = tmp_path_factory.mktemp("project")
    world = ppo_tiny.build_world(root / "world")
    ppo_tiny.write_params(root / "params.yaml", total_steps=2, checkpoint_every=1)
    args = ["ppo", "--policy", "world/policy", "--reward", "world/rm", "--prompts",
            "world/prompts.jsonl", "--out", "run", "--rollouts", "rollouts", "--params",
            "params.yaml", "--metrics", "ppo.json"]
    stage = {"cmd": "rlhf " + " ".join(args), "deps": ["world/policy", "world/rm",
                                                       "world/prompts.jsonl"],
             "outs": ["run", "rollouts"], "metrics": [{"ppo.json": {"cache": False}}]}
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"ppo": stage}}))
    dvc = str(Path(sys.executable).with_name("dvc"))
    subprocess.run([dvc, "init", "--no-scm", "-q"], cwd=root, check=True)
    shutil.copy(REPO / ".dvcignore", root / ".dvcignore")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert world["prompts"].is_file()
    subprocess.run([dvc, "commit", "--force", "-q", "ppo"], cwd=root, check=True)
    return root


def _export(project: Path, monkeypatch, *args: str):
    monkeypatch.chdir(project)
    return runner.invoke(app, ["export", *args], env={"COLUMNS": "400"})


def test_a_ppo_checkpoint_exports_to_a_folder_that_loads_its_weights(project, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    res = _export(project, monkeypatch, "run/checkpoints/step-000001", "exported/step1")
    assert res.exit_code == 0, res.output
    out = project / "exported" / "step1"
    model = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    saved = torch.load(project / "run/checkpoints/step-000001/policy.pt")
    state = model.state_dict()
    assert set(state) == set(saved)
    assert all(torch.equal(state[k], saved[k]) for k in saved)
    final = AutoModelForCausalLM.from_pretrained(str(project / "run/policy")).state_dict()
    assert not all(torch.equal(final[k], saved[k]) for k in saved)  # step 1, not the last step
    # the logits of the checkpoint's weights in the run's architecture, exactly
    ref = AutoModelForCausalLM.from_pretrained(str(project / "run/policy")).eval()
    ref.load_state_dict(saved)
    tok = AutoTokenizer.from_pretrained(str(out))
    ids = tok(["tell me about the cat"], return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref(ids).logits)
    assert tok.get_vocab() == AutoTokenizer.from_pretrained(str(project / "world/policy")).get_vocab()

    card = (out / "README.md").read_text()
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]["ppo"]
    md5 = {d["path"]: d["md5"] for d in lock["deps"]}
    for path in ("world/policy", "world/rm", "world/prompts.jsonl"):
        assert f"| `{path}` | `{md5[path]}` |" in card
    assert "- run id: `run`" in card and "- step: `1`" in card and "- stage: `ppo`" in card
    report = json.loads((project / "ppo.json").read_text())
    assert f"| ppo.reward_mean | {report['ppo']['reward_mean']} |" in card


def test_a_run_folder_exports_its_final_policy(project, monkeypatch):
    from transformers import AutoModelForCausalLM

    res = _export(project, monkeypatch, "run", "exported/final")
    assert res.exit_code == 0, res.output
    got = AutoModelForCausalLM.from_pretrained(str(project / "exported/final")).state_dict()
    want = AutoModelForCausalLM.from_pretrained(str(project / "run/policy")).state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert "- step: `2`" in (project / "exported/final/README.md").read_text()


def test_a_model_folder_exports_with_its_chat_template(project, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
                "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    shutil.copytree(project / "world/policy", tmp_path / "chat")
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "chat"))
    tok.chat_template = template
    tok.save_pretrained(tmp_path / "chat")
    res = _export(project, monkeypatch, str(tmp_path / "chat"), str(tmp_path / "out"))
    assert res.exit_code == 0, res.output
    back = AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    messages = [{"role": "user", "content": "tell me about the cat"}]
    assert back.chat_template == template
    assert back.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) \
        == "<|user|>tell me about the cat<|assistant|>"
    assert "No dvc.lock stage writes this checkpoint" in (tmp_path / "out/README.md").read_text()


@pytest.mark.parametrize("args, message", [
    (["run/checkpoints/step-000001", "run"], "run exists: export into a new folder"),
    (["world/prompts.jsonl", "x"], "world/prompts.jsonl is not a folder"),
    (["world", "x"], "world is not a checkpoint"),
    (["run/policy", "x", "--merge"], "--merge: run/policy holds no LoRA adapters"),
    (["run/checkpoints/step-000001", "x", "--base", "world"],
     "its architecture and tokenizer come from --base"),
])
def test_a_bad_export_is_one_error_line(project, monkeypatch, args, message):
    res = _export(project, monkeypatch, *args)
    assert res.exit_code == 2, res.output
    assert len(res.output.strip().splitlines()) == 1 and message in res.output
    assert not (project / "x").exists()
