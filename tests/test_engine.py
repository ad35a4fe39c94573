"""The native rollout engine against model.generate on a real tiny Llama (tests/ppo_tiny.py):
the same tokens under greedy decoding, stopped rows leaving the batch (counted), and the sampled
tokens' log-probs equal to the trainer's old-log-prob forward, which PPO then skips."""

from __future__ import annotations

import pytest
import torch
from ppo_tiny import PROMPTS, policy, tokenizer
from rlhf.pipeline.config import ConfigError
from rlhf.pipeline.decode import (
    Sampling,
    encode_prompts,
    get_generator,
    token_entropy,
    token_logprobs,
)
from rlhf.pipeline.ppo.accounting import StepCost
from rlhf.pipeline.ppo.config import PPOConfig
from rlhf.pipeline.ppo.generate import forward_logprobs, generate_rollout, policy_logits
from transformers import LogitsProcessor, StoppingCriteria

# float32 on CPU: the cached decode and the one-pass forward differ by summation order only
TOLERANCE = 1e-4


class ForceAt(LogitsProcessor):
    """Makes `token` the only choice of row `row` at generated step `step` (a real processor:
    the same object goes to both engines)."""

    def __init__(self, row: int, step: int, token: int):
        self.row, self.step, self.token, self.start = row, step, token, None

    def __call__(self, input_ids, scores):
        if self.start is None:
            self.start = input_ids.shape[1]
        if input_ids.shape[1] - self.start == self.step:
            scores = scores.clone()
            scores[self.row] = -1e9
            scores[self.row, self.token] = 1e9
        return scores


class StopRowAfter(StoppingCriteria):
    """Stops row `row` once it has `n` generated tokens (a per-row criterion)."""

    def __init__(self, row: int, n: int):
        self.row, self.n, self.start = row, n, None

    def __call__(self, input_ids, scores, **kw):
        if self.start is None:
            self.start = input_ids.shape[1] - 1
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool)
        done[self.row] = input_ids.shape[1] - self.start >= self.n
        return done


@pytest.fixture(scope="module")
def world():
    tok = tokenizer()
    return tok, policy(tok)


def both(model, tok, enc, sampling, make_hooks=lambda: ((), ()), **kw):
    out = {}
    for name in ("hf", "native"):
        procs, stops = make_hooks()  # fresh stateful hooks per engine
        out[name] = get_generator(name).generate(model, tok, enc, sampling,
                                                 logits_processors=procs,
                                                 stopping_criteria=stops, **kw)
    return out["hf"], out["native"]


def test_greedy_native_equals_hf_with_eos_a_stopped_row_and_left_padding(world):
    tok, model = world
    enc = encode_prompts(tok, PROMPTS[:6])
    assert (enc["attention_mask"] == 0).any()  # rows of different lengths: real left padding
    hooks = lambda: ([ForceAt(0, 2, tok.eos_token_id)], [StopRowAfter(3, 4)])
    hf, nat = both(model, tok, enc, Sampling(0.0, 1.0, 9), hooks)
    assert hf.sequences.tolist() == nat.sequences.tolist()
    assert nat.tokens[0, 2] == tok.eos_token_id and (nat.tokens[0, 3:] == tok.pad_token_id).all()
    assert (nat.tokens[3, 4:] == tok.pad_token_id).all()
    # row 0 leaves after its third token, row 3 after its fourth; the others run to the end
    assert nat.batch_sizes == [6, 6, 6, 5, 4, 4, 4, 4, 4]
    P = enc["input_ids"].shape[1]
    assert nat.token_forwards == 6 * P + sum(nat.batch_sizes[1:])
    assert hf.token_forwards == 6 * (P + 8) and nat.token_forwards < hf.token_forwards
    assert hf.forwards == nat.forwards == 9


def test_greedy_native_equals_hf_at_max_new_tokens_and_when_all_rows_stop(world):
    tok, model = world
    enc = encode_prompts(tok, PROMPTS[3:7])
    hf, nat = both(model, tok, enc, Sampling(0.0, 1.0, 3))
    assert hf.sequences.tolist() == nat.sequences.tolist() and nat.tokens.shape[1] == 3
    hooks = lambda: ([ForceAt(r, 1, tok.eos_token_id) for r in range(4)], [])
    hf, nat = both(model, tok, enc, Sampling(0.0, 1.0, 8), hooks)
    assert hf.sequences.tolist() == nat.sequences.tolist() and nat.tokens.shape[1] == 2
    assert nat.forwards == 2 and nat.batch_sizes == [4, 4]


