"""Rollout economy inside a sample (pipeline/ppo/features/sample_economy.py): the entropy stop on
hand-made logits and inside the real batched generate of a tiny Llama, the -1 sigma selection,
the prefix cut from per-token RM scores, what a pruned row does in the update, the resampled row
and its token bill, the hook's checkpointed state, and the config's validation."""

from __future__ import annotations

import math

import pytest
import torch

import ppo_tiny
from rlhf.pipeline.config import ConfigError, build
from rlhf.pipeline.ppo.accounting import StepCost
from rlhf.pipeline.ppo.config import PPOConfig, features_on, plain
from rlhf.pipeline.ppo.hooks import HookBase, RolloutHooks
from rlhf.pipeline.ppo.features.sample_economy import (EntropyStop, Resample, first_low_position,
                                              repeats_ngram, sampled_entropy_bits, select_below,
                                              topk_entropy_bits)
from rlhf.pipeline.ppo.trainer import PPOTrainer, RunPaths, hooks_for

pytestmark = pytest.mark.usefixtures("one_torch_thread")

EOS = 3


def cfg_of(**kw) -> PPOConfig:
    return build(PPOConfig, {**ppo_tiny.PARAMS, "max_new_tokens": 8, **kw}, "ppo")


# --------------------------------------------------------------------------- the entropy measure
def test_entropy_is_of_the_distribution_sampled():
    uniform = torch.zeros(1, 8)
    assert sampled_entropy_bits(uniform, 1.0, 1.0).item() == pytest.approx(3.0, abs=1e-5)
    # top-p 0.5 over 8 equal tokens keeps 4 of them (2 bits); temperature sharpens a peak
    assert sampled_entropy_bits(uniform, 1.0, 0.5).item() == pytest.approx(2.0, abs=1e-5)
    peak = torch.tensor([[2.0, 0, 0, 0]])
    assert sampled_entropy_bits(peak, 0.5, 1.0) < sampled_entropy_bits(peak, 1.0, 1.0)
    # the seed's top-k entropy is at most log2(k): never above log2(V)/2 once V >= k^2
    assert topk_entropy_bits(torch.zeros(1, 3000), 50).item() == pytest.approx(math.log2(50))
    assert math.log2(50) < math.log2(3000) / 2


def test_repeated_ngram():
    assert repeats_ngram([5, 6, 7, 9, 5, 6, 7], 3)
    assert not repeats_ngram([5, 6, 7, 9, 5, 6, 8], 3)
    assert not repeats_ngram([5, 6, 7], 3)
    assert repeats_ngram([1], 0)  # no repetition test


# --------------------------------------------------------------------------- the stop, by hand
def _drive(hook, rows: list[list[bool]], eos_at: dict[int, int] | None = None) -> list[int]:
    """Feed hand-made logits: rows[i][t] True = a peaked (low-entropy) distribution at step t.
    Returns, per row, the step (1-based) at which the criterion stopped it (0 = never)."""
    procs, stops = hook.processors(step=5, batch_size=len(rows))
    proc, stop = procs[0], stops[0]
    B, T = len(rows), len(rows[0])
    ids = torch.full((B, 2), 7)  # a two-token prompt
    stopped = [0] * B
    for t in range(T):
        scores = torch.zeros(B, 40)
        for i in range(B):
            if rows[i][t]:
                scores[i, 10] = 30.0
        proc(ids, scores)
        nxt = torch.tensor([[10 + t] for _ in range(B)])  # distinct tokens: no n-gram repeats
        for i, at in (eos_at or {}).items():
            if at == t:
                nxt[i, 0] = EOS
        ids = torch.cat([ids, nxt], 1)
        done = stop(ids, scores)
        for i in range(B):
            if bool(done[i]) and not stopped[i]:
                stopped[i] = t + 1
    return stopped


