"""The strong RM ensemble on both cores: a member a spawned worker trains
(pipeline/reward/ensemble.py) is byte-identical to the one the inline path trains, and the
members' scores from threads (`RMEnsemble`, pipeline/reward/scorer.py) are bit-identical to the
inline ones, so `make run` may use both cores without changing the committed bytes."""

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


def _tiny_ensemble(init, tok, folder):
    """3 members of the tiny backbone, each its own seed's score head, saved as a scorer."""
    from rlhf.pipeline.reward.scorer import load_ensemble, save_scorer
    from rlhf.pipeline.reward.train import init_rm

    names = [f"member_{i}" for i in range(3)]
    for i, name in enumerate(names):
        init_rm(str(init), seed=i).save_pretrained(folder / name)
        tok.save_pretrained(folder / name)
    save_scorer(folder, names, [0.1, -0.2, 0.3], 0.5, "mean", 48)
    return load_ensemble(folder, batch_size=8)  # 350 texts: 44 chunks a member


@pytest.mark.usefixtures("one_torch_thread")  # as make run scores: one intra-op thread
def test_members_scored_in_threads_equal_the_inline_scores(tiny, tmp_path, monkeypatch, capsys):
    import torch

    from rlhf.pipeline import progress
    from rlhf.pipeline.reward.scorer import member_threads
    from rlhf.pipeline.workers import worker_pool

    init, tok, pairs = tiny
    ens = _tiny_ensemble(init, tok, tmp_path / "rm")
    # 350 distinct texts of many lengths: 1,050 member forwards, over the progress bar's 1,024
    prompts = [pairs[i % 48]["prompt"] for i in range(350)]
    responses = [f"{pairs[i % 48]['chosen']} {' '.join(['bright'] * (i % 11))} {i}"
                 for i in range(350)]

    monkeypatch.setitem(progress._state, "enabled", True)  # as the `rlhf` command runs it
    scored, bars = {}, {}
    for workers in ("1", "2"):  # the test suite's inline, make run's 0 on 2 cores
        monkeypatch.setenv("RLHF_WORKERS", workers)
        assert member_threads(ens.models) == int(workers)
        capsys.readouterr()
        ens.memo = None
        whole = ens.member_rewards(prompts, responses)
        bars[workers] = capsys.readouterr().err
        ens.memo = {}  # a stage scoring texts again (calibration, reports): each text once
        head = ens.member_rewards(prompts[:100], responses[:100])  # under the bar's 1,024
        assert "scoring" not in capsys.readouterr().err and len(ens.memo) == 100
        again = ens.member_rewards(prompts[::-1], responses[::-1])  # 250 new, 100 memoised
        assert len(ens.memo) == 350
        scored[workers] = (whole, head, again)
    for inline, threaded in zip(scored["1"], scored["2"]):
        assert torch.equal(threaded, inline)  # every bit, in member and text order
    assert not torch.equal(scored["2"][0][0], scored["2"][0][1])  # each member its own head
    for workers in ("1", "2"):  # the bar counts every (text, member) forward
        assert "scoring 350 texts x 3 RMs  1,050/1,050 texts  100%" in bars[workers]

    ens.memo, ens.precision = None, "bf16"  # reward.precision on a CPU with bf16: autocast is
    bf16 = {}  # per thread, so each job enters its own
    for workers in ("1", "2"):
        monkeypatch.setenv("RLHF_WORKERS", workers)
        bf16[workers] = ens.member_rewards(prompts, responses)
    assert torch.equal(bf16["2"], bf16["1"]) and not torch.equal(bf16["1"], scored["1"][0])

    # a job process (eval's own process beside its workers, a spawned worker) has one core:
    # it scores inline
    with worker_pool(2, beside_stage=True):
        assert member_threads(ens.models) == 1
    assert member_threads(ens.models) == 2
