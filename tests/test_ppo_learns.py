"""PPO learns: on a tiny Llama and a reward that pays for "good/great/nice/happy" words, the
proxy reward rises, for plain PPO and for the seed features on (light critic, λ-ε table,
adaptive clip, KL warm-up). A trainer that runs but does not learn fails here."""

from __future__ import annotations

import json
import pytest

import ppo_tiny
from rlhf.pipeline.config import build
from rlhf.pipeline.ppo.config import PPOConfig, features_on, plain
from rlhf.pipeline.ppo.trainer import PPOTrainer, RunPaths

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

LEARN = {**ppo_tiny.PARAMS, "total_steps": 24, "batch_size": 8, "mini_batch_size": 4,
         "ppo_epochs": 2, "max_new_tokens": 6, "learning_rate": 3e-3, "critic_learning_rate": 3e-3,
         "kl_coef": 0.01, "kl_warmup_steps": 4, "critic": "light", "checkpoint_every": 24,
         "csv_every": 24}


def _reward_curve(tmp_path, cfg) -> list[float]:
    tok = ppo_tiny.tokenizer()
    prompts = [(f"p{i:02d}", p) for i, p in enumerate(ppo_tiny.PROMPTS)]
    tr = PPOTrainer(cfg, ppo_tiny.policy(tok), ppo_tiny.policy(tok), tok, ppo_tiny.WordScorer(),
                    prompts, RunPaths(tmp_path / "run", tmp_path / "rows", "learn"))
    tr.train()
    rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x)["reward_mean"] for x in rows]


@pytest.mark.parametrize("arm", ["plain", "seed"])
def test_proxy_reward_rises(tmp_path, arm):
    seed_cfg = build(PPOConfig, LEARN, "ppo")
    cfg = plain(seed_cfg) if arm == "plain" else seed_cfg
    assert bool(features_on(cfg)) == (arm == "seed")
    curve = _reward_curve(tmp_path, cfg)
    first, last = sum(curve[:6]) / 6, sum(curve[-6:]) / 6
    assert last > first + 0.1, (first, last, curve)