def test_stops_after_exactly_five_low_tokens_per_row():
    hook = EntropyStop(cfg_of(prune_on=True, prune_ngram=0), EOS, 0)
    hook.load_state_dict({"threshold": 1.0, "calibration": []})
    low, high = True, False
    rows = [[low] * 8,                                        # stops at its 5th token
            [low, low, low, low, high, low, low, low],       # run broken at 4: never
            [high] * 8,                                      # never
            [high, high, low, low, low, low, low, high]]     # 5 in a row from t=2: at t=7
    assert _drive(hook, rows) == [5, 0, 0, 7]
    assert hook.batch.pruned.tolist() == [True, False, False, True]


def test_a_run_that_ends_on_eos_is_not_pruned():
    hook = EntropyStop(cfg_of(prune_on=True, prune_ngram=0), EOS, 0)
    hook.load_state_dict({"threshold": 1.0, "calibration": []})
    _drive(hook, [[True] * 8, [True] * 8], eos_at={0: 4})
    assert hook.batch.pruned.tolist() == [False, True]


def test_the_calibrated_rule_needs_a_repeat():
    hook = EntropyStop(cfg_of(prune_on=True, prune_ngram=3), EOS, 0)
    hook.load_state_dict({"threshold": 1.0, "calibration": []})
    assert _drive(hook, [[True] * 8]) == [0]  # confident but never repeating: kept


def test_calibration_collects_then_sets_the_percentile():
    hook = EntropyStop(cfg_of(prune_on=True, prune_calibration_steps=1, prune_percentile=50.0),
                       EOS, 0)
    assert hook.collecting()
    _drive(hook, [[True] * 8, [False] * 8])
    assert hook.batch.pruned.tolist() == [False, False]  # nothing pruned while calibrating
    hook.step = 1
    r = type("R", (), {"valid": torch.ones(2, dtype=torch.bool), "flags": [[], []],
                       "extras": {}, "__len__": lambda self: 2})()
    hook.finish(r)
    assert hook.threshold is not None and len(hook.calibration) == 16
    x = torch.tensor(hook.calibration)  # 8 peaked (0 bits) and 8 flat (log2(40) at top-p .95)
    assert hook.threshold == pytest.approx(float(torch.quantile(x, 0.5)))
    assert 0.0 < hook.threshold < float(x.max())


def test_the_literal_threshold_is_half_log2_vocab():
    hook = EntropyStop(cfg_of(prune_on=True, prune_rule="literal"), EOS, 0)
    _drive(hook, [[False] * 6])
    assert hook.threshold == pytest.approx(math.log2(40) / 2)
    # a flat top-50 of 40 tokens has log2(40) bits, above log2(40)/2: a flat row is kept, while
    # at a real vocabulary (V = 3000) even a flat top-50 is below log2(V)/2
    assert hook.batch.pruned.tolist() == [False]


# --------------------------------------------------------------------------- selection and cut
def test_minus_one_sigma_selection():
    s = torch.tensor([1.0, 1.2, 0.9, 1.1, -2.0, 1.0, 5.0, -1.5])
    valid = torch.ones(8, dtype=torch.bool)
    mean, std = float(s.mean()), float(s.std())
    expect = [i for i in range(8) if s[i] < mean - std]
    assert sorted(select_below(s, valid, 1.0, 8)) == expect == [4, 7]
    assert select_below(s, valid, 1.0, 1) == [4]  # bounded, lowest first
    valid[4] = False  # ineligible rows neither count nor get picked
    assert 4 not in select_below(s, valid, 1.0, 8)
    assert select_below(s, torch.tensor([True] + [False] * 7), 1.0, 8) == []


def test_prefix_cut_from_per_token_scores():
    # prefix scores 0.5 (prompt), then after each token: increments +0.1 +0.1 -0.6 +0.2 -0.1 ...
    scores = [0.6, 0.7, 0.1, 0.3, 0.2, 0.4, 0.5, 0.6]
    assert first_low_position(0.5, scores, 0.25) == 2  # bottom 2 of 8: -0.6, -0.1 -> first is 2
    assert first_low_position(0.5, scores, 0.125) == 2
    assert first_low_position(0.5, [0.2, 0.9], 0.5) == 0  # the first token already drops
    assert first_low_position(0.0, [], 0.25) == 0
    # ties at 0 are not "low": only a token that lowers the score is; none lowers it -> the least
    assert first_low_position(0.0, [0.0, 0.0, -1.0, -1.0], 0.5) == 2
    assert first_low_position(0.0, [0.3, 0.4, 0.9], 0.3) == 1


