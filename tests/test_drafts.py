"""Drafts verified exactly: the distribution of the first three tokens under drafted decoding,
enumerated from a tiny model's logits, against 20,000 samples (chi-square at p < 1e-6, fixed
seed: deterministic), for point-mass drafts and for the self-speculative draft model's sampled
drafts; SPEC-RL's reuse rule fails the same test. Greedy drafted decoding equals the plain
native engine, and a restored lookup drafter drafts the same."""

from __future__ import annotations

import itertools
import types

import pytest
import torch
from ppo_tiny import PROMPTS, policy, tokenizer
from rlhf.pipeline.decode import (
    Drafter,
    LookupDrafter,
    ModelDrafter,
    ReuseDrafter,
    Sampling,
    drafted_generate,
    encode_prompts,
    get_generator,
)
from scipy.stats import chi2
from transformers import LlamaConfig, LlamaForCausalLM, TopPLogitsWarper

V, PAD, N = 5, 0, 20_000
PROMPT = [1, 2, 3]
SAMPLING = Sampling(1.0, 0.95, 4)  # drafts verified at tokens 2 and 3
TOK = types.SimpleNamespace(pad_token_id=PAD, eos_token_id=None)


def small_llama(layers: int):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32,
                      num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=2,
                      max_position_embeddings=16, pad_token_id=PAD, bos_token_id=None,
                      eos_token_id=None, tie_word_embeddings=False)
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        m.lm_head.weight.mul_(10.0)  # peaked distributions: drafts are accepted or not
    return m


@pytest.fixture(scope="module")
def model():
    return small_llama(1)


@pytest.fixture(scope="module")
def deep():
    """Two layers whose second moves the output far from the first's: a draft model of layer
    one alone (ModelDrafter(1)) then has a q unlike p, so many drafts are rejected."""
    m = small_llama(2)
    with torch.no_grad():
        m.model.layers[1].mlp.down_proj.weight.mul_(50.0)
    return m


def target(logits):
    s = logits.float().clone()
    s[..., PAD] = -float("inf")
    return torch.softmax(TopPLogitsWarper(SAMPLING.top_p)(None, s.reshape(-1, V)), -1
                         ).reshape(s.shape)


@pytest.fixture(scope="module")
def exact(model):
    return enumerated(model)


@pytest.fixture(scope="module")
def exact_deep(deep):
    return enumerated(deep)


def enumerated(model):
    """{(t1, t2, t3): probability} and the conditionals, by enumeration (no cache)."""
    with torch.no_grad():
        p1 = target(model(torch.tensor([PROMPT])).logits[0, -1])
        seqs = torch.tensor([PROMPT + [a, b] for a in range(V) for b in range(V)])
        lg = target(model(seqs).logits)  # [25, 5, V]
    cond = {}
    for n, (a, b) in enumerate(itertools.product(range(V), range(V))):
        cond[(a,)] = lg[n, 3]
        cond[(a, b)] = lg[n, 4]
    cond[()] = p1
    joint = {(a, b, c): float(p1[a] * cond[(a,)][b] * cond[(a, b)][c])
             for a, b, c in itertools.product(range(V), repeat=3)}
    return joint, cond


class TableDrafter(Drafter):
    """Drafts by a rule on the response so far (the test's perfect / wrong / half-right)."""

    def __init__(self, cond, pick):
        self.cond, self.pick = cond, pick

    def propose(self, rows, contexts, done, k):
        out = []
        for ctx in contexts:
            resp, d = tuple(ctx[len(PROMPT):]), []
            while len(resp) + len(d) < 3 and len(d) < k:
                d.append(self.pick(self.cond[resp + tuple(d)], len(resp) + len(d)))
            out.append(d)
        return out


def mode(p, pos):
    return int(p.argmax())


def least(p, pos):  # the least likely token top-p keeps: nearly always rejected
    q = p.clone()
    q[q == 0] = 2.0
    return int(q.argmin())


