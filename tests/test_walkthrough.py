"""docs/realdata.md's "Your model on your GPU" walk-through, run as the page writes it: its fenced
blocks in order (```bash run verbatim in a fresh folder, ```yaml applied to `my-params.yaml` as
the page says to edit it, ```python saved as the `my_reward.py` the page names), against a tiny
Llama-shaped base model with a ChatML chat template and a tiny reward-model judge that the test
saves: `$MODEL` a hub name, the base model's snapshot in a Hugging Face cache of the test's
(HF_HUB_CACHE, offline), `$JUDGE` a local folder. The only thing the test adds is the sizes (2
SFT steps, 2 PPO steps, short texts: TINY); the page cannot drift from what runs.

    python -m pytest -q tests/test_walkthrough.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from bench.stages_setup import merge  # the device script's params edit: one deep merge

pytestmark = pytest.mark.slow  # about 50 s on one core

REPO = Path(__file__).resolve().parents[1]
HEADING = "## Your model on your GPU"
HUB_NAME = "tiny-org/tiny-chat"  # $MODEL: the base model by hub name
# the sizes the test runs at (everything else is the page's and the profile's)
TINY = {
    "sft": {"epochs": 1.0, "batch_size": 4, "heldout_fraction": 0.3, "max_length": 64, "eval_prompts": 2,
            "eval_max_new_tokens": 6},
    "ppo": {"total_steps": 2, "batch_size": 4, "mini_batch_size": 2, "max_new_tokens": 6,
            "max_prompt_tokens": 32, "checkpoint_every": 2, "csv_every": 1,
            "critic_max_tokens": 32, "generation_timeout_s": 600.0},
    "judge": {"batch_size": 4, "max_length": 64},
}
DEMOS = [("What colour is the sky?", "Blue, mostly."), ("Why is it blue?", "Air scatters it."),
         ("Name a fruit.", "An apple."), ("Name a colour.", "Green."),
         ("Say hello.", "Hello."), ("Count to two.", "One, two."),
         ("What is warm?", "The sun."), ("Name a pet.", "A cat."), ("Name a tree.", "An oak.")]


def section() -> str:
    text = (REPO / "docs" / "realdata.md").read_text(encoding="utf-8")
    assert HEADING in text, f"docs/realdata.md has no {HEADING!r} section"
    body = text.split(HEADING, 1)[1]
    return body.split("\n## ", 1)[0]


def blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced block, in the page's order."""
    return re.findall(r"^```(\w+)\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)


def _models(root: Path) -> tuple[Path, Path]:
    """The base model (a 2-layer Llama, a byte-level tokenizer with a ChatML template) and a
    judge RM (a sequence classifier on the same tokenizer), saved as local folders."""
    import torch
    from test_chat_templates import CHATML, _tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

    tok = _tokenizer(CHATML)
    shape = {"vocab_size": len(tok), "hidden_size": 32, "intermediate_size": 64,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
             "max_position_embeddings": 256, "pad_token_id": tok.pad_token_id,
             "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id,
             "tie_word_embeddings": False}
    torch.manual_seed(0)
    base, judge = root / "base", root / "judge"
    LlamaForCausalLM(LlamaConfig(**shape)).save_pretrained(base)
    LlamaForSequenceClassification(LlamaConfig(**shape, num_labels=1)).save_pretrained(judge)
    for folder in (base, judge):
        tok.save_pretrained(folder)
    return base, judge


def _hub_cache(base: Path, cache: Path) -> str:
    """`base` as the hub model HUB_NAME in `cache`, in the hub client's layout; returns the name."""
    import shutil

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / ("models--" + HUB_NAME.replace("/", "--"))
    shutil.copytree(base, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return HUB_NAME


def _run(script: str, cwd: Path, env: dict) -> str:
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, f"{script}\n--- stdout\n{out.stdout[-3000:]}\n--- stderr\n" \
                                f"{out.stderr[-3000:]}"
    return out.stdout + out.stderr


def test_the_walkthrough_runs_as_written(tmp_path):
    base, judge = _models(tmp_path)
    model = _hub_cache(base, tmp_path / "hf_cache")
    data = tmp_path / "data"
    data.mkdir()
    with open(data / "demos.jsonl", "w") as fh:
        fh.writelines(json.dumps({"prompt": p, "response": r}) + "\n" for p, r in DEMOS)
    with open(data / "prompts.jsonl", "w") as fh:
        fh.writelines(json.dumps({"prompt_id": f"p{i}", "text": p}) + "\n"
                      for i, (p, _) in enumerate(DEMOS))
    work = tmp_path / "checkout"  # a checkout's root: the page's commands name profiles/
    work.mkdir()
    (work / "profiles").symlink_to(REPO / "profiles")
    env = {**os.environ, "MODEL": model, "JUDGE": str(judge),
           "HF_HUB_CACHE": str(tmp_path / "hf_cache"),
           "DEMOS": str(data / "demos.jsonl"), "PROMPTS": str(data / "prompts.jsonl"),
           "WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "WANDB_CONFIG_DIR": str(tmp_path / "wandb_config"),
           "WANDB_CACHE_DIR": str(tmp_path / "wandb_cache"),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "RLHF_TORCH_THREADS": "1",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "COLUMNS": "200",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    # a user's shell: no wandb service of this pytest process (an earlier in-process test of
    # this worker started one and exported WANDB_SERVICE), whose working directory is the
    # checkout's: the page's relative runs/ folders would get its console logs there
    env.pop("WANDB_SERVICE", None)

    found = blocks(section())
    assert [lang for lang, _ in found] == ["bash", "yaml", "bash", "python", "bash"], found
    logs = []
    for lang, body in found:
        if lang == "bash":
            logs.append(_run(body, work, env))
        elif lang == "yaml":  # the page's edits of my-params.yaml, then the test's sizes
            edits = yaml.safe_load(body.replace("$MODEL", model).replace("$JUDGE", str(judge)))
            params = yaml.safe_load((work / "my-params.yaml").read_text())
            merge(params, edits)
            merge(params, TINY)
            (work / "my-params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        else:
            (work / "my_reward.py").write_text(body)

    doctor = logs[1]
    assert "cpu" in doctor and "float32" in doctor  # what auto resolves to without a GPU
    runs = work / "runs"
    # (b) the SFT policy keeps the base's chat template
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert AutoTokenizer.from_pretrained(str(runs / "sft")).chat_template
    # (d) LoRA: the run's adapters and a checkpoint holding them
    assert (runs / "ppo" / "adapter" / "adapter_config.json").is_file()
    assert (runs / "ppo" / "checkpoints" / "step-000002" / "adapter").is_dir()
    # (e) the function scored every rollout, and each rollout row names it
    from rlhf.store.io import read_table

    assert json.loads((runs / "ppo" / "summary.json").read_text())["steps"] == 2
    rows = read_table("rollouts", runs / "rollouts").to_pylist()
    assert len(rows) == 2 * TINY["ppo"]["batch_size"]
    assert {r["rm_version"].split("@")[0] for r in rows} == {"python:my_reward.py:score"}
    # (f) wandb: an offline run per training stage, where the page says
    for folder in (runs / "tensorboard" / "sft", runs / "ppo" / "tensorboard"):
        assert list((folder / "wandb").glob("offline-run-*")), sorted(runs.rglob("wandb"))
    # (g) the export: a plain model folder (adapters merged) with the chat template
    exported = runs / "exported"
    assert not (exported / "adapter_config.json").exists()
    assert AutoTokenizer.from_pretrained(str(exported)).chat_template
    assert AutoModelForCausalLM.from_pretrained(str(exported)).config.num_hidden_layers == 2
