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
        monkeypatch.setenv("RLHF_WORKERS", workers)
        out = tmp_path / f"w{workers}"
        logged: list[str] = []
        _, names = train_strong(_cfg(), str(init), tok, pairs, out, logged.append, "fp32",
                                tmp_path / f"ckpt{workers}")
        assert names == ["member_0", "member_1"]
        assert any("in worker processes" in m for m in logged) == (workers == "2")
        digests[workers] = [_weights_digest(out / n) for n in names]
    assert digests["1"] == digests["2"]
    assert digests["1"][0] != digests["1"][1]  # each member its own seed and bootstrap