# --------------------------------------------------------------------------- on the real trainer
class Peak(HookBase):
    """A generation hook placed before the entropy stop: row 0 of every batch gets a peaked
    distribution on 'cat'; every row has eos suppressed (so the others run to the budget)."""

    name = "peak"

    def __init__(self, tok):
        self.cat, self.eos = tok.convert_tokens_to_ids("cat"), tok.eos_token_id

    def processors(self, step, batch_size):
        from transformers import LogitsProcessor

        hook = self

        class P(LogitsProcessor):
            def __call__(self, input_ids, scores):
                scores = scores.clone()
                scores[:, hook.eos] = -math.inf
                scores[0] = -30.0
                scores[0, hook.cat] = 30.0
                return scores

        return [P()], []

    def finish(self, r):
        pass

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


class PromptScorer(ppo_tiny.WordScorer):
    """-10 for the first prompt, 0 for every other (so the first is the batch's outlier), and
    per-token scores that fall at the third response token."""

    name = "prompt_rm"

    def score(self, prompts, responses):
        r = [-10.0 if p == ppo_tiny.PROMPTS[0] else 0.1 * len(s.split())
             for p, s in zip(prompts, responses)]
        return torch.tensor(r), torch.ones(len(r))

    def token_scores(self, prompts, responses, n_tokens):
        return [(0.0, [0.0 if t < 2 else -1.0 for t in range(n)]) for n in n_tokens]


def make(tmp_path, hooks=None, scorer=None, **overrides):
    tok = ppo_tiny.tokenizer()
    cfg = cfg_of(**overrides)
    prompts = [(f"p{i:02d}", p) for i, p in enumerate(ppo_tiny.PROMPTS)]
    paths = RunPaths(tmp_path / "run", tmp_path / "rollouts", "econ")
    if hooks is None:
        base = hooks_for(cfg, None, tokenizer=tok)
        hooks = RolloutHooks(generation=[Peak(tok)] + base.generation,
                             post_scoring=base.post_scoring)
    return PPOTrainer(cfg, ppo_tiny.policy(tok), ppo_tiny.policy(tok), tok,
                      scorer or ppo_tiny.WordScorer(), prompts, paths, hooks=hooks), tok


def _stop_of(tr) -> EntropyStop:
    (hook,) = [h for h in tr.hooks.generation if isinstance(h, EntropyStop)]
    hook.load_state_dict({"threshold": 0.5, "calibration": []})  # calibrated already
    return hook


def test_generate_really_stops_the_low_entropy_row_and_counts_its_tokens(tmp_path):
    tr, _ = make(tmp_path, prune_on=True, prune_ngram=0)
    _stop_of(tr)
    r = tr.generate(tr.sampler.next_batch(4), "v0", step=3)
    assert r.extras["generated_tokens"] == [5, 8, 8, 8]  # five low tokens, then stopped
    assert r.extras["pruned"] == [True, False, False, False]
    assert "pruned" in r.flags[0] and not r.valid[0] and bool(r.valid[1:].all())


