"""Adversarial and reward-hacking augmentation of RM training data (pipeline/reward/augment.py),
judged by the real gold judge of the world."""

import random

from rlhf.pipeline.reward.augment import (
    HACKS,
    augment_pairs,
    hack_probe,
    hack_twins,
    repeat_sentence,
    truncate_words,
    word_salad,
)
from rlhf.pipeline.world.judge import gold_score, judge

PROMPT = "Why do leaves look green?"
ANSWER = ("Chlorophyll absorbs red and blue light and reflects green light. "
          "Plants use that light to make sugar from water and carbon dioxide.")


def test_repeat_sentence_repeats_and_the_judge_punishes_it():
    rng = random.Random(0)
    twin = repeat_sentence(ANSWER, rng)
    assert len(twin) > len(ANSWER) and twin != ANSWER
    assert judge(PROMPT, twin).rep > 0
    assert gold_score(PROMPT, twin) < gold_score(PROMPT, ANSWER)


def test_word_salad_keeps_the_words_and_loses_the_order():
    twin = word_salad(ANSWER, random.Random(1))
    assert sorted(twin.replace(".", "").split()) == sorted(ANSWER.replace(".", "").split())
    assert twin != ANSWER


def test_truncate_keeps_a_prefix_and_leaves_short_texts_alone():
    twin = truncate_words(ANSWER, random.Random(2))
    assert ANSWER.startswith(twin) and 2 <= len(twin.split()) <= len(ANSWER.split()) // 3
    assert truncate_words("Too short to cut.", random.Random(2)) == "Too short to cut."
    assert gold_score(PROMPT, twin) < gold_score(PROMPT, ANSWER)


def test_hack_twins_are_ordered_by_the_rescorer_and_drop_ties():
    prompts = [PROMPT] * 20
    responses = [ANSWER] * 19 + ["ok"]  # "ok": every hack leaves it unchanged
    pairs = hack_twins(prompts, responses, 1.0, gold_score, seed=0)
    assert 0 < len(pairs) <= 19 * len(HACKS)
    for p in pairs:
        assert gold_score(p["prompt"], p["chosen"]) > gold_score(p["prompt"], p["rejected"])
    assert hack_twins(prompts, responses, 0.0, gold_score) == []


def test_hack_probe_tells_a_hackable_rm_from_a_robust_one():
    prompts, responses = [PROMPT] * 10, [ANSWER] * 10
    longer_is_better = lambda ps, rs: [len(r) for r in rs]  # noqa: E731  (fooled by repeats)
    fooled = hack_probe(prompts, responses, longer_is_better, gold_score)
    assert fooled["repeat"]["agreement"] == 0.0
    assert fooled["truncate"]["agreement"] == 1.0
    gold = lambda ps, rs: [gold_score(p, r) for p, r in zip(ps, rs)]  # noqa: E731
    robust = hack_probe(prompts, responses, gold, gold_score)
    assert robust["all"]["agreement"] == 1.0
    assert robust["all"]["n"] == sum(robust[k]["n"] for k in HACKS)


def test_augment_pairs_orders_by_the_rescorer():
    pairs = [{"prompt": PROMPT, "chosen": ANSWER, "rejected": "Leaves are green. They are big."}]
    out = augment_pairs(pairs * 10, 1.0, gold_score, seed=0)
    for p in out:
        assert gold_score(p["prompt"], p["chosen"]) > gold_score(p["prompt"], p["rejected"])
