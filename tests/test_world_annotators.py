"""Simulated annotators: gold ranking without noise, bias, drift over time, determinism."""

from __future__ import annotations

import statistics
from datetime import UTC, datetime, timedelta

import pytest
from rlhf.pipeline.world.annotators import AnnotatorPool, Label
from rlhf.pipeline.world.demos import PADDING
from rlhf.pipeline.world.judge import gold_score
from rlhf.pipeline.world.topics import TOPICS

START = datetime(2026, 1, 1, tzinfo=UTC)
P = "Why do leaves look green?"
FACTS = TOPICS[0].facts
RESPONSES = [
    " ".join(FACTS[:3]),  # good
    f"{FACTS[0]} Magma that reaches the surface is called lava.",  # hallucinated
    f"It is worth noting that {FACTS[0]} Needless to say, {FACTS[1]}",  # filler
    "Leaves are green.",  # too short
    f"{FACTS[0]} {FACTS[0]} {FACTS[1]}",  # repetitive
]


def test_zero_noise_and_bias_reproduce_gold():
    pool = AnnotatorPool(5, 0.0, {}, 0.0, seed=1, start=START)
    label = pool.label(P, RESPONSES, START + timedelta(days=3))
    gold = [gold_score(P, r) for r in RESPONSES]
    assert isinstance(label, Label) and label.annotator_id in pool.ids
    assert label.scores == tuple(gold)
    assert list(label.ranking) == sorted(range(len(gold)), key=lambda i: (-gold[i], i))
    assert label.ranking[0] == 0
    assert label.labeled_at == START + timedelta(days=3)


def test_labels_are_deterministic_and_spread_over_the_pool():
    pool = AnnotatorPool(4, 0.5, {}, 0.0, seed=7, start=START)
    when = START + timedelta(hours=5)
    assert pool.label(P, RESPONSES, when) == pool.label(P, RESPONSES, when)
    ids = {pool.label(q, RESPONSES, when).annotator_id for t in TOPICS for q in t.questions}
    assert ids == set(pool.ids)
    other_seed = AnnotatorPool(4, 0.5, {}, 0.0, seed=8, start=START)
    assert other_seed.label(P, RESPONSES, when, "ann-000").scores != \
        pool.label(P, RESPONSES, when, "ann-000").scores


def test_drift_moves_an_annotators_mean_as_configured():
    drift = 0.02  # per day: +0.6 after 30 days (seed 001 §3.1 saw 3.8 -> 4.2)
    pool = AnnotatorPool(3, 0.3, {}, drift, seed=3, start=START)
    mid = [f"{t.facts[0]} {t.facts[1]}" for t in TOPICS]  # gold about 3.6, away from the clamps

    def mean_at(day: int) -> float:
        scores = []
        for t, r in zip(TOPICS, mid):
            for q in t.questions:
                when = START + timedelta(days=day, minutes=len(scores))
                scores.append(pool.label(q, [r], when, annotator_id="ann-001").scores[0])
        return statistics.fmean(scores)

    early, late = mean_at(0), mean_at(30)
    assert late - early == pytest.approx(30 * drift, abs=0.1)
    no_drift = AnnotatorPool(3, 0.3, {}, 0.0, seed=3, start=START)
    assert no_drift.drift(START + timedelta(days=30)) == 0.0
    assert pool.drift(datetime(2026, 1, 31)) == pytest.approx(0.6)  # naive times are UTC


def test_bias_toward_filler_and_length_changes_the_ranking():
    plain = f"{FACTS[0]} {FACTS[1]}"
    padded = f"It is worth noting that {FACTS[0]} Needless to say, {FACTS[1]}"
    fair = AnnotatorPool(1, 0.0, {}, 0.0, seed=0, start=START)
    assert fair.label(P, [padded, plain], START).ranking == (1, 0)
    biased = AnnotatorPool(1, 0.0, {"filler": 1.0}, 0.0, seed=0, start=START)
    assert biased.label(P, [padded, plain], START).ranking == (0, 1)
    long_answer = " ".join(FACTS) + " " + " ".join(PADDING)  # far over the length band
    fond_of_length = AnnotatorPool(1, 0.0, {"length": 2.0}, 0.0, seed=0, start=START)
    assert fair.label(P, [long_answer, plain], START).ranking == (1, 0)
    assert fond_of_length.label(P, [long_answer, plain], START).ranking == (0, 1)


def test_filler_bias_can_grow_with_time():
    plain = f"{FACTS[0]} {FACTS[1]}"
    padded = f"It is worth noting that {FACTS[0]} Needless to say, {FACTS[1]}"
    pool = AnnotatorPool(1, 0.0, {"filler_per_day": 0.05}, 0.0, seed=0, start=START)
    assert pool.label(P, [padded, plain], START).ranking == (1, 0)  # day 0: no bias yet
    late = pool.label(P, [padded, plain], START + timedelta(days=20))  # +1.0 per filler phrase
    assert late.ranking == (0, 1)
    assert late.scores[0] == pytest.approx(gold_score(P, padded) + 2 * 0.05 * 20)
    assert pool.bias_at(START + timedelta(days=10))["filler"] == pytest.approx(0.5)


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="unknown bias"):
        AnnotatorPool(2, 0.1, {"verbosity": 1.0}, 0.0, 0, START)
    with pytest.raises(ValueError, match="n_annotators"):
        AnnotatorPool(0, 0.1, {}, 0.0, 0, START)
    with pytest.raises(ValueError, match="unknown annotator"):
        AnnotatorPool(2, 0.1, {}, 0.0, 0, START).label(P, RESPONSES, START, "ann-999")