def test_a_dropped_pruned_row_gets_no_gradient_and_a_null_reward(tmp_path):
    tr, _ = make(tmp_path, prune_on=True, prune_ngram=0, prune_treatment="drop")
    _stop_of(tr)
    cost = StepCost()
    r = tr.generate(tr.sampler.next_batch(4), "v0", step=3)
    tr.score(r, cost)
    tr.forward_logprobs(r)
    tr.learner.values(r, tr.pad_id, tr.scorer, cost)
    tr.learner.advantages(r, 3)
    assert cost.features["rollouts_pruned"] == 1 and cost.light_rm_calls == 3  # the pruned row: no RM call
    assert not bool(r.loss_mask[0].any()) and float(r.advantages[0].abs().sum()) == 0.0
    from rlhf.pipeline.decode import response_logits, token_logprobs
    from rlhf.pipeline.ppo import core

    logits = response_logits(tr.policy, r.query, r.query_mask, r.response, r.response_mask, 0.8)
    logp = token_logprobs(logits, r.response).detach().requires_grad_(True)
    loss, _, _ = core.policy_loss(logp, r.logprobs, r.advantages, r.loss_mask, 0.2)
    loss.backward()
    assert float(logp.grad[0].abs().sum()) == 0.0 and float(logp.grad[1:].abs().sum()) > 0
    rows = tr.recorder.rollout_rows(3, r)
    assert rows[0]["reward"] is None and rows[0]["scorer"] == "pruned"
    assert rows[0]["generated_tokens"] == 5 and "pruned" in rows[0]["flags"]


@pytest.mark.parametrize("treatment", ["truncation", "failure"])
def test_a_pruned_row_kept_as_terminal_gets_its_defined_reward(tmp_path, treatment):
    tr, _ = make(tmp_path, scorer=PromptScorer(), prune_on=True, prune_ngram=0,
                 prune_treatment=treatment)
    _stop_of(tr)
    r = tr.generate(tr.sampler.next_batch(4), "v0", step=3)
    tr.score(r, StepCost())
    assert bool(r.valid[0]) and r.extras["pruned"][0]
    earned, _ = PromptScorer().score(r.prompts, r.responses)
    if treatment == "truncation":
        assert float(r.scores[0]) == pytest.approx(float(earned[0]))
    else:
        assert float(r.scores[0]) == pytest.approx(float(earned[1:].min()))


@pytest.mark.parametrize("engine", ["hf", "native"])
def test_resampling_regenerates_from_the_cut_and_pays_for_it(tmp_path, engine):
    tr, tok = make(tmp_path, hooks=hooks_for(cfg_of(resample_on=True), None,
                                             tokenizer=ppo_tiny.tokenizer()),
                   scorer=PromptScorer(), resample_on=True, max_new_tokens=8, engine=engine)
    batch = [("p00", ppo_tiny.PROMPTS[0])] + [(f"p{i:02d}", ppo_tiny.PROMPTS[i])
                                             for i in (1, 2, 3)]
    torch.manual_seed(1)
    r = tr.generate(batch, "v0", step=1)
    first = r.response[0][r.response_mask[0]].tolist()
    before = list(r.extras["generated_tokens"])
    cost = StepCost()
    cost.add_generated(sum(before), len(r))
    tr.score(r, cost)
    assert r.extras["resampled"] == [True, False, False, False]
    new = r.response[0][r.response_mask[0]].tolist()
    assert new[:2] == first[:2]  # the prefix before the first low-rated token is kept
    regen = r.extras["generated_tokens"][0] - before[0]
    assert regen == len(new) - 2 and regen >= 1
    assert cost.features["tokens_regenerated"] == regen and cost.features["rollouts_resampled"] == 1
    assert cost.tokens_generated == sum(before) + regen and cost.rollouts_started == 5
    # the regeneration's policy forwards are counted too (one row: at least one a new token),
    # each pushing at least the prompt and the kept prefix through the policy once
    assert cost.gen_forwards >= regen
    prompt_len = int(r.query_mask[0].sum())
    assert cost.gen_token_forwards >= prompt_len + 2 + regen - 1
    assert "resampled" in r.flags[0] and r.extras["first_draw"][0]["cut"] == 2
    tr.forward_logprobs(r)  # log-probs of the new row come from the normal pass, same shapes
    assert r.logprobs.shape == r.response.shape


