"""The native engine's per-step costs (pipeline/decode/llama_step.py, sampling.py). Its decode step against the
model's own forward: bit for bit the same samples, log-probs and entropies (sampled, with left
padding, rows leaving the batch, grouped-query attention), the model called once (the prefill)
instead of once a step, and the model's own forward wherever the step could not reproduce it.
Top-p that orders only the nucleus' edge: the warper's nucleus, and draws that follow it exactly (chi-square;
two wrong samplers fail it)."""

from __future__ import annotations

import itertools

import pytest
import torch
from ppo_tiny import PROMPTS, llama_config, tokenizer
from rlhf.pipeline.decode import (
    FastDecoder,
    Sampling,
    encode_prompts,
    native_generate,
    position_ids,
    top_p_sample,
)
from scipy.stats import chi2
from transformers import (
    DynamicCache,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    TopPLogitsWarper,
)

SAMPLING = Sampling(temperature=0.8, top_p=0.95, max_new_tokens=12)
N_DRAWS = 20_000


def _eos_biased(model, tok, bias: float = 2.0):
    """Raise the eos logit so rows stop at varied lengths (and leave the batch)."""
    with torch.no_grad():
        probe = torch.randint(4, len(tok), (8, 6))
        h = model(probe, output_hidden_states=True).hidden_states[-1].mean((0, 1))
        model.lm_head.weight[tok.eos_token_id] += bias * h / h.norm() ** 2
    return model


def _llama(tok, **kw):
    torch.manual_seed(0)
    return _eos_biased(LlamaForCausalLM(llama_config(tok, **kw)).eval(), tok)


def _qwen2(tok):
    """Grouped-query attention (4 heads over 2 key-value heads) and q/k/v biases."""
    torch.manual_seed(1)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=128, pad_token_id=tok.pad_token_id,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      tie_word_embeddings=False)
    return _eos_biased(Qwen2ForCausalLM(cfg).eval(), tok)


class _Calls:
    """Counts the model's forward calls."""

    def __init__(self, model):
        self.n = 0
        self.handle = model.register_forward_hook(self)

    def __call__(self, *args):
        self.n += 1


@pytest.fixture(scope="module")
def tok():
    return tokenizer()


@pytest.mark.parametrize("make", [_llama, _qwen2], ids=["llama", "qwen2-gqa"])
@pytest.mark.parametrize("prompts", [PROMPTS[:8], ["describe the dog"] * 4],
                         ids=["left-padded", "unpadded"])
def test_same_samples_as_the_model_forward(tok, make, prompts):
    model = make(tok)
    enc = dict(encode_prompts(tok, prompts))
    evicted = False
    for seed in range(4):
        calls = _Calls(model)
        torch.manual_seed(seed)
        fast = native_generate(model, tok, enc, SAMPLING)
        fast_calls = calls.n
        torch.manual_seed(seed)
        slow = native_generate(model, tok, enc, SAMPLING, fast=False)
        calls.handle.remove()
        assert torch.equal(fast.sequences, slow.sequences)
        for name in ("logprobs", "sampled_logprobs", "entropy"):
            assert torch.equal(getattr(fast, name), getattr(slow, name)), name
        assert fast.batch_sizes == slow.batch_sizes
        assert (fast.forwards, fast.token_forwards) == (slow.forwards, slow.token_forwards)
        assert fast_calls == 1 and calls.n - fast_calls == slow.forwards  # prefill only
        evicted |= min(fast.batch_sizes) < fast.batch_sizes[0]
    assert evicted  # rows left the batch in at least one run: the selection was exercised


def test_greedy_logits_equal_the_model_with_its_cache(tok):
    """Step by step, the decoder's logits are the model's (same cache, same inputs)."""
    model = _llama(tok)
    enc = dict(encode_prompts(tok, PROMPTS[:6]))
    ids, mask = enc["input_ids"], enc["attention_mask"]
    cache = DynamicCache()
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask),
                    cache=cache, use_cache=True)
    decoder = FastDecoder.attach(model, cache, extra=8)
    assert decoder is not None
    ref_cache = DynamicCache()
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask),
              cache=ref_cache, use_cache=True)
    nxt, pos, live_mask = out.logits[:, -1].argmax(-1), mask.sum(1), mask
    for _ in range(8):
        live_mask = torch.cat([live_mask, torch.ones_like(live_mask[:, :1])], 1)
        with torch.no_grad():
            ref = model(input_ids=nxt[:, None], attention_mask=live_mask,
                        position_ids=pos[:, None], cache=ref_cache, use_cache=True).logits[:, -1]
        assert torch.equal(decoder.step(nxt[:, None], pos, live_mask), ref)
        nxt, pos = ref.argmax(-1), pos + 1


