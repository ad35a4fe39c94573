"""The gold judge on hand-written responses with hand-computed scores."""

from __future__ import annotations

import random

import pytest
from rlhf.pipeline.world.judge import (
    FILLER_PHRASES,
    gold_score,
    infer_topic,
    judge,
    repetition,
    stated_facts,
    words,
)
from rlhf.pipeline.world.sources import FRAMES, frame
from rlhf.pipeline.world.topics import TOPICS

P = "Why do leaves look green?"
F1 = "Chlorophyll absorbs red and blue light and reflects green light."  # 10 words
F2 = "Plants turn sunlight, water and carbon dioxide into sugar."  # 9 words
F3 = "Photosynthesis happens inside chloroplasts in leaf cells."  # 7 words
GOOD = f"{F1} {F2} {F3}"  # 26 words, 3 on-topic facts
WRONG1 = "Magma that reaches the surface is called lava."  # volcanoes
WRONG2 = "Voltage is the push that drives current around a circuit."  # electricity


def test_good_answer_hand_computed():
    j = judge(P, GOOD)
    assert (j.topic, j.n_on, j.n_wrong, j.n_filler, j.n_words, j.rep) == (
        "photosynthesis", 3, 0, 0, 26, 0.0)
    assert j.score == pytest.approx(1 + 4 * (1 - 0.6 ** 3))  # 4.136


def test_filler_padded_hand_computed():
    r = (f"It is worth noting that {F1[0].lower() + F1[1:]} At the end of the day, "
         f"{F2[0].lower() + F2[1:]} Needless to say, {F3[0].lower() + F3[1:]}")
    j = judge(P, r)
    assert (j.n_on, j.n_filler, j.n_words) == (3, 3, 40)
    assert j.score == pytest.approx(4.136 - 3 * 0.6)


def test_hallucinated_hand_computed():
    j = judge(P, f"{F1} {WRONG1} {WRONG2}")
    assert (j.n_on, j.n_wrong, j.rep) == (1, 2, 0.0)
    assert j.score == pytest.approx(1 + 4 * 0.4 - 2 * 0.9)  # 0.8


def test_repetitive_hand_computed():
    # 30 words, 28 trigrams; distinct: 8 inside the sentence + 2 across the joins -> rep 18/28.
    j = judge(P, f"{F1} {F1} {F1}")
    assert j.n_on == 1
    assert j.rep == pytest.approx(18 / 28)
    assert j.score == pytest.approx(1 + 1.6 - 4 * 18 / 28, abs=1e-4)  # rounded to 4 places


def test_length_band_hand_computed():
    short = judge(P, F1)  # 10 words: 5 under the band
    assert short.score == pytest.approx(1 + 1.6 - 0.5)
    padding = " ".join(f"word{i}" for i in range(44))  # 26 + 44 = 70 words: 10 over
    assert judge(P, f"{GOOD} {padding}").score == pytest.approx(4.136 - 0.6)
    assert gold_score(P, "") == 0.0


def test_good_beats_every_defect():
    good = gold_score(P, GOOD)
    filler = gold_score(P, f"As we all know, {GOOD} It goes without saying that it matters.")
    hallucinated = gold_score(P, f"{F1} {F2} {WRONG1}")
    repetitive = gold_score(P, f"{F1} {F2} {F1} {F2}")
    assert good > filler and good > hallucinated and good > repetitive


def test_punctuation_and_case_insensitive():
    shouty = "CHLOROPHYLL absorbs red, and BLUE light, it reflects green light!!!"
    assert stated_facts(shouty) == [("photosynthesis", F1)]
    assert words("Ohm's law, isn't it?") == ["ohms", "law", "isnt", "it"]
    terse = "chlorophyll absorbs red blue light, reflects green light"  # stopwords dropped: counts
    assert stated_facts(terse) == [("photosynthesis", F1)]
    salad = "green reflects light blue red absorbs chlorophyll"  # same words, scrambled: no fact
    assert stated_facts(salad) == []
    assert infer_topic("WHY DO LEAVES LOOK GREEN??").name == "photosynthesis"


def test_every_fact_states_only_itself_and_every_question_finds_its_topic():
    for t in TOPICS:
        for f in t.facts:
            assert stated_facts(f) == [(t.name, f)], f
        for i, q in enumerate(t.questions):
            framed = frame(q, i % len(FRAMES))
            assert infer_topic(framed) is not None and infer_topic(framed).name == t.name, framed


def test_knowledge_table_shape():
    assert len(TOPICS) >= 30
    assert len({t.name for t in TOPICS}) == len(TOPICS)
    risky = {t.category for t in TOPICS if t.high_risk}
    assert risky == {"medical", "legal", "financial"}
    assert all(len(t.facts) >= 6 and len(t.questions) >= 2 for t in TOPICS)


def test_score_stays_in_range_on_random_and_extreme_text():
    rng = random.Random(0)
    vocab = [w for t in TOPICS for f in t.facts for w in f.split()] + list(FILLER_PHRASES)
    for _ in range(300):
        t = rng.choice(TOPICS)
        r = " ".join(rng.choice(vocab) for _ in range(rng.randrange(0, 150)))
        assert 0.0 <= gold_score(rng.choice(t.questions), r) <= 5.0
    every_fact = " ".join(TOPICS[0].facts)
    assert 4.0 < gold_score(TOPICS[0].questions[0], every_fact) <= 5.0
    assert gold_score(P, " ".join(FILLER_PHRASES) * 5) == 0.0
    assert gold_score("", GOOD) == pytest.approx(1.0)  # no topic: style terms only
    assert repetition(["a", "b"]) == 0.0
