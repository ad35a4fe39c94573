"""Advantage estimators (pipeline/ppo/advantages.py): the group math on known vectors, and RLOO
inside our trainer (k samples per prompt, contiguous groups, no critic run)."""

import json

import pytest
import torch

import ppo_tiny
from rlhf.pipeline.config import ConfigError, build
from rlhf.pipeline.ppo.advantages import ESTIMATORS, group_advantages
from rlhf.pipeline.ppo.config import PPOConfig


def test_rloo_is_the_return_minus_the_mean_of_the_others():
    r = torch.tensor([1.0, 0.0, 2.0, 3.0, 3.0, 9.0])
    g = torch.tensor([0, 0, 0, 1, 1, 1])
    live = torch.tensor([True, True, True, True, True, False])
    out = group_advantages(r, g, live, "rloo")
    assert torch.allclose(out, torch.tensor([0.0, -1.5, 1.5, 0.0, 0.0, 0.0]))


def test_grpo_standardises_within_the_group_and_a_lone_sample_gets_nothing():
    r = torch.tensor([1.0, 3.0, 5.0, 7.0])
    g = torch.tensor([0, 0, 1, 2])
    out = group_advantages(r, g, torch.ones(4, dtype=torch.bool), "grpo")
    s = torch.tensor([1.0, 3.0]).std()
    assert torch.allclose(out[:2], torch.tensor([-1.0, 1.0]) / (s + 1e-4))
    assert out[2:].tolist() == [0.0, 0.0]  # groups of one: no baseline


def test_group_estimators_broadcast_over_tokens_and_gae_needs_the_critic():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 3.0]])
    mask = torch.tensor([[True, True], [True, False]])
    adv, ret = ESTIMATORS["rloo"].estimate(rewards, None, mask, torch.tensor([0, 0]), 1.0, 0.95)
    assert adv.tolist() == [[1.0, 1.0], [-1.0, 0.0]] and ret.abs().sum() == 0
    assert ESTIMATORS["gae"].needs_critic and not ESTIMATORS["grpo"].needs_critic


def test_config_checks_the_group():
    with pytest.raises(ConfigError, match="needs ppo.group_size >= 2"):
        build(PPOConfig, {"advantage_estimator": "rloo"}, "ppo")
    with pytest.raises(ConfigError, match="must be >= 1 and divide ppo.batch_size"):
        build(PPOConfig, {"group_size": 3, "batch_size": 8}, "ppo")