def test_suppress_pad_in_both_engines(world):
    tok, _ = world
    model = policy(tok)
    enc = encode_prompts(tok, PROMPTS[:4])
    with torch.no_grad():  # make pad the model's favourite token at every position
        h = model(**enc, output_hidden_states=True).hidden_states[-1]
        model.lm_head.weight[tok.pad_token_id] = 50 * h.mean((0, 1)) / h.mean((0, 1)).norm()
    hf, nat = both(model, tok, enc, Sampling(0.0, 1.0, 5), suppress_pad=False)
    assert (hf.tokens == tok.pad_token_id).any()  # the precondition: pad would be sampled
    hf, nat = both(model, tok, enc, Sampling(0.0, 1.0, 5), suppress_pad=True)
    assert hf.sequences.tolist() == nat.sequences.tolist()
    assert not (nat.tokens == tok.pad_token_id).any()


def test_sampled_logprobs_equal_the_old_logprob_forward(world):
    tok, model = world
    torch.manual_seed(0)
    cfg = PPOConfig(engine="native", temperature=0.8, top_p=0.95, max_new_tokens=7,
                    max_prompt_tokens=16, kl_estimator="k1")
    r = generate_rollout(model, tok, [(f"p{i}", p) for i, p in enumerate(PROMPTS[:6])], cfg,
                         "v0", "cpu")
    sampled = r.extras["sampled"]
    logits = policy_logits(model, r, cfg.temperature)
    m = r.response_mask
    lp, ent = token_logprobs(logits, r.response) * m, token_entropy(logits) * m
    assert (sampled["logprobs"] - lp).abs().max() < TOLERANCE
    assert (sampled["entropy"] - ent).abs().max() < TOLERANCE
    assert m.sum() > 12 and (lp[m] < -0.01).all()  # real sampled tokens, not certainties


@pytest.mark.parametrize("kl", ["full", "k3"])
def test_forward_logprobs_skips_the_policy_pass_and_keeps_the_reference(world, kl):
    tok, model = world
    ref = policy(tok, seed=5)
    batch = [(f"p{i}", p) for i, p in enumerate(PROMPTS[:5])]
    cfg = PPOConfig(engine="native", temperature=0.8, top_p=0.95, max_new_tokens=6,
                    max_prompt_tokens=16, kl_estimator=kl)
    torch.manual_seed(1)
    r = generate_rollout(model, tok, batch, cfg, "v0", "cpu")
    cost = StepCost()
    forward_logprobs(model, ref, r, cfg, cost)
    assert cost.logprob_passes_saved == 1 and cost.logprob_token_forwards == 0
    assert cost.ref_token_forwards > 0
    # the same rollout through the full pass (what the hf engine does)
    r2 = generate_rollout(model, tok, batch, cfg, "v0", "cpu")
    for f in ("query", "query_mask", "response", "response_mask"):
        setattr(r2, f, getattr(r, f))
    r2.extras.pop("sampled")
    cost2 = StepCost()
    forward_logprobs(model, ref, r2, cfg, cost2)
    assert cost2.logprob_passes_saved == 0 and cost2.logprob_token_forwards > 0
    m = r.response_mask
    for f in ("logprobs", "ref_logprobs", "kl", "entropy"):
        assert (getattr(r, f) * m - getattr(r2, f) * m).abs().max() < TOLERANCE, f


def test_hf_engine_keeps_the_pass_and_counts_as_before(world):
    tok, model = world
    cfg = PPOConfig(engine="hf", temperature=0.8, top_p=0.95, max_new_tokens=5)
    cost = StepCost()
    r = generate_rollout(model, tok, [("p0", PROMPTS[0]), ("p1", PROMPTS[5])], cfg, "v0", "cpu",
                         cost=cost)
    assert "sampled" not in r.extras and cost.gen_forwards >= 1
    P = r.query.shape[1]
    assert cost.gen_token_forwards == 2 * (P + cost.gen_forwards - 1)


