"""Seed 000 §2.2's replay buffer (pipeline/ppo/features/replay.py) on the real trainer and the
tiny world of tests/ppo_tiny.py: the buffer fills with valid rows and evicts the oldest, draws
without replacement and reproducibly, the update's old log-probs of a replayed row are the
stored ones (not the current policy's), replayed rows are counted as replayed and never as
generated, and a resumed run restores the buffer."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from rlhf.pipeline.config import ConfigError
from rlhf.pipeline.ppo import checkpoint, core
from rlhf.pipeline.ppo.config import PPOConfig, plain
from rlhf.pipeline.ppo.features.replay import ReplayBuffer, replay_rows
from rlhf.pipeline.ppo.rollout import Rollout
from test_ppo_trainer import make_trainer, metrics

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def rollout(n: int, valid: list[bool], tag: str) -> Rollout:
    """A scored rollout after its log-prob pass, rows told apart by `tag` and their index."""
    T = 3
    r = Rollout(prompt_ids=[f"{tag}{i}" for i in range(n)], prompts=["q"] * n,
                responses=[f"{tag}{i}" for i in range(n)], query=torch.ones(n, 2, dtype=torch.long),
                query_mask=torch.ones(n, 2, dtype=torch.long),
                response=torch.full((n, T), 5, dtype=torch.long),
                response_mask=torch.ones(n, T, dtype=torch.bool), valid=torch.tensor(valid),
                flags=[[] for _ in range(n)], policy_version=f"v-{tag}",
                escalated=torch.zeros(n, dtype=torch.bool),
                extras={"generated_tokens": [T] * n, "drafted": [2] * n, "accepted": [1] * n})
    for f in ("scores", "confidence", "level1_scores", "level1_confidence"):
        setattr(r, f, torch.arange(n, dtype=torch.float32))
    for f in ("logprobs", "ref_logprobs", "kl", "entropy"):
        setattr(r, f, -torch.rand(n, T))
    return r


def test_the_buffer_keeps_valid_rows_and_evicts_the_oldest():
    buf = ReplayBuffer(size=5, fraction=0.5, seed=0, pad_id=0)
    buf.push(rollout(4, [True, False, True, True], "a"), step=1)
    assert [row["prompt_id"] for row in buf.rows] == ["a0", "a2", "a3"]  # no fallback row
    buf.push(rollout(4, [True] * 4, "b"), step=2)
    assert [row["prompt_id"] for row in buf.rows] == ["a3", "b0", "b1", "b2", "b3"]
    assert buf.rows[0]["step"] == 1 and buf.rows[0]["version"] == "v-a"


def test_draws_wait_for_a_full_share_and_are_reproducible_without_replacement():
    buf = ReplayBuffer(size=100, fraction=0.5, seed=3, pad_id=0)
    assert replay_rows(8, 0.5) == 4 and replay_rows(4, 0.3) == 1
    buf.push(rollout(3, [True] * 3, "a"), step=1)
    assert buf.replayed(2, 8) == 0  # 3 stored, 4 wanted: everything sampled afresh
    buf.push(rollout(8, [True] * 8, "b"), step=2)
    assert buf.replayed(3, 8) == 4
    first = [row["prompt_id"] for row in buf.draw(3, 4)]
    assert len(set(first)) == 4 and first == [row["prompt_id"] for row in buf.draw(3, 4)]
    assert any([row["prompt_id"] for row in buf.draw(s, 4)] != first for s in range(4, 9))


def test_mix_appends_stored_rows_with_their_stored_logprobs_and_counts_them():
    from rlhf.pipeline.ppo.accounting import StepCost

    buf = ReplayBuffer(size=100, fraction=0.5, seed=0, pad_id=0)
    old = rollout(4, [True] * 4, "a")
    buf.push(old, step=1)
    fresh = rollout(2, [True, True], "b")
    assert buf.replayed(2, 4) == 2
    cost = StepCost()
    mixed = buf.mix(2, fresh, cost)
    assert len(mixed) == 4 and cost.rollouts_replayed == 2
    for i in (2, 3):
        j = int(mixed.prompt_ids[i][1])
        assert torch.equal(mixed.logprobs[i], old.logprobs[j])
        assert torch.equal(mixed.kl[i], old.kl[j]) and float(mixed.scores[i]) == j
        assert mixed.flags[i] == ["replayed"] and mixed.extras["generated_tokens"][i] == 0
        assert mixed.extras["drafted"][i] == mixed.extras["accepted"][i] == 0
    assert mixed.extras["drafted"][:2] == [2, 2]  # the fresh rows keep their own
    assert mixed.extras["policy_version"] == [None, None, "v-a", "v-a"]
    assert [row["prompt_id"] for row in buf.rows][-2:] == ["b0", "b1"]  # the fresh ones stored


def test_config_checks_are_one_line_errors():
    assert plain(PPOConfig(replay_on=True)).replay_on is False
    with pytest.raises(ConfigError, match="replay_fraction"):
        PPOConfig(replay_on=True, batch_size=4, mini_batch_size=2, replay_fraction=0.1)
    with pytest.raises(ConfigError, match="group_size 1"):
        PPOConfig(replay_on=True, advantage_estimator="grpo", group_size=4, batch_size=8,
                  whiten_advantages=False)
    with pytest.raises(ConfigError, match="replay_size"):
        PPOConfig(replay_on=True, replay_size=2)


def test_replayed_rows_train_on_their_stored_logprobs_and_are_not_generated(tmp_path,
                                                                            monkeypatch):
    tr = make_trainer(tmp_path, total_steps=4, replay_on=True, replay_fraction=0.5,
                      engine="native", ppo_epochs=1)
    buf = next(h for h in tr.hooks.replay)
    mixed, olds = [], []
    real_mix, real_loss = buf.mix, core.policy_loss

    def mix(step, r, cost):
        out = real_mix(step, r, cost)
        mixed.append(out)
        return out

    def loss(logp, old, *args, **kw):
        olds.append(old.detach().clone())
        return real_loss(logp, old, *args, **kw)

    monkeypatch.setattr(buf, "mix", mix)
    monkeypatch.setattr(core, "policy_loss", loss)
    tr.train()
    m = metrics(tmp_path)
    assert [x["rollouts_replayed"] for x in m] == [0, 2, 2, 2]
    assert [x["rollouts_started"] for x in m] == [4, 2, 2, 2]
    assert [x["rollouts_trained"] for x in m] == [4, 4, 4, 4]
    assert m[-1]["rollouts_replayed_cum"] == 6
    trained_old = torch.cat([o.flatten() for o in olds])
    last = mixed[-1]
    for i in range(2, 4):  # the replayed rows of step 4
        n = int(last.response_mask[i].sum())
        stored = last.logprobs[i, :n]
        # the update saw the stored old log-probs ...
        assert all(bool((trained_old == x).any()) for x in stored)
        # ... which are not the current policy's (it has moved since)
        with torch.no_grad():
            now = torch.log_softmax(tr._logits(tr.policy.eval(), last, torch.tensor([i])), -1)
        now = now[0, :n].gather(1, last.response[i, :n, None]).squeeze(1)
        assert (now - stored).abs().max() > 1e-4
    from rlhf.store.io import read_table

    rows = read_table("rollouts", tmp_path / "rollouts").to_pylist()
    replayed = [r for r in rows if "replayed" in r["flags"]]
    assert len(replayed) == 6 and all(r["generated_tokens"] == 0 for r in replayed)
    # drafted at the step that generated them: 0 here (that step's row holds the counts)
    assert all(r["drafted"] == r["accepted"] == 0 for r in replayed)
    assert all(r["checkpoint_id"] != f"test-run/policy-{r['step'] - 1:06d}" for r in replayed)
    gen = sum(r["generated_tokens"] for r in rows)
    assert gen == m[-1]["tokens_generated_cum"]


def test_a_resumed_run_restores_the_buffer(tmp_path):
    from rlhf.store.io import read_table

    def replayed_at_3():
        rows = read_table("rollouts", tmp_path / "rollouts").to_pylist()
        return sorted((r["prompt_id"], r["response_key"], r["checkpoint_id"]) for r in rows
                      if r["step"] == 3 and "replayed" in r["flags"])

    kw = {"total_steps": 3, "replay_on": True, "checkpoint_every": 2, "engine": "native"}
    make_trainer(tmp_path, **kw).train()
    state = json.loads((tmp_path / "run" / "checkpoints" / "step-000002" /
                        "trainer_state.json").read_text())
    saved = state["hooks"]["replay"]["rows"]
    assert len(saved) == 6 and {r["step"] for r in saved} == {1, 2}
    uninterrupted = replayed_at_3()
    assert len(uninterrupted) == 2
    # as if killed after step 3's rows, before its checkpoint: the latest is step 2's
    ckpts = tmp_path / "run" / "checkpoints"
    shutil.rmtree(ckpts / "step-000003")
    (ckpts / "latest").write_text("step-000002")
    resumed = make_trainer(tmp_path, **kw)
    assert checkpoint.load(resumed) == 2 and resumed.hooks.replay[0].rows == saved
    make_trainer(tmp_path, **kw).train(resume=True)  # step 3 again, from the checkpoint
    assert replayed_at_3() == uninterrupted