def half(p, pos):
    return mode(p, pos) if pos == 1 else least(p, pos)


def chi_square(model, joint, drafter, seed=0):
    torch.manual_seed(seed)
    enc = {"input_ids": torch.tensor([PROMPT] * N), "attention_mask": torch.ones(N, 3).long()}
    made = drafted_generate(model, TOK, enc, SAMPLING, drafter, k=2)
    counts: dict = {}
    for row in made.tokens[:, :3].tolist():
        counts[tuple(row)] = counts.get(tuple(row), 0) + 1
    big = [c for c, p in joint.items() if p * N >= 5]
    stat = sum((counts.get(c, 0) - joint[c] * N) ** 2 / (joint[c] * N) for c in big)
    rest_p = 1 - sum(joint[c] for c in big)
    rest_n = N - sum(counts.get(c, 0) for c in big)
    if rest_p * N >= 5:
        stat += (rest_n - rest_p * N) ** 2 / (rest_p * N)
        big.append("rest")
    return stat, chi2.ppf(1 - 1e-6, len(big) - 1), made


@pytest.mark.parametrize("pick", [mode, least, half], ids=["perfect", "wrong", "half"])
def test_point_mass_drafts_sample_the_policys_distribution(model, exact, pick):
    joint, cond = exact
    stat, bound, made = chi_square(model, joint, TableDrafter(cond, pick))
    assert stat < bound, (stat, bound)
    assert made.drafted > N  # the drafts were really verified
    rate = made.accepted / made.drafted
    print(pick.__name__, "acceptance", round(rate, 3), "chi2", round(stat, 1), "bound", round(bound, 1))
    if pick is mode:
        assert rate > 0.3
    if pick is least:
        assert rate < 0.1


def test_the_reuse_rule_fails_the_same_test(model, exact):
    joint, cond = exact
    best = max(joint, key=joint.get)
    old_lp = [float(torch.log(cond[()][best[0]])), float(torch.log(cond[best[:1]][best[1]])),
              float(torch.log(cond[best[:2]][best[2]]))]
    reuse = ReuseDrafter()
    reuse.prepare([list(best)] * N, [old_lp] * N)  # the policy has not moved since
    stat, bound, made = chi_square(model, joint, reuse)
    print("reuse acceptance", round(made.accepted / made.drafted, 3), "chi2", round(stat, 1),
          "bound", round(bound, 1))
    assert stat > bound, (stat, bound)
    assert made.accepted > 0


def test_model_drafts_sample_the_policys_distribution(deep, exact_deep):
    """The draft model's sampled drafts, verified with min(1, p/q) and the residual
    max(0, p - q): often rejected here (q is far from p), and the samples still the policy's."""
    joint, _ = exact_deep
    stat, bound, made = chi_square(deep, joint, ModelDrafter(1))
    rate = made.accepted / made.drafted
    print("model acceptance", round(rate, 3), "chi2", round(stat, 1), "bound", round(bound, 1))
    assert stat < bound, (stat, bound)
    assert made.drafted > N and 0.3 < rate < 0.9  # verified, and rejected often
    assert made.draft_forwards > 0 and made.draft_token_forwards >= made.drafted
    assert made.draft_share == 0.5


def test_the_residual_is_what_makes_model_drafts_exact(deep, exact_deep, monkeypatch):
    """The same test fails when a rejected draft is followed by a fresh sample from p instead of
    the residual max(0, p - q): the test can tell the exact rule from a near miss."""
    from rlhf.pipeline import decode

    real = decode.resolve

    def fresh_after_reject(drafter, p, x, u, row, pos, q=None):
        tok, ok = real(drafter, p, x, u, row, pos, q)
        return (tok, ok) if ok else (int(torch.multinomial(p, 1)), False)

    monkeypatch.setattr("rlhf.pipeline.decode.drafted.resolve", fresh_after_reject)
    stat, bound, _ = chi_square(deep, exact_deep[0], ModelDrafter(1))
    assert stat > bound, (stat, bound)