def test_models_it_cannot_reproduce_keep_the_model_forward(tok):
    enc = dict(encode_prompts(tok, PROMPTS[:4]))
    eager = _llama(tok)
    eager.config._attn_implementation = "eager"  # a different attention kernel
    training = _llama(tok).train()
    scaled = _llama(tok, rope_parameters={"rope_type": "linear", "factor": 2.0,
                                          "rope_theta": 10000.0})
    for model in (eager, training, scaled):
        cache = DynamicCache()
        with torch.no_grad():
            model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                  position_ids=position_ids(enc["attention_mask"]), cache=cache, use_cache=True)
        assert FastDecoder.attach(model, cache, extra=4) is None
    calls = _Calls(eager)
    made = native_generate(eager, tok, enc, SAMPLING)
    assert calls.n == made.forwards  # every step through the model


# --------------------------------------------------------- top-p ordering the nucleus' edge
def _nucleus_differences(batches):
    """Rows where top_p_sample's kept tokens are not the warper's, and the rows compared."""
    rows, differing = 0, []
    for top_p, scores in itertools.product((0.95, 0.3, 0.0), batches):
        want = TopPLogitsWarper(top_p)(None, scores)
        got, _ = top_p_sample(scores, top_p)
        rows += len(scores)
        same = (torch.isinf(want) == torch.isinf(got)).all(-1)
        assert torch.equal(want[same], got[same])  # kept scores are the input's own
        differing += [(top_p, scores[i], want[i], got[i])
                      for i in (~same).nonzero().flatten().tolist()]
    return rows, differing


def test_top_p_keeps_the_warpers_nucleus(tok, monkeypatch):
    """The kept tokens and their scores are TopPLogitsWarper's (top-p 0.95, 0.3 and 0: the most
    likely token only) on real decode steps of a tiny Llama and on random rows of several
    spreads (nuclei of one token to thousands; probabilities down to zero and pad-suppressed
    -inf columns). A row may differ only where the warper's cumulative probability sits on the
    bound to float rounding (the two sum the softmax in different orders). A margin that removes
    buckets unordered past the bound fails it."""
    model = _llama(tok)
    made = native_generate(model, tok, dict(encode_prompts(tok, PROMPTS)), SAMPLING,
                           keep_logits=True)
    g = torch.Generator().manual_seed(0)
    steps = made.logits.reshape(-1, made.logits.shape[-1])
    batches = [steps[steps.abs().sum(-1) > 0]]  # finished rows' zeros: every token tied
    batches += [torch.randn(256, 3000, generator=g) * s for s in (0.5, 2.0, 4.0, 8.0, 40.0)]
    batches[-1][:, :7] = -float("inf")
    rows, differing = _nucleus_differences(batches)
    for top_p, row, want, got in differing:  # rounding at the bound only
        asc, order = torch.sort(row.softmax(-1))
        cum = asc.cumsum(-1)
        moved = (torch.isinf(want) != torch.isinf(got)).nonzero().flatten()
        at = torch.nonzero(order[:, None] == moved[None, :])[:, 0]
        assert (cum[at] - (1 - top_p)).abs().max() < 1e-6
    assert rows > 1000 and len(differing) <= rows // 1000
    # wrong: buckets removed unordered up to 1.5 x (1 - top_p) cut into the nucleus
    monkeypatch.setattr("rlhf.pipeline.decode.sampling.EDGE_MARGIN", -0.5)
    assert len(_nucleus_differences(batches)[1]) > rows // 100


def _counts(tokens, vocab):
    return torch.bincount(tokens, minlength=vocab).double()


def test_top_p_sample_draws_the_nucleus_distribution(monkeypatch):
    """20,000 draws from one row whose two least likely tokens top-p removes: none of them is
    drawn, and the kept ones follow p / sum(kept p) (chi-square at p < 1e-6, fixed seed). Two
    wrong samplers fail it: the whole distribution (no top-p), and an inverse CDF fed a skewed
    uniform (u squared)."""
    p = torch.tensor([0.45, 0.25, 0.151, 0.1, 0.03, 0.019])
    scores = p.log()[None].expand(N_DRAWS, -1).contiguous()
    kept = torch.tensor([True, True, True, True, False, False])  # ascending cumsum 0.019, 0.049
    expect = (p * kept / (p * kept).sum()).double() * N_DRAWS
    bound = chi2.ppf(1 - 1e-6, int(kept.sum()) - 1)

    def statistic(tokens):
        c = _counts(tokens, len(p))
        return float(((c[kept] - expect[kept]) ** 2 / expect[kept]).sum()), float(c[~kept].sum())

    torch.manual_seed(0)
    filtered, tokens = top_p_sample(scores, 0.95)
    assert torch.equal(torch.isinf(filtered[0]), ~kept)
    stat, removed = statistic(tokens)
    assert removed == 0 and stat < bound, (stat, bound)
    torch.manual_seed(0)  # wrong: no top-p
    _, unfiltered = top_p_sample(scores, 1.0)
    assert statistic(unfiltered)[1] > 0
    rand = torch.rand
    monkeypatch.setattr(torch, "rand", lambda *a, **k: rand(*a, **k) ** 2)
    torch.manual_seed(0)  # wrong: a skewed uniform in the inverse CDF
    assert statistic(top_p_sample(scores, 0.95)[1])[0] > bound
