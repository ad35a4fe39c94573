"""DAPO's dynamic sampling (features/dynamic_sampling.py), a feature that came in through the
registry alone: flat groups are found, dropped and refilled on the real trainer, every token
counted, and a bad configuration is one line."""

import json

import pytest
import torch

import ppo_tiny
from rlhf.pipeline.config import build
from rlhf.pipeline.ppo.config import PPOConfig
from rlhf.pipeline.ppo.features.dynamic_sampling import flat_groups
from rlhf.pipeline.ppo.rollout import Rollout


def test_flat_groups():
    assert flat_groups([1.0, 1.0, 0.0, 2.0, 3.0, 3.0], [True] * 6, 2) == [0, 2]
    assert flat_groups([0.0, 1.0], [True, False], 2) == [0]  # one valid sample: no baseline


def test_take_and_cat_repad_queries_and_responses():
    def part(P, T, tag):
        return Rollout([tag], [tag], [tag], torch.ones(1, P, dtype=torch.long),
                       torch.ones(1, P, dtype=torch.long), torch.full((1, T), 5),
                       torch.ones(1, T, dtype=torch.bool), torch.tensor([True]), [[]], "v",
                       scores=torch.tensor([float(P)]), extras={"generated_tokens": [T]})
    r = Rollout.cat([part(2, 3, "a"), part(4, 1, "b")], pad_id=0)
    assert r.query.tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
    assert r.response_mask.tolist() == [[True, True, True], [True, False, False]]
    assert r.extras["generated_tokens"] == [3, 1] and r.scores.tolist() == [2.0, 4.0]
    assert r.take([1]).prompt_ids == ["b"] and r.take([1]).query.shape == (1, 4)


class FlatForCats:
    """Reward 1 for every response to a prompt about a cat or a dog (a flat group), else word share."""

    name = "flat_for_cats"

    def score(self, prompts, responses):
        words = ppo_tiny.WordScorer().score(prompts, responses)[0]
        r = [1.0 if ("cat" in p or "dog" in p) else float(w) + 0.01 * len(x) for p, x, w in
             zip(prompts, responses, words)]
        return torch.tensor(r), torch.ones(len(r))


@pytest.mark.usefixtures("one_torch_thread")
def test_flat_groups_are_dropped_and_refilled_and_every_token_is_counted(tmp_path):
    from rlhf.pipeline.ppo.trainer import PPOTrainer, RunPaths, hooks_for

    cfg = build(PPOConfig, {**ppo_tiny.PARAMS, "total_steps": 3, "max_new_tokens": 4,
                            "advantage_estimator": "grpo", "group_size": 2,
                            "whiten_advantages": False, "dynamic_sampling_on": True}, "ppo")
    tok = ppo_tiny.tokenizer()
    prompts = [(f"p{i:02d}", p) for i, p in enumerate(ppo_tiny.PROMPTS)]
    from rlhf.pipeline.ppo.features import FeatureContext, build_hooks

    hooks = build_hooks(cfg, FeatureContext(cfg, tokenizer=tok, prompts=prompts))
    assert hooks.names() == ["dynamic_sampling"]
    tr = PPOTrainer(cfg, ppo_tiny.policy(tok), ppo_tiny.policy(tok), tok, FlatForCats(),
                    prompts, RunPaths(tmp_path / "run", tmp_path / "rows", "dapo"), hooks=hooks)
    tr.train()
    m = [json.loads(x) for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert all(x["rollouts_trained"] <= 4 for x in m)
    flat, refilled = sum(x["groups_flat"] for x in m), sum(x["rollouts_refilled"] for x in m)
    assert flat > 0 and refilled > 0
    # every generated token is counted: the refills' included, more than the batches kept
    assert sum(x["tokens_generated"] for x in m) > sum(x["tokens_trained"] for x in m)
    from rlhf.store.io import read_table

    rows = read_table("rollouts", tmp_path / "rows").to_pylist()
    assert len(rows) == 12  # the stored batch stays 4 rows a step
    with pytest.raises(ValueError, match="needs a group estimator"):
        hooks_for(PPOConfig(dynamic_sampling_on=True))