@pytest.mark.usefixtures("one_torch_thread")
def test_rloo_in_our_trainer_samples_groups_and_never_runs_the_critic(tmp_path):
    from rlhf.pipeline.ppo.trainer import PPOTrainer, RunPaths
    from rlhf.store.io import read_table

    cfg = build(PPOConfig, {**ppo_tiny.PARAMS, "total_steps": 2, "max_new_tokens": 4,
                            "advantage_estimator": "rloo", "group_size": 2,
                            "whiten_advantages": False}, "ppo")
    tok = ppo_tiny.tokenizer()
    prompts = [(f"p{i:02d}", p) for i, p in enumerate(ppo_tiny.PROMPTS)]
    tr = PPOTrainer(cfg, ppo_tiny.policy(tok), ppo_tiny.policy(tok), tok, ppo_tiny.WordScorer(),
                    prompts, RunPaths(tmp_path / "run", tmp_path / "rows", "rloo"))
    assert tr.critic is None and tr.sharded.critic is None  # never run, so never built
    policy0 = {k: v.clone() for k, v in tr.policy.state_dict().items()}
    tr.train()
    rows = read_table("rollouts", tmp_path / "rows").to_pylist()
    for step in (1, 2):
        ids = [r["prompt_id"] for r in rows if r["step"] == step]
        assert len(ids) == 4 and len(set(ids)) == 2  # 2 prompts x 2 samples
    assert not (tmp_path / "run" / "critic.pt").exists()
    ckpt = tmp_path / "run" / "checkpoints" / "step-000002"
    assert not (ckpt / "critic.pt").exists()
    assert set(torch.load(ckpt / "optim.pt", weights_only=False)) == {"policy", "sched_policy"}
    assert any(not torch.equal(v, tr.policy.state_dict()[k]) for k, v in policy0.items())
    m = [json.loads(x) for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert all(x["critic_token_forwards"] == 0 and x["update_token_forwards"] > 0 for x in m)


def _scored_rollout(scores):
    """Four scored rows of three response tokens (the last row's third is padding), KL 0."""
    from rlhf.pipeline.ppo.rollout import Rollout

    n = len(scores)
    mask = torch.ones(n, 3, dtype=torch.bool)
    mask[-1, 2] = False
    return Rollout([f"p{i}" for i in range(n)], ["q"] * n, ["a"] * n,
                   torch.ones(n, 2, dtype=torch.long), torch.ones(n, 2, dtype=torch.long),
                   torch.ones(n, 3, dtype=torch.long), mask, torch.ones(n, dtype=torch.bool),
                   [[] for _ in range(n)], "sft", scores=torch.tensor(scores),
                   kl=torch.zeros(n, 3), values=torch.zeros(n, 3))


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("kind", ["grpo", "rloo", "gae"])
def test_whiten_advantages_whitens_gae_only(tmp_path, kind):
    """`whiten_advantages: true` (shipped) whitens GAE's advantages over the batch; a group
    estimator's are normalised within their group already and are used as it computes them."""
    from rlhf.pipeline.ppo import core
    from rlhf.pipeline.ppo.trainer import PPOTrainer, RunPaths

    cfg = build(PPOConfig, {**ppo_tiny.PARAMS, "advantage_estimator": kind,
                            "group_size": 1 if kind == "gae" else 2, "kl_coef": 0.0,
                            "whiten_advantages": True}, "ppo")
    tok = ppo_tiny.tokenizer()
    tr = PPOTrainer(cfg, ppo_tiny.policy(tok), ppo_tiny.policy(tok), tok, ppo_tiny.WordScorer(),
                    [("p00", ppo_tiny.PROMPTS[0])], RunPaths(tmp_path / "run", tmp_path / "rows",
                                                             kind))
    r = _scored_rollout([1.0, 0.0, 3.0, 5.0])
    lam = tr.learner.advantages(r, 1)["gae_lambda"]
    own, _ = ESTIMATORS[kind].estimate(r.rewards, r.values, r.response_mask,
                                       torch.tensor([0, 0, 1, 1]), cfg.gamma, lam)
    if kind == "gae":
        assert torch.allclose(r.advantages, core.masked_whiten(own, r.loss_mask) * r.loss_mask)
    else:  # untouched: e.g. GRPO's ±1/(sqrt(2)·std + 1e-4) per group, not re-scaled by the batch
        assert torch.equal(r.advantages, own * r.loss_mask)


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("kind", ["grpo", "gae"])
def test_resume_equals_the_uninterrupted_run_with_and_without_a_critic(tmp_path, kind):
    from rlhf.pipeline.ppo.trainer import PPOTrainer, RunPaths
    from rlhf.store.io import read_table

    cfg = build(PPOConfig, {**ppo_tiny.PARAMS, "total_steps": 4, "max_new_tokens": 4,
                            "checkpoint_every": 2, "advantage_estimator": kind,
                            "group_size": 2 if kind == "grpo" else 1}, "ppo")
    tok = ppo_tiny.tokenizer()
    prompts = [(f"p{i:02d}", p) for i, p in enumerate(ppo_tiny.PROMPTS)]

    def trainer():
        return PPOTrainer(cfg, ppo_tiny.policy(tok), ppo_tiny.policy(tok), tok,
                          ppo_tiny.WordScorer(), prompts,
                          RunPaths(tmp_path / "run", tmp_path / "rows", kind))

    def rows():
        return sorted((r["step"], r["prompt_id"], r["response_key"], r["reward"])
                      for r in read_table("rollouts", tmp_path / "rows").to_pylist())

    first = trainer()
    assert (first.critic is None) == (kind == "grpo")
    first.train()
    done, sha = rows(), (tmp_path / "run" / "weights-rank0.sha256").read_text()
    (tmp_path / "run" / "checkpoints" / "latest").write_text("step-000002")
    trainer().train(resume=True)
    assert rows() == done
    assert (tmp_path / "run" / "weights-rank0.sha256").read_text() == sha
