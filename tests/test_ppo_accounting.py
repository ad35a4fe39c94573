"""The step bill (pipeline/ppo/accounting.py): counters, phases, merging processes, totals."""

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
    assert u.as_metrics() == t.as_metrics()
    assert u.as_metrics()["tokens_generated_cum"] == 84


def test_rm_tokens_uses_the_scorers_tokenizer_and_truncation():
    class Tok:
        def __call__(self, texts, add_special_tokens=True):
            return {"input_ids": [t.split() + ["[CLS]"] for t in texts]}

    class S:
        tokenizer, max_length = Tok(), 4

    assert rm_tokens(S(), ["a b"], ["c"]) == 4  # 3 words + 1 special
    assert rm_tokens(S(), ["a b c"], ["d e"]) == 4  # truncated at max_length
    assert rm_tokens(object(), ["a b"], ["c d"]) == 4  # no tokenizer: words
