"""The sampling stages' engine parameter (preferences.engine, reward.engine, difficulty.engine)
reaches the engine that samples: each stage run with `hf` and with `native` on a tiny policy
records its engine and the policy's counted forwards in its report, and native's token-forwards
are fewer (a row that stops leaves the batch); `auto` on the CPU samples and records as
`native` does, the same draws. The reward stage's three sampling calls (distillation rollouts,
fresh samples, on-policy samples) each ask for the configured engine (`auto`: as resolved)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from ppo_tiny import build_world
from tiny_world import ToyAnnotatorPool, toy_gold, write_pool


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("stage_engine")
    world = build_world(root, reward_stage=True)
    return world, write_pool(root / "pool", n=40)


def test_preferences_records_its_engine_and_native_costs_less(tiny, tmp_path):
    from rlhf.pipeline import preferences

    world, pool = tiny
    reports = {}
    for engine in ("hf", "native", "auto"):
        cfg = preferences.PreferencesConfig(k=3, max_new_tokens=12, engine=engine, batch_size=30)
        reports[engine] = preferences.run(cfg, world["policy"], tmp_path / engine, pool_dir=pool,
                                          world=(ToyAnnotatorPool, toy_gold))
    hf, nat = reports["hf"]["sampling"], reports["native"]["sampling"]
    assert hf["engine"] == "hf" and nat["engine"] == "native"
    assert reports["auto"] == reports["native"]  # auto on a CPU: native, the same draws
    assert reports["native"]["n_responses"] == 3 * reports["native"]["n_prompts"] > 0
    assert 0 < nat["token_forwards"] < hf["token_forwards"]


def test_difficulty_records_its_engine_and_native_costs_less(tiny, tmp_path):
    from rlhf.pipeline import difficulty

    world, pool = tiny
    reports = {}
    for engine in ("hf", "native"):
        cfg = difficulty.DifficultyConfig(max_new_tokens=12, engine=engine)
        reports[engine] = difficulty.run(cfg, world["policy"], world["reward"], tmp_path / engine,
                                         pool_dir=pool)
    hf, nat = reports["hf"]["sampling"], reports["native"]["sampling"]
    assert hf["engine"] == "hf" and nat["engine"] == "native"
    assert reports["native"]["n_prompts"] == 40
    assert 0 < nat["token_forwards"] < hf["token_forwards"]


@pytest.mark.parametrize(("engine", "resolved"),
                         [("hf", "hf"), ("native", "native"), ("auto", "native")])
def test_reward_samples_through_its_engine(tiny, monkeypatch, engine, resolved):
    from rlhf.pipeline import decode
    from rlhf.pipeline.models.policy import load_policy
    from rlhf.pipeline.reward import load_ensemble
    from rlhf.pipeline.reward.report import fresh_samples, onpolicy_figures
    from rlhf.pipeline.reward.distill import distill_set
    from rlhf.pipeline.reward.stage import RewardConfig

    world, _ = tiny
    asked = []
    real = decode.get_generator
    monkeypatch.setattr(decode, "get_generator", lambda name: asked.append(name) or real(name))
    cfg = RewardConfig(engine=engine, rollout_k=2, eval_k=2, max_new_tokens=6)
    policy, tok = load_policy(world["policy"])
    prompts = ["tell me about the cat", "describe the dog"]
    torch.manual_seed(0)
    _, responses, groups, policy_idx = distill_set(cfg, policy, tok, prompts, [], None)
    assert policy_idx == [0, 1, 2, 3]
    assert [len(g) for g in groups] == [2, 2] and len(responses) == 4
    assert len(fresh_samples(cfg, policy, tok, prompts, None)[1]) == 4
    strong, light = load_ensemble(world["strong_reward"]), load_ensemble(world["reward"])
    report = onpolicy_figures(replace(cfg, onpolicy_k=2), policy, tok, prompts, strong, light,
                              toy_gold, None, lambda msg: None)
    assert report["sampling"]["engine"] == resolved and report["n_prompts"] == 2
    assert asked == [resolved] * 3
