"""SFT demonstrations of mixed quality, so a policy trained on them has headroom for RL.

Each demonstration answers a framed question of the knowledge table. The quality mix is a
parameter (world.demo_mix); the kinds are:

    good         an opener, 2-4 correct on-topic facts with connectives, maybe a closing line
    filler       correct facts padded with filler phrases ("it is worth noting that", ...)
    wrong_topic  one or two correct facts plus facts of another topic (hallucination)
    repetitive   a fact or sentence repeated
    too_short    a one-line answer under the length band
    too_long     many facts plus padding, far over the length band

    rlhf world generate --seed 0 --out artifacts/world   # writes demonstrations.jsonl
"""

from __future__ import annotations

import random

from rlhf.pipeline.world.judge import FILLER_PHRASES, content_words
from rlhf.pipeline.world.sources import FRAMES, frame
from rlhf.pipeline.world.topics import TOPICS, Topic

QUALITIES = ("good", "filler", "wrong_topic", "repetitive", "too_short", "too_long")

OPENERS = ("", "", "", "Good question.", "Sure.", "Here is a short answer.", "Let me explain.",
           "Here is how it works.", "In short:", "Here are the key points.", "Happy to help.")
OPENERS_SUBJECT = ("Let me explain {s}.", "Here is what matters about {s}.",
                   "A few points about {s}.")
CONNECTIVES = ("", "", "Also, ", "In addition, ", "On top of that, ", "Another point: ",
               "Besides that, ", "Finally, ", "What is more, ")
CLOSERS = ("", "", "", "", "I hope this helps.", "Let me know if you want more detail.",
           "That is the core idea.", "Those are the main points.")
FILLER_SENTENCES = ("At the end of the day, this matters a lot.",
                    "Needless to say, this is a big topic.",
                    "As we all know, there is a lot to say here.",
                    "Believe it or not, many people wonder about this.",
                    "All things considered, it is quite interesting.",
                    "When all is said and done, it is a fascinating subject.")
PADDING = ("There are many different opinions about this.",
           "People have studied this question for a long time.",
           "It can be explained in many ways depending on the situation.",
           "This is something that comes up quite often in everyday life.",
           "There is a lot more that could be said about all of this.",
           "Every case is a little different, so details vary.")
SHORT = ("{S} is an interesting topic.", "It depends.", "{S} is complicated.",
         "That is a good question about {s}.", "Look it up.", "I am not sure about {s}.")
_PROPER = frozenset({"Johannes", "Hawaii", "Rome's", "Romans", "Earth's", "Ohm's", "Hawking"})


def _lower_first(sentence: str) -> str:
    first = sentence.split(" ", 1)[0]
    if first in _PROPER or first[1:2].isupper():
        return sentence
    return sentence[0].lower() + sentence[1:]


def _join(facts: list[str], rng: random.Random) -> list[str]:
    out = []
    for i, f in enumerate(facts):
        c = rng.choice(CONNECTIVES) if i else ""
        out.append(c + (_lower_first(f) if c else f))
    return out


def _opener(topic: Topic, rng: random.Random) -> list[str]:
    if rng.random() < 0.2:
        return [rng.choice(OPENERS_SUBJECT).format(s=topic.subject)]
    o = rng.choice(OPENERS)
    return [o] if o else []


def _closer(rng: random.Random) -> list[str]:
    c = rng.choice(CLOSERS)
    return [c] if c else []


def _other_topic(topic: Topic, rng: random.Random) -> Topic:
    same = [t for t in TOPICS if t.category == topic.category and t is not topic]
    pool = same if same and rng.random() < 0.6 else [t for t in TOPICS if t is not topic]
    return rng.choice(pool)


def _relevant_first(facts: list[str], question: str) -> list[str]:
    # Facts sharing content words with the question lead, so answers address the question.
    q = content_words(question)
    return sorted(facts, key=lambda f: -len(q & content_words(f)))


def response(topic: Topic, quality: str, rng: random.Random, question: str = "") -> str:
    """A response to `question` (of `topic`) of the given quality kind."""
    facts = list(topic.facts)
    rng.shuffle(facts)
    if question and rng.random() < 0.8:
        facts = _relevant_first(facts, question)
    if quality == "good":
        k = rng.choices((2, 3, 4), (0.25, 0.45, 0.30))[0]
        parts = _opener(topic, rng) + _join(facts[:k], rng) + _closer(rng)
    elif quality == "filler":
        k = rng.choice((2, 3))
        padded = set(rng.sample(range(k), rng.randint(1, k)))
        body = []
        for i, f in enumerate(facts[:k]):
            if i in padded:  # filler replaces the connective: "Needless to say, plants ..."
                phrase = rng.choice(FILLER_PHRASES)
                sep = " " if phrase.endswith(" that") else ", "
                body.append(phrase[0].upper() + phrase[1:] + sep + _lower_first(f))
            else:
                body.extend(_join([f], rng) if i == 0 else
                            [rng.choice(CONNECTIVES[2:]) + _lower_first(f)])
        if rng.random() < 0.7:
            body.insert(rng.randrange(len(body) + 1), rng.choice(FILLER_SENTENCES))
        parts = _opener(topic, rng) + body
    elif quality == "wrong_topic":
        other = list(_other_topic(topic, rng).facts)
        rng.shuffle(other)
        mixed = facts[: rng.choice((1, 2))] + other[: rng.choice((1, 2))]
        rng.shuffle(mixed)
        parts = _opener(topic, rng) + _join(mixed, rng) + _closer(rng)
    elif quality == "repetitive":
        if rng.random() < 0.5:
            body = [facts[0]] * rng.choice((2, 3)) + facts[1: rng.choice((1, 2))]
        else:
            body = facts[:2] + facts[:2]
        rng.shuffle(body)
        parts = _opener(topic, rng) + body
    elif quality == "too_short":
        if rng.random() < 0.5:
            s = rng.choice(SHORT).format(s=topic.subject, S=topic.subject[0].upper() + topic.subject[1:])
            parts = [s]
        else:
            parts = [facts[0]]
    elif quality == "too_long":
        k = rng.choice((5, 6, 7))
        body = _join(facts[:k], rng)
        pads = list(PADDING)
        rng.shuffle(pads)
        for p in pads[: rng.choice((3, 4, 5))]:
            body.insert(rng.randrange(len(body) + 1), p)
        parts = _opener(topic, rng) + body + _closer(rng)
    else:
        raise ValueError(f"unknown quality {quality!r}; known: {QUALITIES}")
    return " ".join(parts)


def demonstrations(rng: random.Random, n: int, mix: dict[str, float]) -> list[dict]:
    """`n` demonstrations {prompt, response, topic, quality}, qualities drawn from `mix`."""
    unknown = sorted(set(mix) - set(QUALITIES))
    if unknown:
        raise ValueError(f"unknown demo quality {unknown}; known: {list(QUALITIES)}")
    kinds = [q for q in QUALITIES if mix.get(q, 0) > 0]
    weights = [mix[q] for q in kinds]
    out = []
    for _ in range(n):
        topic = rng.choice(TOPICS)
        question = rng.choice(topic.questions)
        prompt = frame(question, rng.randrange(len(FRAMES)))
        quality = rng.choices(kinds, weights)[0]
        out.append({"prompt": prompt, "response": response(topic, quality, rng, question),
                    "topic": topic.name, "quality": quality})
    return out