def test_greedy_model_drafts_equal_native_and_pay():
    tok = tokenizer()
    m = policy(tok)
    enc = encode_prompts(tok, PROMPTS[:6])
    s = Sampling(0.0, 1.0, 12)
    plain = get_generator("native").generate(m, tok, enc, s)
    drafter = ModelDrafter(0)  # a quarter of 2 layers: 1
    made = drafted_generate(m, tok, enc, s, drafter, k=4)
    assert made.tokens.tolist() == plain.tokens.tolist()
    assert made.accepted > 0 and made.forwards < plain.forwards
    assert made.draft_share == 0.5 and drafter.layers_of(m) == 1
    again = ModelDrafter(3)
    again.load_state_dict(drafter.state_dict())
    assert again.draft_layers == 0


def test_greedy_drafted_equals_native_and_a_restored_lookup_drafts_the_same():
    tok = tokenizer()
    m = policy(tok)
    enc = encode_prompts(tok, PROMPTS[:6])
    s = Sampling(0.0, 1.0, 12)
    plain = get_generator("native").generate(m, tok, enc, s)
    look = LookupDrafter()
    made = drafted_generate(m, tok, enc, s, look, k=4)
    assert made.tokens.tolist() == plain.tokens.tolist()
    # the drafts paid: rows reached their budget in fewer forwards and left the batch sooner
    assert made.accepted > 0 and sum(made.batch_sizes) < sum(plain.batch_sizes)
    again = LookupDrafter()
    again.load_state_dict(look.state_dict())
    ctx = [enc["input_ids"][0].tolist()[-3:]]
    assert again.propose([0], ctx, [0], 4) == look.propose([0], ctx, [0], 4)
    assert again.history == look.history and look.history


@pytest.mark.parametrize("kind", ["lookup", "reuse", "model"])
def test_drafts_are_counted_per_row(kind):
    """Each row's drafted and accepted tokens (`row_drafted` / `row_accepted`) add up to the
    batch's totals, a row never accepts more than it was proposed, and the rows differ (the
    counts are the row's own, not the batch's spread evenly). Reuse: the accepted tokens are
    the ones kept from the row's old response, so a row with no old response drafts nothing.
    The plain engines count 0 in every row."""
    tok = tokenizer()
    m = policy(tok)
    enc = encode_prompts(tok, PROMPTS[:6])
    s = Sampling(0.0, 1.0, 12)  # greedy: this random policy repeats itself, drafts are kept
    if kind == "reuse":
        drafter = ReuseDrafter()
        old = get_generator("native").generate(m, tok, enc, s)
        rows = [t[: int(n)] for t, n in zip(old.tokens.tolist(),
                                            (old.tokens != tok.pad_token_id).sum(1))]
        rows[0] = []  # no stored response: nothing to draft
        drafter.prepare(rows, [lp[: len(t)] for lp, t in zip(old.sampled_logprobs.tolist(),
                                                            rows)])
    else:
        drafter = LookupDrafter() if kind == "lookup" else ModelDrafter(0)
    made = drafted_generate(m, tok, enc, s, drafter, k=4)
    assert len(made.row_drafted) == len(made.row_accepted) == 6
    assert sum(made.row_drafted) == made.drafted > 0
    assert sum(made.row_accepted) == made.accepted > 0
    assert all(0 <= a <= d for d, a in zip(made.row_drafted, made.row_accepted))
    assert len(set(made.row_drafted)) > 1
    if kind == "reuse":
        assert made.row_drafted[0] == 0
    for name in ("hf", "native"):
        plain = get_generator(name).generate(m, tok, enc, s)
        assert plain.row_drafted == plain.row_accepted == [0] * 6
        assert plain.drafted == plain.accepted == 0
