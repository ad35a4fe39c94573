"""The strong RM ensemble trained in worker processes (pipeline/reward/ensemble.py): a member a
spawned worker trains is byte-identical to the one the inline path trains, so `make run` may
train the members on both cores without changing the committed RM bytes."""

from __future__ import annotations

import hashlib

import pytest
from tiny_world import toy_pairs, write_model_config, write_tokenizer


def _weights_digest(folder) -> str:
    return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from rlhf.pipeline.models.policy import load_tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM

    d = tmp_path_factory.mktemp("ens")
    tok = load_tokenizer(write_tokenizer(d / "tokenizer"))
    config = AutoConfig.from_pretrained(write_model_config(d / "mc", len(tok)))
    AutoModelForCausalLM.from_config(config).save_pretrained(d / "init")
    pairs = [dict(p, prompt_id=f"p{i % 12}") for i, p in enumerate(toy_pairs(48))]
    return d / "init", tok, pairs


def _cfg():
    from rlhf.pipeline.reward.stage import RewardConfig
    from rlhf.pipeline.reward.train import RmTrainConfig

    return RewardConfig(n_ensemble=2, train=RmTrainConfig(epochs=1, learning_rate=3e-3,
                                                         batch_size=16, max_length=48))


@pytest.mark.slow
def test_members_trained_in_workers_equal_the_inline_ones(tiny, tmp_path, monkeypatch):
    from rlhf.pipeline.reward.ensemble import train_strong

    init, tok, pairs = tiny
    digests = {}
    for workers in ("1", "2"):
        monkeypatch.setenv("RLHF_RM_WORKERS", workers)
        out = tmp_path / f"w{workers}"
        logged: list[str] = []
        _, names = train_strong(_cfg(), str(init), tok, pairs, out, logged.append, "fp32",
                                tmp_path / f"ckpt{workers}")
        assert names == ["member_0", "member_1"]
        assert any("in 2 processes" in m for m in logged) == (workers == "2")
        digests[workers] = [_weights_digest(out / n) for n in names]
    assert digests["1"] == digests["2"]
    assert digests["1"][0] != digests["1"][1]  # each member its own seed and bootstrap


def test_member_workers_come_from_the_environment(monkeypatch):
    from rlhf.pipeline.reward.ensemble import member_workers

    monkeypatch.delenv("RLHF_RM_WORKERS", raising=False)
    assert member_workers(3) == 1  # unset: inline (the test suite: its workers share the cores)
    monkeypatch.setenv("RLHF_RM_WORKERS", "0")  # make run: one per core
    assert 1 <= member_workers(3) <= 3 and member_workers(1) == 1
    monkeypatch.setenv("RLHF_RM_WORKERS", "5")
    assert member_workers(3) == 3
