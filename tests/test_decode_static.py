"""The static engine (pipeline/decode/static.py, `engine: static`): greedy output equal to
model.generate token for token on nine architectures' shapes (tiny random models saved and
loaded, rows stopping at different steps), which path each gets, the drawn distribution against
the warper's nucleus (chi-square; a wrong nucleus fails it), the returned log-probs against a
float32 recompute, bucket compaction keeping results, the hooks and the time-out."""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from ppo_tiny import PROMPTS, tokenizer
from rlhf.pipeline.decode import (
    HFGenerator,
    StaticGenerator,
    StepSampling,
    Sampling,
    cut_at_eos,
    encode_prompts,
    get_generator,
    response_logits,
    token_entropy,
    draw,
    static_path,
    token_logprobs,
    warp,
    warp_draw,
)
from scipy.stats import chi2

GREEDY = Sampling(temperature=0.0, top_p=1.0, max_new_tokens=16)
SAMPLED = Sampling(temperature=0.8, top_p=0.9, max_new_tokens=12)


def _configs(tok):
    V = len(tok)
    ids = dict(pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
               eos_token_id=tok.eos_token_id)
    common = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  tie_word_embeddings=False, **ids)
    return {
        "llama": tf.LlamaConfig(**common),
        "qwen2": tf.Qwen2Config(**common),
        "qwen3": tf.Qwen3Config(head_dim=8, **common),
        "mistral": tf.MistralConfig(sliding_window=None, **common),
        "gemma2": tf.Gemma2Config(head_dim=8, sliding_window=4, **common),
        "phi3": tf.Phi3Config(**common),
        "gpt2": tf.GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=128,
                              **ids),
        "gpt_neox": tf.GPTNeoXConfig(vocab_size=V, hidden_size=32, intermediate_size=64,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     max_position_embeddings=128, **ids),
        "opt": tf.OPTConfig(vocab_size=V, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                            num_attention_heads=4, max_position_embeddings=128,
                            word_embed_proj_dim=32, **ids),
    }


# the path each architecture gets (a sliding-window cache layer keeps host-side state)
PATHS = {name: "static" for name in ("llama", "qwen2", "qwen3", "mistral", "phi3", "gpt2",
                                     "gpt_neox", "opt")}
PATHS["gemma2"] = "native"


@pytest.fixture(scope="module")
def tok():
    return tokenizer()


@pytest.fixture(scope="module")
def enc(tok):
    return dict(encode_prompts(tok, PROMPTS[:8]))


def _cut(tok, made):
    P = made.prompt_len
    return [cut_at_eos(row, tok.eos_token_id, tok.pad_token_id)
            for row in made.sequences[:, P:].tolist()]


