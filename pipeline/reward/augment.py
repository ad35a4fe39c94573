"""Adversarial augmentation of RM training pairs (seed 001 §5.1, against an overfit RM).

Perturb a response the way an RM that learned surface patterns would be fooled by (synonym swaps,
sentence reordering), re-score the perturbed texts with the re-scorer (the gold judge in the
embedded default, standing for a human or a higher-quality RM), and add the pairs the re-scores
order. Pure functions; the random source is an explicit `random.Random`.

    python -c "import random; from rlhf.pipeline.reward.augment import perturb; \
print(perturb('It is good. It is big.', random.Random(0)))"
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence

SYNONYMS: dict[str, tuple[str, ...]] = {
    "good": ("fine", "great"), "bad": ("poor", "awful"), "big": ("large", "huge"),
    "small": ("little", "tiny"), "fast": ("quick", "rapid"), "slow": ("sluggish",),
    "help": ("assist", "aid"), "use": ("employ", "apply"), "make": ("create", "build"),
    "important": ("essential", "key"), "easy": ("simple",), "hard": ("difficult", "tough"),
    "start": ("begin",), "end": ("finish",), "show": ("display", "reveal"),
    "often": ("frequently",), "because": ("since", "as"), "also": ("too", "as well"),
    "answer": ("reply", "response"), "question": ("query",), "idea": ("notion", "concept"),
    "happy": ("glad", "pleased"), "sad": ("unhappy",), "many": ("numerous",),
    "very": ("really", "quite"), "think": ("believe",), "need": ("require",),
}

_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def synonym_swap(text: str, rng: random.Random, rate: float = 0.5) -> str:
    """Replace each word that has synonyms, with probability `rate`, keeping its capitalisation."""
    def swap(m: re.Match) -> str:
        word = m.group(0)
        options = SYNONYMS.get(word.lower())
        if not options or rng.random() >= rate:
            return word
        new = rng.choice(options)
        return new.capitalize() if word[0].isupper() else new
    return re.sub(r"[A-Za-z]+", swap, text)


def reorder_sentences(text: str, rng: random.Random) -> str:
    """Shuffle the sentences (a different order whenever there are two or more)."""
    parts = [p for p in _SENTENCE.split(text.strip()) if p]
    if len(parts) < 2:
        return text
    order = list(range(len(parts)))
    while order == sorted(order):
        rng.shuffle(order)
    return " ".join(parts[i] for i in order)


def perturb(text: str, rng: random.Random) -> str:
    """One adversarial variant: a synonym swap, a sentence reordering, or both."""
    kind = rng.choice(("synonyms", "reorder", "both"))
    if kind in ("synonyms", "both"):
        text = synonym_swap(text, rng)
    if kind in ("reorder", "both"):
        text = reorder_sentences(text, rng)
    return text


def augment_pairs(pairs: Sequence[dict[str, str]], fraction: float,
                  rescore: Callable[[str, str], float], seed: int = 0) -> list[dict[str, str]]:
    """New pairs from a `fraction` of `pairs`: both sides perturbed, re-scored, ordered by the
    re-scores (ties and unchanged texts dropped). Returns only the new pairs."""
    rng = random.Random(seed)
    out = []
    for pair in pairs:
        if rng.random() >= fraction:
            continue
        p = pair["prompt"]
        a, b = perturb(pair["chosen"], rng), perturb(pair["rejected"], rng)
        if a == pair["chosen"] and b == pair["rejected"]:
            continue
        sa, sb = rescore(p, a), rescore(p, b)
        if sa == sb:
            continue
        out.append({"prompt": p, "chosen": a if sa > sb else b,
                    "rejected": b if sa > sb else a})
    return out
