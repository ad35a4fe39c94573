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
        pair = _ordered(p, a, rescore(p, a), b, rescore(p, b))
        if pair is not None:
            out.append(pair)
    return out


def _ordered(prompt: str, a: str, sa: float, b: str, sb: float) -> dict[str, str] | None:
    """The pair (a, b) as chosen / rejected by their re-scores; None for a tie."""
    if sa == sb:
        return None
    return {"prompt": prompt, "chosen": a if sa > sb else b, "rejected": b if sa > sb else a}


# ---------------------------------------------------------------------------------------------
# Reward-hacking twins: the degenerations PPO finds first when it over-optimises an RM that never
# saw them (bench/economy/, docs/README.md): a sentence repeated, a
# sentence turned into a bag of its words (keyword stuffing), an answer cut to a few words.
# Each twin is re-scored by the re-scorer, like every other augmentation: the RM learns the order
# the judge gives, never a hard-coded penalty.


def repeat_sentence(text: str, rng: random.Random) -> str:
    """One sentence said again, 1-3 more times, right after itself."""
    parts = [p for p in _SENTENCE.split(text.strip()) if p]
    if not parts:
        return text
    i = rng.randrange(len(parts))
    return " ".join(parts[:i + 1] + [parts[i]] * rng.randint(1, 3) + parts[i + 1:])


def word_salad(text: str, rng: random.Random) -> str:
    """One sentence (of >= 3 words) replaced by its words in a new order: its keywords stay,
    what it stated goes."""
    parts = [p for p in _SENTENCE.split(text.strip()) if p]
    cands = [i for i, p in enumerate(parts) if len(p.split()) >= 3]
    if not cands:
        return text
    i = rng.choice(cands)
    ws = parts[i].rstrip(".!?").split()
    order = list(range(len(ws)))
    while order == sorted(order):
        rng.shuffle(order)
    parts[i] = " ".join(ws[j] for j in order) + "."
    return " ".join(parts)


def truncate_words(text: str, rng: random.Random) -> str:
    """The first few words only (2 to a third of them)."""
    ws = text.split()
    if len(ws) < 6:
        return text
    return " ".join(ws[:rng.randint(2, len(ws) // 3)])


HACKS: dict[str, Callable[[str, random.Random], str]] = {
    "repeat": repeat_sentence, "salad": word_salad, "truncate": truncate_words}


def hack_twins(prompts: Sequence[str], responses: Sequence[str], fraction: float,
               rescore: Callable[[str, str], float], seed: int = 0) -> list[dict[str, str]]:
    """Pairs (response, a hacked twin of it), one per kind of `HACKS`, for a `fraction` of the
    responses, each ordered by the re-scores (ties and unchanged texts dropped)."""
    rng = random.Random(seed)
    out = []
    for p, r in zip(prompts, responses):
        if rng.random() >= fraction:
            continue
        score_r = None  # the response's own re-score, once for all its twins
        for kind in sorted(HACKS):
            twin = HACKS[kind](r, rng)
            if twin == r:
                continue
            score_r = rescore(p, r) if score_r is None else score_r
            pair = _ordered(p, r, score_r, twin, rescore(p, twin))
            if pair is not None:
                out.append(pair)
    return out


def hack_probe(prompts: Sequence[str], responses: Sequence[str],
               score: Callable[[list[str], list[str]], Sequence[float]],
               rescore: Callable[[str, str], float], seed: int = 0) -> dict[str, dict]:
    """Per hack kind: {n, agreement} — the share of (response, twin) pairs, where the re-scorer
    tells them apart, that `score` (a batch RM: prompts, responses -> scores) orders the same way;
    "all" pools the kinds. 1.0: the RM cannot be hacked this way; 0.0: it prefers the hack."""
    rng = random.Random(seed)
    ps, a, b, gold_first = [], [], [], []
    kinds_of = []
    own = [rescore(p, r) for p, r in zip(prompts, responses)]  # once, not once per kind
    for kind in sorted(HACKS):
        for p, r, ga in zip(prompts, responses, own):
            twin = HACKS[kind](r, rng)
            gb = rescore(p, twin)
            if twin != r and ga != gb:
                ps.append(p)
                a.append(r)
                b.append(twin)
                gold_first.append(ga > gb)
                kinds_of.append(kind)
    if not ps:
        return {"all": {"n": 0, "agreement": None}}
    sa = [float(x) for x in score(ps, a)]
    sb = [float(x) for x in score(ps, b)]
    agree = [(x > y) == g for x, y, g in zip(sa, sb, gold_first)]
    out = {}
    for kind in sorted(HACKS) + ["all"]:
        sel = [ok for ok, k in zip(agree, kinds_of) if kind in ("all", k)]
        out[kind] = {"n": len(sel), "agreement": sum(sel) / len(sel) if sel else None}
    return out