def test_unknown_and_missing_engines_are_one_line_errors(repo):
    import tomllib

    with pytest.raises(ConfigError, match="unknown engine"):
        get_generator("nope")
    # it once told users to install the `gpu` extra for vLLM, which that extra lacks (and vLLM
    # would not have built the engine): the message asks for no install, and no extra has vLLM
    with pytest.raises(ConfigError, match="not built yet") as err:
        get_generator("vllm")
    assert "pip install" not in str(err.value) and "extra" not in str(err.value)
    extras = tomllib.loads((repo / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert not any(d.startswith("vllm") for deps in extras.values() for d in deps)


@pytest.mark.parametrize("kl", ["full", "k3"])
def test_lookup_drafts_through_generate_rollout_are_counted_and_still_skip_the_pass(world, kl):
    tok, model = world
    ref = policy(tok, seed=5)
    cfg = PPOConfig(engine="native", draft="lookup", draft_k=3, temperature=0.8, top_p=0.95,
                    max_new_tokens=8, max_prompt_tokens=16, kl_estimator=kl)
    torch.manual_seed(2)
    cost = StepCost()
    r = generate_rollout(model, tok, [(f"p{i}", p) for i, p in enumerate(PROMPTS[:6])], cfg,
                         "v0", "cpu", cost=cost)
    assert cost.drafted_tokens > 0 and 0 <= cost.accepted_tokens <= cost.drafted_tokens
    sampled = r.extras["sampled"]["logprobs"]
    forward_logprobs(model, ref, r, cfg, cost)
    assert cost.logprob_passes_saved == 1
    lp = token_logprobs(policy_logits(model, r, cfg.temperature), r.response) * r.response_mask
    assert (sampled - lp).abs().max() < TOLERANCE
    kl_saved = r.kl.clone()
    forward_logprobs(model, ref, r, cfg, StepCost())  # no engine log-probs left: the full pass
    assert (kl_saved - r.kl).abs().max() < TOLERANCE


def test_drafts_need_the_native_engine():
    with pytest.raises(ConfigError, match="needs ppo.engine: native"):
        PPOConfig(draft="lookup")


def stopping_policy(tok, shift: float = -0.3):
    """The tiny policy with its eos logit moved along the mean hidden state, so that greedy rows
    stop at different lengths (the test asserts it)."""
    model = policy(tok)
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        h = model(**enc, output_hidden_states=True).hidden_states[-1].mean((0, 1))
        model.lm_head.weight[tok.eos_token_id] += shift * h / h.norm() ** 2
    return model


@pytest.mark.parametrize("n", [1, 3])
def test_policy_sample_greedy_native_equals_hf(world, n):
    """The sampling stages' seam (policy.sample): greedy `native` gives `hf`'s responses and
    log-probs, one or several per prompt, for fewer counted token-forwards."""
    from rlhf.pipeline.models.policy import sample

    tok, _ = world
    model = stopping_policy(tok)
    counts, outs = {}, {}
    for engine in ("hf", "native"):
        counts[engine] = {}
        outs[engine] = sample(model, tok, PROMPTS[:5], n=n, max_new_tokens=9, temperature=0.0,
                              batch_size=6, engine=engine, cost=counts[engine])
    hf, nat = outs["hf"], outs["native"]
    assert [len(s) for s in nat] == [n] * 5
    for a, b in zip(hf, nat):
        assert [s.response for s in a] == [s.response for s in b]
        assert [s.n_tokens for s in a] == [s.n_tokens for s in b]
        for x, y in zip(a, b):
            assert max(abs(u - v) for u, v in zip(x.logprobs, y.logprobs)) < TOLERANCE
    assert len({s.n_tokens for ss in nat for s in ss}) > 2  # rows stop at different lengths
    assert counts["native"]["token_forwards"] < counts["hf"]["token_forwards"]


def test_policy_sample_n_per_prompt_repeats_rows_like_num_return_sequences(world):
    """Sampled (not greedy) through hf: repeating each prompt's row n times draws what
    model.generate(num_return_sequences=n) draws under the same seed; native samples n
    responses per prompt too, each with its own log-probs."""
    from rlhf.pipeline.decode import Sampling, cut_at_eos, encode_prompts, generate
    from rlhf.pipeline.models.policy import sample

    tok, model = world
    got = sample(model, tok, PROMPTS[:4], n=3, max_new_tokens=6, temperature=0.9, seed=4,
                 engine="hf")
    enc = encode_prompts(tok, PROMPTS[:4])
    torch.manual_seed(4 * 1_000_003)
    with torch.no_grad():
        seq = generate(model, tok, enc, Sampling(0.9, 1.0, 6), num_return_sequences=3).sequences
    rows = [cut_at_eos(r, tok.eos_token_id, tok.pad_token_id)
            for r in seq[:, enc["input_ids"].shape[1]:].tolist()]
    assert [s.n_tokens for ss in got for s in ss] == [len(r) for r in rows]
    nat = sample(model, tok, PROMPTS[:4], n=3, max_new_tokens=6, temperature=0.9, seed=4,
                 engine="native")
    assert [len(s) for s in nat] == [3] * 4
    assert all(len(s.logprobs) == s.n_tokens and all(x < 0 for x in s.logprobs)
               for ss in nat for s in ss)
    assert len({s.response for ss in nat for s in ss}) > 4  # samples, not copies
