"""The PPO math on hand-computed tensors, and GAE against TRL 1.12's recorded advantages."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from rlhf.pipeline.decode import full_kl, token_entropy, token_logprobs
from rlhf.pipeline.ppo import core

DATA = Path(__file__).parent / "data"


def test_masked_mean_var_whiten_by_hand():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 4.0, -50.0]])
    m = torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    assert core.masked_mean(x, m).item() == pytest.approx(2.5)
    assert core.masked_mean(x, m, dim=1).tolist() == pytest.approx([1.5, 3.5])
    # values 1,2,3,4: mean 2.5, squared deviations sum 5, unbiased var 5/3, biased 5/4
    assert core.masked_var(x, m).item() == pytest.approx(5 / 3)
    assert core.masked_var(x, m, unbiased=False).item() == pytest.approx(5 / 4)
    w = core.masked_whiten(x, m)
    s = math.sqrt(5 / 3)
    assert w[m].tolist() == pytest.approx([(v - 2.5) / s for v in (1, 2, 3, 4)], rel=1e-6)
    assert w[~m].tolist() == [0.0, 0.0]  # padding never leaks, however large
    w_keep = core.masked_whiten(x, m, shift_mean=False)
    assert w_keep[m].tolist() == pytest.approx([(v - 2.5) / s + 2.5 for v in (1, 2, 3, 4)],
                                                rel=1e-6)
    with pytest.raises(ValueError):
        core.masked_var(x, torch.tensor([[1, 0, 0], [0, 0, 0]], dtype=torch.bool))


def test_per_token_rewards_put_score_on_last_real_token():
    kl = torch.tensor([[0.1, 0.2, 0.3, 9.0], [0.5, 9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
    r = core.per_token_rewards(torch.tensor([2.0, -1.0]), kl, mask, kl_coef=0.1)
    expected = [[-0.01, -0.02, -0.03 + 2.0, 0.0], [-0.05 - 1.0, 0.0, 0.0, 0.0]]
    assert r.tolist()[0] == pytest.approx(expected[0])
    assert r.tolist()[1] == pytest.approx(expected[1])
    with pytest.raises(ValueError):
        core.last_token_index(torch.tensor([[0, 0]], dtype=torch.bool))


def test_gae_by_hand():
    # one sequence of 3 real tokens + 1 pad; gamma 0.9, lam 0.5
    r = torch.tensor([[0.0, 0.0, 1.0, 5.0]])
    v = torch.tensor([[0.5, 0.4, 0.2, 7.0]])
    m = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    adv, ret = core.gae(r, v, m, gamma=0.9, lam=0.5)
    d2 = 1.0 - 0.2  # terminal: next value 0, padding value 7.0 ignored
    d1 = 0.0 + 0.9 * 0.2 - 0.4
    d0 = 0.0 + 0.9 * 0.4 - 0.5
    a2 = d2
    a1 = d1 + 0.45 * a2
    a0 = d0 + 0.45 * a1
    assert adv.tolist()[0] == pytest.approx([a0, a1, a2, 0.0])
    assert ret.tolist()[0] == pytest.approx([a0 + 0.5, a1 + 0.4, a2 + 0.2, 0.0])
    # lam = 1, gamma = 1: advantage = Monte-Carlo return - V
    adv1, ret1 = core.gae(r, v, m, gamma=1.0, lam=1.0)
    assert adv1.tolist()[0][:3] == pytest.approx([0.5, 0.6, 0.8])
    assert ret1.tolist()[0][:3] == pytest.approx([1.0, 1.0, 1.0])
    # lam = 0: one-step TD errors
    adv0, _ = core.gae(r, v, m, gamma=0.9, lam=0.0)
    assert adv0.tolist()[0][:3] == pytest.approx([d0, d1, d2])


@pytest.mark.parametrize("case", ["k1", "k3"])
def test_gae_matches_trl_1_12_recorded_advantages(case):
    """trl==1.12.0 experimental PPO (ppo_trainer.py L762-798), recorded in tests/data (see note)."""
    fixture = json.loads((DATA / "trl112_gae.json").read_text())
    rec = fixture["cases"][case]
    i, o = rec["inputs"], rec["outputs"]
    logp, ref = torch.tensor(i["logprobs"]), torch.tensor(i["ref_logprobs"])
    values, scores = torch.tensor(i["values"]), torch.tensor(i["scores"])
    T = logp.shape[1]
    seq = torch.tensor(i["sequence_lengths"])
    idx = torch.arange(T).expand(len(seq), T)
    token_mask = idx <= seq[:, None]  # TRL's ~padding_mask
    value_mask = idx <= (seq[:, None] + 1)  # TRL's ~padding_mask_p1: values + score live here
    assert (~token_mask).tolist() == o["padding_mask"]
    # our estimator on the same (masked) log-probs
    kl = core.kl_estimate(logp, ref, i["kl_estimator"]) * token_mask
    assert torch.allclose(kl, torch.tensor(o["kl"]), atol=1e-6)
    rewards = core.per_token_rewards(scores, kl, value_mask, i["kl_coef"])
    assert torch.allclose(rewards, torch.tensor(o["rewards"]), atol=1e-6)
    adv, ret = core.gae(rewards, values, value_mask, i["gamma"], i["lam"])
    assert torch.allclose(ret, torch.tensor(o["returns"]) * value_mask, atol=1e-5)
    white = core.masked_whiten(adv, token_mask)
    assert torch.allclose(white, torch.tensor(o["advantages"]), atol=1e-5)


def test_policy_loss_by_hand():
    new = torch.log(torch.tensor([[1.5, 0.5, 1.0, 1.0]]))
    old = torch.zeros(1, 4)
    adv = torch.tensor([[1.0, 1.0, -1.0, 3.0]])
    m = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    loss, clipfrac, approx_kl = core.policy_loss(new, old, adv, m, clip_range=0.2)
    # token 0: ratio 1.5, A=1 -> max(-1.5, -1.2) = -1.2 (clipped)
    # token 1: ratio 0.5, A=1 -> max(-0.5, -0.8) = -0.5 (not clipped)
    # token 2: ratio 1.0, A=-1 -> 1.0 ; token 3 is padding
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 1.0) / 3)
    assert clipfrac.item() == pytest.approx(1 / 3)
    lr = [math.log(1.5), math.log(0.5), 0.0]
    assert approx_kl.item() == pytest.approx(sum(0.5 * x * x for x in lr) / 3)
    new.requires_grad_(True)
    core.policy_loss(new, old, adv, m, 0.2)[0].backward()
    # the clipped token and the padding token give no gradient
    assert new.grad[0, 0].item() == 0.0 and new.grad[0, 3].item() == 0.0
    assert new.grad[0, 1].item() == pytest.approx(-0.5 / 3)


def test_value_loss_by_hand():
    v = torch.tensor([[1.0, 0.0, 3.0]])
    old = torch.tensor([[0.5, 0.0, 0.0]])
    ret = torch.tensor([[0.0, 2.0, 0.0]])
    m = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    loss, clipfrac = core.value_loss(v, old, ret, m, clip_range_value=0.2)
    # token 0: e(V)=1, V_clip = 0.7, e=0.49 -> 1 ; token 1: 4 and 4 -> 4
    assert loss.item() == pytest.approx(0.5 * (1 + 4) / 2)
    assert clipfrac.item() == 0.0
    loss_nc, _ = core.value_loss(v, old, ret, m, clip_range_value=None)
    assert loss_nc.item() == pytest.approx(0.5 * (1 + 4) / 2)
    # Huber (delta 1): token 0 err 1 -> 0.5 ; token 1 err 2 -> 1*(2-0.5)=1.5
    hub, _ = core.value_loss(v, old, ret, m, clip_range_value=None, kind="huber")
    assert hub.item() == pytest.approx((0.5 + 1.5) / 2)
    # clipping raises the loss when the clipped prediction is further away
    v2 = torch.tensor([[1.0, 0.0, 0.0]])
    old2 = torch.tensor([[-1.0, 0.0, 0.0]])
    ret2 = torch.tensor([[1.0, 0.0, 0.0]])
    l2, cf2 = core.value_loss(v2, old2, ret2, m, clip_range_value=0.2)
    assert l2.item() == pytest.approx(0.5 * (1.8**2 + 0) / 2)
    assert cf2.item() == pytest.approx(0.5)
    with pytest.raises(ValueError):
        core.value_loss(v, old, ret, m, kind="l1")


def test_kl_estimators_by_hand_and_unbiased_against_full_kl():
    logp = torch.tensor([[math.log(0.5), math.log(0.25)]])
    ref = torch.tensor([[math.log(0.25), math.log(0.5)]])
    assert core.kl_estimate(logp, ref, "k1").tolist()[0] == pytest.approx([math.log(2), -math.log(2)])
    assert core.kl_estimate(logp, ref, "k2").tolist()[0] == pytest.approx(
        [0.5 * math.log(2) ** 2] * 2)
    assert core.kl_estimate(logp, ref, "k3").tolist()[0] == pytest.approx(
        [0.5 - 1 + math.log(2), 2 - 1 - math.log(2)])
    with pytest.raises(ValueError):
        core.kl_estimate(logp, ref, "k4")
    # exact KL by hand: p = (0.5, 0.25, 0.25), q = (0.25, 0.5, 0.25)
    p = torch.tensor([0.5, 0.25, 0.25])
    q = torch.tensor([0.25, 0.5, 0.25])
    exact = 0.5 * math.log(2) + 0.25 * math.log(0.5)
    kl = full_kl(p.log().view(1, 1, 3), q.log().view(1, 1, 3))
    assert kl.item() == pytest.approx(exact)
    # k1 and k3 are unbiased: their expectation under p (enumerated exactly) is the full KL
    tokens = torch.arange(3).view(1, 3)
    lp = token_logprobs(p.log().expand(1, 3, 3), tokens)
    lq = token_logprobs(q.log().expand(1, 3, 3), tokens)
    for kind in ("k1", "k3"):
        assert (p * core.kl_estimate(lp, lq, kind)[0]).sum().item() == pytest.approx(exact)
    assert full_kl(p.log().view(1, 1, 3), p.log().view(1, 1, 3)).item() == pytest.approx(0)


def test_truncated_top_k_distributions_are_refused():
    logits = torch.randn(2, 3, 10)
    full = torch.log_softmax(logits, -1)
    core.check_full_distribution(full, vocab_size=10)
    top5 = full.topk(5, dim=-1).values  # a truncated distribution (seed 000 §5.4)
    with pytest.raises(ValueError, match="5.4"):
        core.check_full_distribution(top5, vocab_size=10)
    with pytest.raises(ValueError, match="sum to 1"):
        core.check_full_distribution(top5)
    with pytest.raises(ValueError, match="vocabular"):
        full_kl(logits, logits[..., :5])


def test_token_entropy_by_hand():
    uniform = torch.zeros(1, 1, 8)
    assert token_entropy(uniform).item() == pytest.approx(math.log(8))
    peaked = torch.tensor([[[0.0, -1e4, -1e4]]])
    assert token_entropy(peaked).item() == pytest.approx(0.0, abs=1e-6)
