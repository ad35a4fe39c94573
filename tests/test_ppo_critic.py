"""The lightweight critic (seed 000 §3.2, §5.3) and the full critic, on tiny real models."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf.pipeline.ppo import critic as cr

PAD = 0


def tiny_light(**kw):
    torch.manual_seed(0)
    args = dict(vocab_size=50, hidden_size=64, num_layers=2, num_heads=4, max_tokens=16,
                pad_id=PAD)
    args.update(kw)
    return cr.LightCritic(**args).eval()


def test_pack_right_truncates_and_pads_only_to_batch_max():
    ids, mask, start = cr.pack_right([[5, 6], [7]], [[8, 9, 10], [11]], PAD, max_tokens=4)
    assert ids.tolist() == [[5, 6, 8, 9], [7, 11, PAD, PAD]]
    assert mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert start.tolist() == [2, 1]
    ids, mask, _ = cr.pack_right([[5], [7]], [[8], [9]], PAD, max_tokens=256)
    assert ids.shape == (2, 2)  # never padded up to 256


def test_response_values_are_the_state_before_each_token():
    values = torch.tensor([[10.0, 11, 12, 13], [20, 21, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    # row 0: prompt of 2, response of 4 tokens, truncated window of 4 (tokens 2, 3 beyond it)
    out = cr.response_values(values, mask, torch.tensor([2, 1]), n_response=4)
    assert out[0].tolist() == [11, 12, 13, 13]
    assert out[1].tolist() == [20, 21, 21, 21]


def test_check_attention_mask_catches_bad_masks():
    ids = torch.tensor([[4, 5, PAD], [6, PAD, PAD]])
    cr.check_attention_mask(ids, torch.tensor([[1, 1, 0], [1, 0, 0]]), PAD)
    bad = {
        "all ones": torch.tensor([[1, 1, 1], [1, 1, 1]]),  # seed §5.3: padding attended
        "empty row": torch.tensor([[1, 1, 0], [0, 0, 0]]),
        "left padding": torch.tensor([[0, 1, 1], [1, 0, 0]]),
        "not 0/1": torch.tensor([[2, 1, 0], [1, 0, 0]]),
    }
    for name, m in bad.items():
        with pytest.raises(AssertionError):
            cr.check_attention_mask(ids, m, PAD)
    with pytest.raises(AssertionError, match="non-pad"):
        cr.check_attention_mask(torch.tensor([[4, 5, 9]]), torch.tensor([[1, 1, 0]]), PAD)


def test_padding_is_never_attended():
    model = tiny_light()
    alone_ids, alone_mask, _ = cr.pack_right([[3, 4]], [[5]], PAD, 16)
    batch_ids, batch_mask, _ = cr.pack_right([[3, 4], [6, 7, 8, 9]], [[5], [10, 11]], PAD, 16)
    with torch.no_grad():
        alone = model(alone_ids, alone_mask)
        batched = model(batch_ids, batch_mask)
        # weights on padded keys change nothing either
        w = torch.ones_like(batch_mask, dtype=torch.float)
        w[0, 3:] = 1.2
        weighted_pad = model(batch_ids, batch_mask, w)
    assert torch.allclose(alone[0], batched[0, :3], atol=1e-5)
    assert batched[0, 3:].abs().sum() == 0  # padded positions report 0
    assert torch.allclose(weighted_pad, batched, atol=1e-6)
    bias = model.attention_bias(batch_mask, None)
    assert torch.isneginf(bias.view(2, 4, 6, 6)[0, :, :, 3:]).all()


def test_reward_attention_weights_from_prefix_score_increments():
    # prompt of 2 tokens, 4 response tokens with prefix scores 1.0 -> 1.5 -> 1.3 -> 2.3 -> 2.2
    scores = torch.tensor([[0.0, 1.0, 1.5, 1.3, 2.3, 2.2, 0.0]])
    resp = torch.tensor([[0, 0, 1, 1, 1, 1, 0]])
    w = cr.reward_attention_weights(scores, resp, weight_frac=0.25)
    # increments on response: +0.5, -0.2, +1.0, -0.1 -> top 1 (pos 4) high, bottom 1 (pos 3) low
    assert w[0].tolist() == pytest.approx([1.0, 1.0, 1.0, 0.8, 1.2, 1.0, 1.0])
    w_half = cr.reward_attention_weights(scores, resp, weight_frac=0.5)
    assert w_half[0].tolist() == pytest.approx([1.0, 1.0, 1.2, 0.8, 1.2, 0.8, 1.0])
    # too few response tokens for a quarter: no reweighting
    assert cr.reward_attention_weights(scores, torch.tensor([[0, 0, 1, 0, 0, 0, 0]])).eq(1).all()


def test_reward_weights_scale_attention_logits():
    model = tiny_light()
    mask = torch.tensor([[1, 1, 1, 0]])
    bias = model.attention_bias(mask, torch.tensor([[1.2, 0.8, 1.0, 1.0]])).view(1, 4, 4, 4)
    # the last real query sees every real key (causal: the first query sees only itself)
    assert bias[0, 0, 2, :3].tolist() == pytest.approx([math.log(1.2), math.log(0.8), 0.0])
    assert torch.isneginf(bias[0, 0, 0, 1:]).all()
    ids = torch.tensor([[3, 4, 5, PAD]])
    with torch.no_grad():
        plain = model(ids, mask)
        weighted = model(ids, mask, torch.tensor([[1.2, 0.8, 1.0, 1.0]]))
    assert not torch.allclose(plain, weighted)


def test_gaussian_kl_by_hand_and_critic_loss_pulls_toward_rm_distribution():
    # N(1, 1) vs N(2, 1): KL = (1 + 1) / 2 - 0.5 = 0.5 ; N(1,1) vs N(1,2): log 2 + 1/8 - 1/2
    t = torch.tensor([0.0, 2.0])
    assert cr.gaussian_kl(t, torch.tensor([1.0, 3.0]), std_floor=0).item() == pytest.approx(0.5)
    assert cr.gaussian_kl(t, torch.tensor([-1.0, 3.0]), std_floor=0).item() == pytest.approx(
        math.log(2) + 1 / 8 - 0.5)
    assert cr.gaussian_kl(t, t.clone(), std_floor=0).item() == pytest.approx(0.0, abs=1e-7)
    # a constant critic: the floor (0.1) bounds the KL: log(0.1/1) + (1 + 1) / 0.02 - 0.5
    flat = torch.tensor([0.0, 0.0])
    assert cr.gaussian_kl(t, flat).item() == pytest.approx(math.log(0.1) + 2 / 0.02 - 0.5)
    values = torch.tensor([[0.5, 0.2, 0.0], [0.1, 0.9, 0.3]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    returns = torch.tensor([[1.0, 1.0, 0.0], [2.0, 2.0, 2.0]])
    rm = torch.tensor([1.0, 2.0])
    base, _ = cr.critic_loss(values, values.detach(), returns, mask, rm, None, 1.0, 0.0)
    loss, stats = cr.critic_loss(values, values.detach(), returns, mask, rm, None, 1.0, 0.5)
    assert stats["critic_kl_reg"] > 0
    assert loss.item() == pytest.approx(base.item() + 0.5 * stats["critic_kl_reg"])


def test_light_critic_trains_and_default_is_the_seed_size():
    model = tiny_light().train()
    ids, mask, start = cr.pack_right([[3, 4], [6, 7, 8]], [[5, 9, 9], [10]], PAD, 16)
    returns = torch.tensor([[1.0, 1.0, 1.0], [-1.0, 0.0, 0.0]])
    rmask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    losses = []
    for _ in range(20):
        v = cr.response_values(model(ids, mask), mask, start, 3)
        loss, _ = cr.critic_loss(v, v.detach(), returns, rmask, torch.tensor([1.0, -1.0]), None,
                                 1.0, 0.1)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]
    # the default (seed §3.2): 3 layers, hidden 1024, 256-token window; constructed, not trained
    big = cr.build_critic("light", vocab_size=64, pad_id=PAD)
    assert len(big.encoder.layers) == 3 and big.embed.embedding_dim == 1024
    ids = torch.randint(1, 64, (1, 300))
    with torch.no_grad():
        assert big(ids, torch.ones_like(ids)).shape == (1, 256)  # truncated, not padded


def test_full_critic_from_policy_config():
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, pad_token_id=PAD)
    torch.manual_seed(0)
    full = cr.build_critic("full", 50, PAD, policy_config=cfg).eval()
    alone_ids, alone_mask, _ = cr.pack_right([[3, 4]], [[5]], PAD, None)
    batch_ids, batch_mask, _ = cr.pack_right([[3, 4], [6, 7, 8, 9]], [[5], [10, 11]], PAD, None)
    with torch.no_grad():
        a = full(alone_ids, alone_mask)
        b = full(batch_ids, batch_mask)
    assert b.shape == (2, 6)
    assert torch.allclose(a[0], b[0, :3], atol=1e-5)
    with pytest.raises(ValueError):
        cr.build_critic("medium", 50, PAD)
