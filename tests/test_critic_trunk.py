"""Critics defined relative to the policy (critic.py `trunk`, `shared`), the causal light
encoder, and the value-quality metrics, on the tiny real policy of tests/ppo_tiny.py."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

import ppo_tiny
from rlhf.pipeline.config import ConfigError, build
from rlhf.pipeline.ppo import critic as cr
from rlhf.pipeline.ppo.config import PPOConfig

PAD = 0

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def policy_and_critic(kind: str, layers: int = 1):
    tok = ppo_tiny.tokenizer()
    policy = ppo_tiny.policy(tok)
    torch.manual_seed(1)
    critic = cr.build_critic(kind, len(tok), PAD, num_layers=layers, max_tokens=16,
                             policy_config=policy.config)
    critic.copy_from_policy(policy)
    return policy, critic


def test_trainer_builds_a_trunk_critic_equal_to_the_policy_layers_at_step_0(tmp_path):
    from rlhf.pipeline.ppo.trainer import PPOTrainer, RunPaths

    tok = ppo_tiny.tokenizer()
    cfg = build(PPOConfig, {**ppo_tiny.PARAMS, "critic": "trunk", "critic_layers": 1}, "ppo")
    prompts = [(f"p{i:02d}", p) for i, p in enumerate(ppo_tiny.PROMPTS)]
    policy = ppo_tiny.policy(tok)
    sft = {k: v.clone() for k, v in policy.model.state_dict().items()}
    tr = PPOTrainer(cfg, policy, ppo_tiny.policy(tok), tok, ppo_tiny.WordScorer(), prompts,
                    RunPaths(tmp_path / "run", tmp_path / "rollouts", "t", None))
    trunk = tr.sharded.critic.model.backbone.state_dict()
    assert set(trunk) == {k for k in sft if not k.startswith("layers.1.")}  # 1 of 2 layers
    for k, v in trunk.items():
        assert torch.equal(v, sft[k]), k
    # the copy is a copy: the critic's weights are not the policy's tensors
    assert trunk["layers.0.mlp.up_proj.weight"].data_ptr() != \
        policy.model.layers[0].mlp.up_proj.weight.data_ptr()


def test_trunk_trains_its_layers_but_not_the_embeddings():
    _, critic = policy_and_critic("trunk")
    ids, mask, _ = cr.pack_right([[3, 4], [6, 7, 8, 9]], [[5], [10, 11]], PAD, 16)
    critic.train()(ids, mask).sum().backward()
    grads = {n: p.grad for n, p in critic.named_parameters()}
    assert grads["backbone.embed_tokens.weight"] is None
    assert grads["backbone.layers.0.self_attn.q_proj.weight"].abs().sum() > 0
    assert grads["head.weight"].abs().sum() > 0


def test_shared_trunk_is_frozen_and_gets_no_gradient():
    policy, critic = policy_and_critic("shared")
    before = {k: v.clone() for k, v in critic.backbone.state_dict().items()}
    ids, mask, start = cr.pack_right([[3, 4], [6, 7, 8, 9]], [[5], [10, 11]], PAD, 16)
    opt = torch.optim.AdamW([p for p in critic.parameters() if p.requires_grad], lr=1e-2)
    critic.train()
    assert not critic.backbone.training  # frozen: no dropout either
    v = cr.response_values(critic(ids, mask), mask, start, 2)
    loss, _ = cr.critic_loss(v, v.detach() + 1, torch.ones_like(v), torch.ones_like(v).bool(),
                             torch.ones(2), None, 1.0, 0.01)
    loss.backward()
    for n, p in critic.backbone.named_parameters():
        assert p.grad is None and not p.requires_grad, n
    assert critic.adapter.linear1.weight.grad.abs().sum() > 0
    assert critic.head.weight.grad.abs().sum() > 0
    opt.step()
    for k, v in critic.backbone.state_dict().items():
        assert torch.equal(v, before[k]), k
    # the trunk still equals the policy's first layer
    assert torch.equal(critic.backbone.layers[0].mlp.up_proj.weight,
                       policy.model.layers[0].mlp.up_proj.weight)


@pytest.mark.parametrize("kind", ["trunk", "shared"])
def test_trunk_critics_never_attend_padding(kind):
    _, critic = policy_and_critic(kind)
    critic.eval()
    alone_ids, alone_mask, _ = cr.pack_right([[3, 4]], [[5]], PAD, 16)
    batch_ids, batch_mask, _ = cr.pack_right([[3, 4], [6, 7, 8, 9]], [[5], [10, 11]], PAD, 16)
    with torch.no_grad():
        alone = critic(alone_ids, alone_mask)
        batched = critic(batch_ids, batch_mask)
    assert torch.allclose(alone[0], batched[0, :3], atol=1e-5)
    assert batched[0, 3:].abs().sum() == 0
    with pytest.raises(AssertionError):  # the mask check (seed 000 §5.3) guards these too
        critic(batch_ids, torch.ones_like(batch_mask))


@pytest.mark.parametrize("kind", ["light", "trunk", "shared"])
def test_the_value_before_a_token_does_not_read_it_or_later_tokens(kind):
    if kind == "light":
        torch.manual_seed(0)
        critic = cr.LightCritic(50, 32, 2, 4, 16, pad_id=PAD)
    else:
        _, critic = policy_and_critic(kind)
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    other = torch.tensor([[3, 4, 5, 9, 11]])  # differs from position 3 on
    mask = torch.ones_like(ids)
    with torch.no_grad():
        a, b = critic.eval()(ids, mask), critic(other, mask)
    assert torch.allclose(a[0, :3], b[0, :3], atol=1e-6)
    assert not torch.allclose(a[0, 3:], b[0, 3:])


def test_trunk_layers_default_to_a_quarter_and_must_be_fewer_than_the_policy():
    assert cr.trunk_layers(0, 24) == 6 and cr.trunk_layers(0, 4) == 1 and cr.trunk_layers(0, 2) == 1
    assert cr.trunk_layers(3, 24) == 3
    with pytest.raises(ValueError, match="fewer than the policy's 2"):
        cr.trunk_layers(2, 2)
    with pytest.raises(ConfigError, match="critic_layers"):
        build(PPOConfig, {**ppo_tiny.PARAMS, "critic": "light", "critic_layers": 0}, "ppo")
    with pytest.raises(ConfigError, match="reward_attention_on"):
        build(PPOConfig, {**ppo_tiny.PARAMS, "critic": "trunk", "reward_attention_on": True}, "ppo")
    assert build(PPOConfig, {**ppo_tiny.PARAMS, "critic": "shared", "critic_layers": 0},
                 "ppo").critic_layers == 0


def test_value_quality_on_known_vectors():
    # R = [1, 2, 4], V = [1, 2, 3]: R - V = [0, 0, 1], Var = 2/9; Var R = 14/9 -> EV = 6/7
    v = torch.tensor([[1.0, 2.0, 3.0, 99.0]])
    r = torch.tensor([[1.0, 2.0, 4.0, -99.0]])
    m = torch.tensor([[1, 1, 1, 0]])  # the masked token counts for nothing
    q = cr.value_quality(cr.value_quality_sums(v, r, m))
    assert q["value_explained_variance"] == pytest.approx(6 / 7)
    assert q["value_rmse"] == pytest.approx(math.sqrt(1 / 3))
    perfect = cr.value_quality(cr.value_quality_sums(r, r, m))
    assert perfect == pytest.approx({"value_explained_variance": 1.0, "value_rmse": 0.0})
    mean = cr.value_quality(cr.value_quality_sums(torch.full_like(r, 7 / 3), r, m))
    assert mean["value_explained_variance"] == pytest.approx(0.0, abs=1e-12)
    # sums add: two halves (two processes) give the whole batch's figures
    halves = cr.value_quality_sums(v[:, :2], r[:, :2], m[:, :2]) + \
        cr.value_quality_sums(v[:, 2:], r[:, 2:], m[:, 2:])
    assert cr.value_quality(halves) == pytest.approx(q)
    assert math.isnan(cr.value_quality(cr.value_quality_sums(v, r, m * 0))["value_rmse"])
    flat = cr.value_quality(cr.value_quality_sums(v, torch.ones_like(r), m))
    assert math.isnan(flat["value_explained_variance"]) and flat["value_rmse"] > 0


def _metrics(out):
    return [{k: v for k, v in json.loads(x).items() if not k.startswith("seconds")}
            for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_shared_critic_run_logs_value_quality_and_resume_restores_it(tmp_path):
    from rlhf.pipeline.config import load_section
    from rlhf.pipeline.ppo.trainer import run

    world = ppo_tiny.build_world(tmp_path / "world")
    params = ppo_tiny.write_params(tmp_path / "params.yaml", total_steps=4, checkpoint_every=2,
                                   critic="shared", critic_layers=1)
    cfg = load_section(params, "ppo")

    def go(out, rows, resume=False):
        return run(cfg, world["policy"], world["reward"], world["prompts"], out, rows,
                   run_id="run", progress=False, resume=resume)

    go(tmp_path / "a", tmp_path / "rows_a")
    m = _metrics(tmp_path / "a")
    assert len(m) == 4
    assert all(math.isfinite(x["value_rmse"]) for x in m)
    assert all(x["value_explained_variance"] <= 1.0 for x in m)
    # b: the run as it stood at its step-2 checkpoint (later records and files removed), resumed
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    b = tmp_path / "b"
    shutil.rmtree(b / "checkpoints" / "step-000004")
    (b / "checkpoints" / "latest").write_text("step-000002")
    for name in ("summary.json", "critic.pt"):
        (b / name).unlink()
    shutil.rmtree(b / "policy", ignore_errors=True)
    go(b, tmp_path / "rows_b", resume=True)
    assert _metrics(b) == m
    ca = torch.load(tmp_path / "a" / "critic.pt")
    cb = torch.load(b / "critic.pt")
    assert set(ca) == set(cb) and all(torch.equal(ca[k], cb[k]) for k in ca)
    # the frozen trunk is still the SFT policy's first layer after 4 steps
    from transformers import AutoModelForCausalLM

    sft = AutoModelForCausalLM.from_pretrained(world["policy"]).model.state_dict()
    assert torch.equal(ca["backbone.layers.0.mlp.up_proj.weight"], sft["layers.0.mlp.up_proj.weight"])
