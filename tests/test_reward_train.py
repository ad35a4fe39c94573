"""One RM trained with TRL's RewardTrainer on a tiny model: the pairwise loss goes down, and the
scorer (ensemble, references, confidence) saves and loads."""

from __future__ import annotations

import pytest
import torch
from tiny_world import toy_pairs, write_model_config, write_tokenizer


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from rlhf.pipeline.policy import load_tokenizer

    d = tmp_path_factory.mktemp("rm")
    tok = load_tokenizer(write_tokenizer(d / "tokenizer"))
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(write_model_config(d / "mc", len(tok)))
    return d, tok, cfg


@pytest.mark.slow
def test_pairwise_loss_decreases_and_scorer_roundtrip(tiny, tmp_path):
    from rlhf.pipeline.reward.scorer import load_scorer, save_scorer
    from rlhf.pipeline.reward.train import RmTrainConfig, init_rm, pairwise_loss, train_rm

    _, tok, config = tiny
    train, held = toy_pairs(96, seed=0), toy_pairs(32, seed=1)
    cfg = RmTrainConfig(epochs=4, learning_rate=3e-3, batch_size=16, max_length=64)
    members = []
    for i in range(2):
        model = init_rm(config=config, seed=i)
        before = pairwise_loss(model, tok, train, cfg.max_length)
        model, log = train_rm(model, tok, train, cfg, seed=i)
        after = pairwise_loss(model, tok, train, cfg.max_length)
        assert after["loss"] < before["loss"] - 0.2, (before, after)
        assert any("loss" in x for x in log)
        assert pairwise_loss(model, tok, held, cfg.max_length)["accuracy"] >= 0.8
        model.save_pretrained(tmp_path / f"member_{i}")
        tok.save_pretrained(tmp_path / f"member_{i}")
        members.append(model)
    save_scorer(tmp_path, ["member_0", "member_1"], [0.5, -0.5], temperature=2.0,
                aggregation="mean", max_length=cfg.max_length)
    scorer = load_scorer(tmp_path)
    prompts = [p["prompt"] for p in held[:6]]
    good, bad = [p["chosen"] for p in held[:6]], [p["rejected"] for p in held[:6]]
    r_good, c_good = scorer(prompts, good)
    r_bad, _ = scorer(prompts, bad)
    assert r_good.shape == (6,) and c_good.shape == (6,)
    assert float((r_good > r_bad).float().mean()) >= 0.8
    assert torch.all((c_good >= 0) & (c_good <= 1))
    m = scorer.member_rewards(prompts, good)
    assert m.shape == (2, 6)
    assert torch.allclose(r_good, m.mean(0))
    r_min, _ = scorer(prompts, good, aggregation="min")
    assert torch.all(r_min <= r_good + 1e-6)
    # the saved reference is subtracted: member 0's reward is its raw score - 0.5
    from rlhf.pipeline.reward.scorer import batch_scores, encode_texts

    raw = batch_scores(scorer.models[0], tok, encode_texts(tok, prompts, good, cfg.max_length))
    assert torch.allclose(m[0], raw - 0.5, atol=1e-5)
    # scoring is independent of the batch it is in
    alone, _ = scorer(prompts[:1], good[:1])
    assert torch.allclose(alone, r_good[:1], atol=1e-4)
