"""PPO with LoRA (`ppo.lora`, pipeline/ppo/lora.py) on the tiny PPO world: off by default (peft
never imported); only adapters (and the critic's own tensors) train; the reference is the base
with the adapters off, its log-probs equal the base model's exactly; LoRA PPO raises the reward
as plain PPO does (test_ppo_learns); a run killed with SIGKILL resumes exactly; `rlhf export
--merge` turns the run's adapters into a model folder AutoModelForCausalLM loads, and the run's
`policy/` holds them merged already (what every stage loads); the eval stage loads a LoRA
checkpoint as its adapters merged into the SFT policy."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import ppo_tiny
from rlhf.pipeline.config import build
from rlhf.pipeline.ppo.config import PPOConfig
from rlhf.pipeline.ppo.trainer import PPOTrainer, RunPaths

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LORA = {"enabled": True, "r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["all-linear"]}
PROMPTS = [(f"p{i:02d}", p) for i, p in enumerate(ppo_tiny.PROMPTS)]


def _trainer(tmp_path, name="run", **params) -> PPOTrainer:
    cfg = build(PPOConfig, {**ppo_tiny.PARAMS, "lora": LORA, **params}, "ppo")
    tok = ppo_tiny.tokenizer()
    return PPOTrainer(cfg, ppo_tiny.policy(tok), None, tok, ppo_tiny.WordScorer(), PROMPTS,
                      RunPaths(tmp_path / name, tmp_path / f"{name}_rows", name))


def test_off_by_default_and_our_code_imports_peft_only_when_on():
    """With lora off our code never imports peft (TRL's generation helpers import it on their
    own when it is installed, so a whole run cannot show this)."""
    assert PPOConfig().lora.enabled is False
    code = ("import sys\n"
            "import rlhf.pipeline.ppo.trainer, rlhf.pipeline.ppo.checkpoint, rlhf.pipeline.models.lora\n"
            "import rlhf.pipeline.ppo.lora, rlhf.pipeline.reward.train, rlhf.pipeline.export\n"
            "from rlhf.pipeline.config import load_config\n"
            "cfg = load_config('params.yaml', 'ppo'); assert not cfg.lora.enabled\n"
            "print('peft' in sys.modules)\n")
    from pathlib import Path

    import rlhf.pipeline

    root = Path(rlhf.pipeline.__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, cwd=root)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"


@pytest.mark.parametrize("critic", ["shared", "full"])
def test_only_adapters_and_the_critic_train_and_the_reference_is_the_exact_base(tmp_path,
                                                                              critic):
    from rlhf.pipeline.decode import token_logprobs
    from rlhf.pipeline.ppo.generate import policy_logits

    tr = _trainer(tmp_path, total_steps=2, critic=critic, critic_layers=1)
    tr.train()
    policy = tr.sharded.policy.model
    trained = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n for n in trained)
    base = ppo_tiny.policy(ppo_tiny.tokenizer())  # the same seed: the weights the run started
    frozen = {n.replace("base_model.model.", "").replace(".base_layer", ""): p
              for n, p in policy.named_parameters() if not p.requires_grad}
    assert set(frozen) == set(dict(base.named_parameters()))
    assert all(torch.equal(frozen[n], p) for n, p in base.named_parameters())  # base unchanged
    critic_model = tr.sharded.critic.model
    critic_trained = {n for n, p in critic_model.named_parameters() if p.requires_grad}
    if critic == "shared":  # a value head on the policy's own base: no copy of any weight
        assert not any(n.startswith("backbone") for n, _ in critic_model.named_parameters())
        assert critic_trained == {n for n, _ in critic_model.named_parameters()}
    else:  # a model of its own, with its own adapters and a value head
        assert critic_trained and all("lora_" in n or n.startswith("head.")
                                      for n in critic_trained)
    # the reference: adapters off, so the base model's log-probs, bit for bit (float32)
    r = tr.generate(PROMPTS[:4], "v")
    tr.forward_logprobs(r)
    with torch.no_grad():
        expected = token_logprobs(policy_logits(base, r, tr.cfg.temperature), r.response)
    assert r.ref_logprobs.dtype == torch.float32 and torch.equal(r.ref_logprobs, expected)
    assert not torch.equal(r.logprobs, r.ref_logprobs)  # the trained adapters do act
    assert r.kl.abs().sum() > 0
    # the reference left the policy trainable and in its mode
    assert all(p.requires_grad for n, p in policy.named_parameters() if "lora_" in n)


@pytest.mark.slow
def test_lora_ppo_raises_the_proxy_reward(tmp_path):
    from test_ppo_learns import LEARN

    from rlhf.pipeline.ppo.config import plain

    # adapters on the output head too: the random tiny model's next-token distribution is near
    # uniform (entropy 3.6 nats of 3.7), and through the blocks' adapters alone 24 steps move
    # it too little (measured: 0.14 -> 0.16 at learning rates 1e-2 and 3e-2)
    blocks = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    lora = {**LORA, "target_modules": [*blocks, "lm_head"]}
    cfg = plain(build(PPOConfig, {**LEARN, "lora": lora}, "ppo"))  # plain PPO's settings
    tok = ppo_tiny.tokenizer()
    tr = PPOTrainer(cfg, ppo_tiny.policy(tok), None, tok, ppo_tiny.WordScorer(), PROMPTS,
                    RunPaths(tmp_path / "run", tmp_path / "rows", "learn"))
    tr.train()
    rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    curve = [json.loads(x)["reward_mean"] for x in rows]
    first, last = sum(curve[:6]) / 6, sum(curve[-6:]) / 6
    assert last > first + 0.1, (first, last, curve)


@pytest.mark.slow
def test_sigkill_then_resume_with_adapters_is_exact_and_export_merges(tmp_path):
    from test_ppo_resume import _cmd, _env, _metrics, _rows, kill_at_first_checkpoint
    from transformers import AutoModelForCausalLM

    from rlhf.pipeline.models.policy import load_policy

    world = ppo_tiny.build_world(tmp_path / "world")
    params = ppo_tiny.write_params(tmp_path / "params.yaml", total_steps=4, checkpoint_every=2,
                                   critic="shared", critic_layers=1, lora=LORA)
    a = subprocess.run(_cmd(world, params, tmp_path / "a", tmp_path / "rows_a"), env=_env(),
                       capture_output=True, text=True, timeout=300)
    assert a.returncode == 0, a.stderr[-3000:]
    out_b = tmp_path / "b"
    assert kill_at_first_checkpoint(_cmd(world, params, out_b, tmp_path / "rows_b"),
                                    out_b) == "step-000002"
    ckpt = out_b / "checkpoints" / "step-000002"
    saved = torch.load(ckpt / "policy.pt")
    assert saved and all("lora_" in k for k in saved)  # the adapters, not the base
    assert (ckpt / "adapter" / "adapter_config.json").is_file()
    res = subprocess.run(_cmd(world, params, out_b, tmp_path / "rows_b", "--resume"),
                         env=_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert _metrics(out_b) == _metrics(tmp_path / "a")
    assert _rows(tmp_path / "rows_b") == _rows(tmp_path / "rows_a")
    assert (out_b / "weights-rank0.sha256").read_text() == \
        (tmp_path / "a" / "weights-rank0.sha256").read_text()

    # export: the run's adapters and a checkpoint's, merged into plain model folders
    from typer.testing import CliRunner

    from rlhf.cli.app import app

    ids = torch.tensor([[2, 8, 9, 10, 11]])
    from peft import AutoPeftModelForCausalLM

    adapted = AutoPeftModelForCausalLM.from_pretrained(str(out_b / "adapter"))
    with torch.no_grad():
        want = adapted(input_ids=ids).logits
        # the run's policy/ holds them merged: what every stage loads (load_policy)
        merged, _ = load_policy(out_b / "policy")
        assert torch.allclose(merged(input_ids=ids).logits, want, atol=1e-5)
    for src, dest in ((out_b, tmp_path / "merged"), (ckpt, tmp_path / "merged_step2")):
        res = CliRunner().invoke(app, ["export", str(src), str(dest), "--merge", "--lock",
                                       str(tmp_path / "none.lock")])
        assert res.exit_code == 0, res.output
        assert not (dest / "adapter_config.json").exists()
        model = AutoModelForCausalLM.from_pretrained(str(dest))
        with torch.no_grad():
            got = model(input_ids=ids).logits
        if src == out_b:  # the final adapters: the adapted model's logits
            assert torch.allclose(got, want, atol=1e-5)
        else:  # step 2's adapters: not the base's, not the final's
            base = AutoModelForCausalLM.from_pretrained(str(world["policy"]))
            with torch.no_grad():
                assert not torch.allclose(got, base(input_ids=ids).logits, atol=1e-5)


def test_the_eval_stage_loads_a_lora_checkpoint_as_its_adapters_merged(tmp_path):
    """A LoRA run's checkpoint holds only the adapters (policy.pt, adapter/): the eval stage
    loads it as the SFT policy (the run's base) with them merged, the model the run's policy/
    holds at that step, in the dtype `compute` asks for. (Loading policy.pt into the base's
    architecture, as for a plain run, failed on the adapters' keys.)"""
    from rlhf.pipeline.models.compute import Compute
    from rlhf.pipeline.eval import checkpoint_steps, load_checkpoint_policy
    from rlhf.pipeline.models.policy import load_policy

    world = ppo_tiny.build_world(tmp_path / "world")  # its policy: ppo_tiny.policy's weights
    _trainer(tmp_path, total_steps=2, checkpoint_every=2, critic="shared",
             critic_layers=1).train()
    [(step, ckpt)] = checkpoint_steps(tmp_path / "run")
    assert step == 2 and (ckpt / "adapter" / "adapter_config.json").is_file()
    model = load_checkpoint_policy(world["policy"], ckpt)
    assert not any("lora_" in n for n, _ in model.named_parameters())  # merged: a plain model
    merged, _ = load_policy(tmp_path / "run" / "policy")  # the run's policy/ after step 2
    base, _ = load_policy(world["policy"])
    ids = torch.tensor([[2, 8, 9, 10, 11]])
    with torch.no_grad():
        got = model(input_ids=ids).logits
        assert torch.allclose(got, merged(input_ids=ids).logits, atol=1e-5)
        assert not torch.allclose(got, base(input_ids=ids).logits, atol=1e-3)
    bf16 = load_checkpoint_policy(world["policy"], ckpt, Compute(dtype="bfloat16"))
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
    # `rlhf export --merge --base`: the same merge onto the base named (this in-process run
    # named none in its adapters' config)
    from transformers import AutoModelForCausalLM

    from rlhf.pipeline.export import export

    export(ckpt, tmp_path / "exported", merge=True, base=world["policy"])
    exported = AutoModelForCausalLM.from_pretrained(str(tmp_path / "exported"))
    with torch.no_grad():
        assert torch.allclose(exported(input_ids=ids).logits, got, atol=1e-5)


def test_bad_lora_settings_are_one_line_errors(tmp_path):
    from test_ppo_resume import _cmd, _env

    from rlhf.pipeline.config import ConfigError

    with pytest.raises(ConfigError, match=r"ppo.lora.r = 0: allowed >= 1"):
        build(PPOConfig, {"lora": {**LORA, "r": 0}}, "ppo")
    with pytest.raises(ConfigError, match="unknown key.*'rank'"):
        build(PPOConfig, {"lora": {"enabled": True, "rank": 4}}, "ppo")
    with pytest.raises(ConfigError, match="ppo.lora with ppo.sharding zero3"):
        build(PPOConfig, {"lora": LORA, "sharding": "zero3"}, "ppo")
    world = ppo_tiny.build_world(tmp_path / "world")
    params = ppo_tiny.write_params(tmp_path / "params.yaml", total_steps=1,
                                   lora={**LORA, "target_modules": ["nonexistent_proj"]})
    out = subprocess.run(_cmd(world, params, tmp_path / "out", tmp_path / "rows"), env=_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "ppo.lora.target_modules: Target modules {'nonexistent_proj'} not found" in out.stderr