def _varied_stops(model, tok, enc):
    """Raise the eos logit by the bias (of a few) under which model.generate's greedy rows stop
    at the most distinct steps, so rows leave at different steps."""
    probe = torch.randint(4, len(tok), (8, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        h = model(probe, output_hidden_states=True).hidden_states[-1].mean((0, 1))
        head = model.get_output_embeddings().weight
        base = head[tok.eos_token_id].clone()
        best = (-1, 0.0)
        for bias in (0.05, 0.1, 0.2, 0.3, 0.45):
            head[tok.eos_token_id] = base + bias * h / h.norm() ** 2
            lens = {len(r) for r in _cut(tok, HFGenerator().generate(model, tok, enc, GREEDY))}
            best = max(best, (len(lens), bias))
        head[tok.eos_token_id] = base + best[1] * h / h.norm() ** 2
    return model


@pytest.fixture(scope="module")
def models(tok, enc, tmp_path_factory):
    """Each architecture's tiny random model, saved and loaded back as a user's would be."""
    root = tmp_path_factory.mktemp("archs")
    out = {}
    for name, cfg in _configs(tok).items():
        torch.manual_seed(0)
        tf.AutoModelForCausalLM.from_config(cfg).save_pretrained(root / name)
        model = tf.AutoModelForCausalLM.from_pretrained(root / name).eval()
        out[name] = _varied_stops(model, tok, enc)
    return out


@pytest.mark.parametrize("arch", list(PATHS))
def test_greedy_equals_generate_token_for_token(models, tok, enc, arch):
    model = models[arch]
    want = _cut(tok, HFGenerator().generate(model, tok, enc, GREEDY))
    engine = StaticGenerator(check_every=2)
    made = engine.generate(model, tok, enc, GREEDY)
    assert engine.last_path.split(":")[0] == PATHS[arch] == static_path(model).split(":")[0]
    assert _cut(tok, made) == want
    if PATHS[arch] == "static":
        stats = engine.last_stats
        assert stats.max_wait <= 2 and stats.host_syncs <= stats.steps // 2 + 2
        assert stats.shapes[0] == 8 and all(s & (s - 1) == 0 for s in stats.shapes[1:])


def test_rows_stop_at_different_steps_and_compaction_keeps_results(models, tok, enc):
    """k = 1 moves the live rows to smaller buckets as they stop; k past the budget never
    compacts: the same tokens, log-probs within float32 rounding of the smaller batch."""
    model = models["qwen2"]
    lens = {len(r) for r in _cut(tok, HFGenerator().generate(model, tok, enc, GREEDY))}
    assert len(lens) >= 3
    eager, lazy = StaticGenerator(check_every=1), StaticGenerator(check_every=64)
    a, b = eager.generate(model, tok, enc, GREEDY), lazy.generate(model, tok, enc, GREEDY)
    assert len(eager.last_stats.shapes) >= 2 and lazy.last_stats.shapes == [8]
    assert lazy.last_stats.host_syncs == 1 and eager.last_stats.max_wait <= 1
    assert _cut(tok, a) == _cut(tok, b)
    T = min(a.logprobs.shape[1], b.logprobs.shape[1])
    torch.testing.assert_close(a.logprobs[:, :T], b.logprobs[:, :T], atol=1e-5, rtol=0)
    assert a.forwards <= b.forwards and sum(a.batch_sizes) < sum(b.batch_sizes)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_logprobs_equal_a_float32_full_forward(models, tok, enc, arch):
    """Sampled rows: the engine's trainer log-probs and entropies against response_logits'
    recompute of the whole sequence, within 1e-5."""
    model = models[arch]
    torch.manual_seed(3)
    made = StaticGenerator(check_every=3).generate(model, tok, enc, SAMPLED)
    rows = _cut(tok, made)
    T = max(len(r) for r in rows)
    resp = torch.full((8, T), tok.pad_token_id)
    mask = torch.zeros(8, T, dtype=torch.bool)
    for i, r in enumerate(rows):
        resp[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), True
    with torch.no_grad():
        logits = response_logits(model, enc["input_ids"], enc["attention_mask"], resp, mask,
                                 SAMPLED.temperature)
    lp, ent = token_logprobs(logits, resp), token_entropy(logits)
    assert mask.sum() > 16
    assert (made.logprobs[:, :T] - lp)[mask].abs().max() < 1e-5
    assert (made.entropy[:, :T] - ent)[mask].abs().max() < 1e-5
    assert (made.sampled_logprobs[:, :T][mask] >= made.logprobs[:, :T][mask] - 1e-5).all()


def _chi2_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    n = counts.sum()
    seen = probs > 0
    if (counts[~seen] > 0).any():
        return 0.0
    expected = probs[seen] * n
    stat = ((counts[seen] - expected) ** 2 / expected).sum()
    return float(chi2.sf(float(stat), int(seen.sum()) - 1))


def _nucleus_row():
    s = StepSampling(greedy=False, temperature=0.7, top_p=0.8, pad=None, eos=None, fill=0)
    gen = torch.Generator().manual_seed(5)
    row = torch.randn(1, 24, generator=gen) * 1.5
    want = tf.TopPLogitsWarper(0.8)(None, row / 0.7).softmax(-1)[0]
    assert (want > 0).sum() >= 3
    return s, row.expand(20_000, -1), want.double()


def test_draws_follow_the_warpers_nucleus_and_a_wrong_nucleus_fails(tok):
    """20 000 draws from one row: the warper's nucleus probabilities fit (chi-square p > 1e-3);
    the nucleus without its edge token does not."""
    s, scores, want = _nucleus_row()
    torch.manual_seed(11)
    ours = torch.bincount(draw(warp(scores, s), s), minlength=24).double()
    wrong = torch.bincount(draw(warp(scores, s, edge_dropped=True), s), minlength=24).double()
    assert _chi2_p(ours, want) > 1e-3
    assert _chi2_p(wrong, want) < 1e-6


def test_the_cpu_step_draws_the_same_nucleus_and_scores():
    """On a CPU the eager step samples with `top_p_sample` (warp_draw): its draws fit the same
    nucleus, and its warped scores are the warper's (the sampled log-probs come from them)."""
    s, scores, want = _nucleus_row()
    torch.manual_seed(11)
    warped, drawn = warp_draw(scores, s)
    assert _chi2_p(torch.bincount(drawn, minlength=24).double(), want) > 1e-3
    torch.testing.assert_close(warped.softmax(-1)[0].double(), want, atol=1e-6, rtol=0)


class _Ban:
    """A logits processor that bans one token for one row (per-row state by batch index)."""

    def __init__(self, row: int, token: int):
        self.row, self.token = row, token

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        scores[self.row, self.token] = -float("inf")
        return scores


class _StopRowAt:
    """Stops one row once it has `n` new tokens (a per-row stopping criterion)."""

    def __init__(self, row: int, n: int, prompt_len: int):
        self.row, self.n, self.P = row, n, prompt_len

    def __call__(self, input_ids, scores, **kw):
        out = torch.zeros(input_ids.shape[0], dtype=torch.bool)
        out[self.row] = input_ids.shape[1] - self.P >= self.n
        return out


def test_hooks_give_the_same_greedy_tokens_as_generate(models, tok, enc):
    model = models["llama"]
    P = enc["input_ids"].shape[1]
    first = _cut(tok, HFGenerator().generate(model, tok, enc, GREEDY))[0][0]

    def hooks():
        return dict(logits_processors=[_Ban(0, first)], stopping_criteria=[_StopRowAt(3, 2, P)])

    want = _cut(tok, HFGenerator().generate(model, tok, enc, GREEDY, **hooks()))
    engine = StaticGenerator(check_every=4)
    assert _cut(tok, engine.generate(model, tok, enc, GREEDY, **hooks())) == want
    assert engine.last_path == "static" and want[0][0] != first and len(want[3]) <= 2


def test_time_out_is_checked_every_k_steps(models, tok, enc):
    model = models["qwen2"]
    engine = StaticGenerator(check_every=3)
    made = engine.generate(model, tok, enc, GREEDY,
                           stopping_criteria=[tf.MaxTimeCriteria(max_time=0.0)])
    assert made.tokens.shape[1] <= 4 and engine.last_stats.steps == 3


def test_the_engine_by_name_and_a_bad_k():
    from rlhf.pipeline.config import ConfigError

    assert get_generator("static").name == "static"
    with pytest.raises(ConfigError, match="check_every"):
        StaticGenerator(check_every=0)


# ------------------------------------------------------------------ the old-log-prob guard
def _rollout(model, tok, engine="static"):
    from rlhf.pipeline.ppo.config import PPOConfig
    from rlhf.pipeline.ppo.generate import generate_rollout

    cfg = PPOConfig(engine=engine, temperature=0.8, top_p=0.95, max_new_tokens=6,
                    max_prompt_tokens=16, kl_estimator="k3")
    torch.manual_seed(1)
    batch = [(f"p{i}", p) for i, p in enumerate(PROMPTS[:6])]
    return generate_rollout(model, tok, batch, cfg, "v0", "cpu"), cfg


def test_guard_reuses_the_engines_logprobs_within_tolerance(models, tok):
    """fp32 on a CPU: the static engine's log-probs pass the check and are reused; the check's
    forward is counted; it is due every `every` opportunities and takes no global RNG draw."""
    from rlhf.pipeline.decode import LogprobGuard
    from rlhf.pipeline.ppo.accounting import StepCost
    from rlhf.pipeline.ppo.generate import forward_logprobs

    model = models["llama"]
    guard = LogprobGuard(every=2, rows=3, tol=1e-5)
    for step in range(3):
        r, cfg = _rollout(model, tok)
        cost, state = StepCost(), torch.get_rng_state()
        forward_logprobs(model, models["qwen2"], r, cfg, cost, guard)
        assert torch.equal(state, torch.get_rng_state())
        assert cost.logprob_passes_saved == 1 and "logprob_guard_failures" not in cost.features
        assert cost.features.get("logprob_guard_checks", 0) == (step % 2 == 0)
    assert guard.last.ok and guard.last.rows == 3 and guard.last.max < 1e-5


def test_guard_falls_back_to_the_trainers_pass_on_a_mismatch(models, tok):
    """Engine log-probs off by 0.01 (what a bf16 decode kernel may give): a warning, the counter,
    the trainer's own pass, and a check at every step until one passes."""
    from rlhf.pipeline.decode import LogprobGuard, LogprobMismatch
    from rlhf.pipeline.ppo.accounting import StepCost
    from rlhf.pipeline.ppo.generate import forward_logprobs

    model = models["llama"]
    guard = LogprobGuard(every=10, rows=2, tol=1e-3)
    r, cfg = _rollout(model, tok)
    r.extras["sampled"]["logprobs"] = r.extras["sampled"]["logprobs"] + 0.01
    cost = StepCost()
    with pytest.warns(LogprobMismatch, match="old-log-prob pass runs"):
        forward_logprobs(model, models["qwen2"], r, cfg, cost, guard)
    assert cost.features["logprob_guard_failures"] == 1 and cost.logprob_passes_saved == 0
    assert not guard.trusted and abs(guard.last.mean - 0.01) < 1e-4
    want = token_logprobs(response_logits(model, r.query, r.query_mask, r.response,
                                          r.response_mask, cfg.temperature), r.response)
    assert torch.equal(r.logprobs, want)
    r, cfg = _rollout(model, tok)
    cost = StepCost()
    forward_logprobs(model, models["qwen2"], r, cfg, cost, guard)  # not due, but untrusted
    assert cost.features["logprob_guard_checks"] == 1 and guard.trusted
    assert cost.logprob_passes_saved == 1


def test_guard_rejects_bad_settings():
    from rlhf.pipeline.decode import LogprobGuard

    with pytest.raises(ValueError, match="rows >= 1"):
        LogprobGuard(every=1, rows=0, tol=1e-3)