def test_a_run_with_both_on_trains_records_and_resumes_the_threshold(tmp_path):
    from rlhf.pipeline.ppo import checkpoint
    from rlhf.store.io import read_table

    kw = dict(prune_on=True, resample_on=True, total_steps=3, checkpoint_every=1,
              prune_calibration_steps=1, prune_percentile=50.0, prune_ngram=0)
    tr, _ = make(tmp_path, scorer=PromptScorer(), **kw)
    tr.train()
    hook = [h for h in tr.hooks.generation if isinstance(h, EntropyStop)][0]
    assert hook.threshold is not None
    rows = read_table("rollouts", tmp_path / "rollouts").to_pylist()
    assert len(rows) == 12 and any("pruned" in r["flags"] for r in rows)
    again, _ = make(tmp_path, scorer=PromptScorer(), **kw)
    assert checkpoint.load(again) == 3
    h2 = [h for h in again.hooks.generation if isinstance(h, EntropyStop)][0]
    assert h2.threshold == hook.threshold and h2.calibration == hook.calibration


def test_config_switches_default_off_and_are_validated():
    assert not PPOConfig().prune_on and not PPOConfig().resample_on
    on = PPOConfig(prune_on=True, resample_on=True)
    assert features_on(on) == {"prune_on": True, "resample_on": True}
    assert features_on(plain(on)) == {}
    assert hooks_for(PPOConfig()).names() == []
    assert hooks_for(on, None, tokenizer=ppo_tiny.tokenizer()).names() == ["entropy_stop", "resample"]
    for key, bad in (("prune_percentile", 120.0), ("prune_run", 0), ("resample_sigma", -1.0),
                     ("resample_low_frac", 0.0), ("resample_max_share", 1.5),
                     ("prune_top_k", 1), ("prune_ngram", -1)):
        with pytest.raises(ConfigError, match=f"ppo.{key}"):
            build(PPOConfig, {key: bad}, "ppo")
    assert isinstance(Resample(on).name, str)


def test_bench_summary_of_the_probe(tmp_path):
    """bench/economy/sample.summarize: useful share, precision against the step's unpruned
    median gold, tokens saved and the resampling bias, on hand-made probe lines."""
    import json

    from bench.economy import sample as economy_sample

    rows = [  # step 1: unpruned golds 1, 2, 3 (median 2); pruned finished 0.5 (bad) and 2.5
        {"p": False, "s": False, "v": True, "rw": 1.0, "g": 1.0, "gen": 10},
        {"p": False, "s": True, "v": True, "rw": 0.5, "g": 2.0, "gen": 14, "r0": -1.0, "g0": 0.0},
        {"p": False, "s": False, "v": True, "rw": 2.0, "g": 3.0, "gen": 10},
        {"p": True, "s": False, "v": False, "rw": None, "g": 0.0, "gen": 5, "gf": 0.5, "saved": 7},
        {"p": True, "s": False, "v": False, "rw": None, "g": 0.0, "gen": 5, "gf": 2.5, "saved": 3},
    ]
    path = tmp_path / "probe.jsonl"
    path.write_text(json.dumps({"step": 1, "rows": rows}) + "\n")
    s = economy_sample.summarize(path, {"rollouts_started": 6, "tokens_generated": 44,
                                        "tokens_regenerated": 4})
    assert s["useful"] == 3 and s["useful_share"] == pytest.approx(3 / 6)
    assert s["pruned_share"] == pytest.approx(2 / 5) and s["tokens_saved"] == 10
    assert s["tokens_saved_share"] == pytest.approx(10 / 54)
    assert s["precision"] == pytest.approx(0.5) and s["base_rate"] == pytest.approx(1 / 3)
    assert (s["reward_first"], s["reward_regen"], s["gold_first"], s["gold_regen"]) == (
        -1.0, 0.5, 0.0, 2.0)
    assert s["batch_reward_first"] == pytest.approx((1.0 - 1.0 + 2.0) / 3)
    assert s["batch_reward_used"] == pytest.approx(3.5 / 3)
    lines = economy_sample.section({"resampling": [{"sample_economy": s, "cost": {}}]})
    assert any("50.0 %" in ln for ln in lines) and any("-1.000 → 0.500" in ln for ln in lines)
