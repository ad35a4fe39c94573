"""The step bill (pipeline/ppo/accounting.py): counters, phases, merging processes, totals."""

import json

import pytest

from rlhf.pipeline.ppo.accounting import PHASES, StepCost, Totals, rm_tokens


def test_counts_phases_and_totals_round_trip():
    a, b = StepCost(), StepCost()
    a.add_generated(30, 2)
    a.add_rm("light", 2, 50)
    b.add_generated(12)
    b.add_rm("strong", 1, 20)
    with a.phase("generate"):
        pass
    with pytest.raises(KeyError, match="unknown phase"):
        with a.phase("nap"):
            pass
    a.seconds["update"], b.seconds["update"] = 1.0, 3.0
    m = StepCost.merged([a, b])
    assert (m.tokens_generated, m.rollouts_started) == (42, 3)
    assert (m.light_rm_calls, m.light_rm_tokens, m.strong_rm_calls) == (2, 50, 1)
    assert m.seconds["update"] == 3.0  # the step waits for the slowest process
    flat = m.as_metrics()
    assert set(f"seconds_{p}" for p in PHASES) <= set(flat)
    t = Totals()
    t.add(m)
    t.add(m)
    u = Totals()
    u.load_state_dict(t.state_dict())
    # the checkpoint state holds the counts; the seconds travel apart (wallclock.py)
    assert "seconds" not in json.dumps(t.state_dict()) and u.seconds == 0.0
    u.seconds = t.seconds
    assert u.as_metrics() == t.as_metrics()
    assert u.as_metrics()["tokens_generated_cum"] == 84
    old = Totals()  # a checkpoint written before the split kept them in its state
    old.load_state_dict({**t.state_dict(), "seconds": t.seconds})
    assert old.as_metrics() == t.as_metrics()


def test_rm_tokens_uses_the_scorers_tokenizer_and_truncation():
    class Tok:
        def __call__(self, texts, add_special_tokens=True):
            return {"input_ids": [t.split() + ["[CLS]"] for t in texts]}

    class S:
        tokenizer, max_length = Tok(), 4

    assert rm_tokens(S(), ["a b"], ["c"]) == 4  # 3 words + 1 special
    assert rm_tokens(S(), ["a b c"], ["d e"]) == 4  # truncated at max_length
    assert rm_tokens(object(), ["a b"], ["c d"]) == 4  # no tokenizer: words


def test_a_token_budget_stops_the_run_after_the_step_that_reaches_it(tmp_path, one_torch_thread):
    import json

    import ppo_tiny
    from rlhf.pipeline.config import build
    from rlhf.pipeline.ppo.config import PPOConfig
    from rlhf.pipeline.ppo.trainer import PPOTrainer, RunPaths

    tok = ppo_tiny.tokenizer()
    cfg = build(PPOConfig, {**ppo_tiny.PARAMS, "total_steps": 6, "total_tokens": 30}, "ppo")
    prompts = [(f"p{i:02d}", p) for i, p in enumerate(ppo_tiny.PROMPTS)]
    tr = PPOTrainer(cfg, ppo_tiny.policy(tok), ppo_tiny.policy(tok), tok, ppo_tiny.WordScorer(),
                    prompts, RunPaths(tmp_path / "run", tmp_path / "rows", "budget"))
    tr.train()
    m = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert m[-1]["tokens_generated_cum"] >= 30 > m[-2]["tokens_generated_cum"]
    assert len(m) < 6  # 4 rollouts x at most 6 tokens a step: the budget ends it early
    last = (tmp_path / "run" / "checkpoints" / "latest").read_text()
    assert last == f"step-{m[-1]['step']:06d}"  # the final step is checkpointed
    with pytest.raises(Exception, match="total_tokens"):
        build(PPOConfig, {"total_tokens": -1}, "ppo")


def test_feature_counters_are_keyed_flat_in_metrics_and_survive_merge_and_resume():
    a, b = StepCost(), StepCost()
    a.count("rollouts_pruned", 2)
    b.count("rollouts_pruned", 3)
    b.count("drafts_stale")
    b.gen_token_forwards = 7
    m = StepCost.merged([a, b])
    assert m.features == {"rollouts_pruned": 5, "drafts_stale": 1}
    flat = m.as_metrics()
    assert flat["rollouts_pruned"] == 5 and flat["gen_token_forwards"] == 7
    assert "features" not in flat
    t = Totals()
    t.add(m)
    u = Totals()
    u.load_state_dict(t.state_dict())
    assert u.as_metrics()["rollouts_pruned_cum"] == 5 == t.as_metrics()["rollouts_pruned_cum"]
