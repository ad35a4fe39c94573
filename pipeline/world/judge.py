"""The gold judge: a deterministic 0-5 score for (prompt, response), the world's "human" truth.

It stands in for human annotation or a higher-quality RM (seed 000 §3.4): it labels preferences
(through the simulated annotators) and measures results; PPO never trains on it directly.

    python -c "from rlhf.pipeline.world.judge import gold_score; print(gold_score('Why do leaves look green?', 'Chlorophyll absorbs red and blue light and reflects green light.'))"

Every feature is visible in the response text, so a reward model can learn it:

    words      = lowercase alphanumeric runs of the text (apostrophes dropped, punctuation ignored)
    sentences  = pieces of the response split at . ! ? ; : and newlines
    topic      = the topic whose keywords occur most often in the prompt (ties: table order)
    a sentence *states* a fact when it contains >= 75% of the fact's content words (words
               minus stopwords) in the fact's order (longest common subsequence), so word salad
               does not count; each sentence states at most one fact (the best covered)
    n_on       = distinct facts of the prompt's topic stated
    n_wrong    = distinct facts of any other topic stated (hallucination / off-topic)
    rep        = 1 - distinct word trigrams / word trigrams          (0 when < 3 words)
    n_filler   = occurrences of the FILLER_PHRASES
    n_words    = number of words; band [LEN_LO, LEN_HI] = [15, 60]

    score = 1.0                                    base for a clean, in-band answer
          + 4.0 * (1 - 0.6 ** n_on)                correct facts, diminishing returns
          - 0.9 * n_wrong                          wrong-topic facts
          - 4.0 * rep                              repetition
          - min(0.6 * n_filler, 2.4)               filler
          - 0.1 * max(0, 15 - n_words)             too short
          - min(0.06 * max(0, n_words - 60), 3.0)  too long
    clamped to [0, 5] and rounded to 4 decimals.

A prompt with no recognisable topic has n_on = n_wrong = 0 (only the style terms apply). An empty
response scores 0 (1.0 - 1.5, clamped). Three correct facts in 15-60 clean words score 4.14,
four 4.48; the maximum is approached, never reached, so there is always headroom.
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

from rlhf.pipeline.world.topics import TOPICS, Topic

BASE = 1.0
FACT_GAIN = 4.0
FACT_DECAY = 0.6
WRONG_PENALTY = 0.9
REP_PENALTY = 4.0
FILLER_PENALTY = 0.6
FILLER_CAP = 2.4
LEN_LO, LEN_HI = 15, 60
SHORT_PENALTY = 0.1
LONG_PENALTY = 0.06
LONG_CAP = 3.0
MIN_COVERAGE = 0.75

FILLER_PHRASES: tuple[str, ...] = (
    "it is worth noting that",
    "it goes without saying that",
    "as we all know",
    "needless to say",
    "at the end of the day",
    "in today's fast paced world",
    "believe it or not",
    "to be perfectly honest",
    "all things considered",
    "as a matter of fact",
    "it is important to remember that",
    "when all is said and done",
)

STOPWORDS = frozenset("""
a an the and or but if of to in on at by for with from into onto over under about as is are was
were be been being it its this that these those there their them they he she his her you your we
our us i me my so than then too very can could may might must should would will shall do does did
done have has had not no nor only own same such each every all any both few more most other some
what which who whom whose when where why how just also even still while up down out off again
further once here s t don doesn isn aren wasn weren won didn one
""".split())

_WORD = re.compile(r"[a-z0-9]+")
_SENT = re.compile(r"[.!?;:\n]+")


def words(text: str) -> list[str]:
    """Lowercase alphanumeric words; apostrophes dropped, other punctuation ignored."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = text.replace("'", "").replace("\u2019", "")
    return _WORD.findall(text)


def sentences(text: str) -> list[list[str]]:
    return [w for w in (words(s) for s in _SENT.split(text)) if w]


def content_words(text: str) -> frozenset[str]:
    return frozenset(w for w in words(text) if w not in STOPWORDS)


@dataclass(frozen=True)
class _Fact:
    topic: str
    text: str
    content: frozenset[str]
    order: tuple[str, ...]  # the content words in the fact's order, first occurrences
    need: int  # content words a sentence must contain, in order, to state this fact


@lru_cache(maxsize=1)
def _index() -> tuple[tuple[_Fact, ...], dict[str, tuple[int, ...]]]:
    facts = []
    for topic in TOPICS:
        for text in topic.facts:
            c = content_words(text)
            order = tuple(dict.fromkeys(w for w in words(text) if w in c))
            facts.append(_Fact(topic.name, text, c, order,
                               max(1, math.ceil(MIN_COVERAGE * len(c)))))
    by_word: dict[str, list[int]] = {}
    for i, f in enumerate(facts):
        for w in f.content:
            by_word.setdefault(w, []).append(i)
    return tuple(facts), {w: tuple(ix) for w, ix in by_word.items()}


@lru_cache(maxsize=1)
def _keywords() -> dict[str, tuple[tuple[tuple[str, ...], int], ...]]:
    """First word of a keyword -> (keyword words, topic index) for every keyword."""
    table: dict[str, list[tuple[tuple[str, ...], int]]] = {}
    for ti, t in enumerate(TOPICS):
        for k in t.keywords:
            ws = tuple(words(k))
            table.setdefault(ws[0], []).append((ws, ti))
    return {w: tuple(v) for w, v in table.items()}


@lru_cache(maxsize=65536)
def infer_topic(prompt: str) -> Topic | None:
    """The topic whose keywords occur most often in the prompt (a phrase counts its length)."""
    ws = words(prompt)
    scores = [0] * len(TOPICS)
    table = _keywords()
    for i, w in enumerate(ws):
        for phrase, ti in table.get(w, ()):
            if tuple(ws[i:i + len(phrase)]) == phrase:
                scores[ti] += len(phrase)
    best = max(range(len(TOPICS)), key=lambda ti: (scores[ti], -ti))
    return TOPICS[best] if scores[best] > 0 else None


def _in_order(fact: tuple[str, ...], sent: list[str]) -> int:
    """Length of the longest common subsequence of the fact's content words and the sentence."""
    keep = set(fact)
    seq = [w for w in sent if w in keep]
    prev = [0] * (len(seq) + 1)
    for fw in fact:
        cur = [0]
        for j, sw in enumerate(seq):
            cur.append(prev[j] + 1 if fw == sw else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def stated_facts(response: str) -> list[tuple[str, str]]:
    """(topic name, fact text) for each sentence of the response that states a fact."""
    facts, by_word = _index()
    out = []
    for sent in sentences(response):
        present = set(sent)
        hits: dict[int, int] = {}
        for w in present:
            for i in by_word.get(w, ()):
                hits[i] = hits.get(i, 0) + 1
        best, best_cov = None, 0.0
        for i, h in sorted(hits.items()):
            if h >= facts[i].need:
                h = _in_order(facts[i].order, sent)
                if h < facts[i].need:
                    continue
                cov = h / len(facts[i].content)
                if cov > best_cov:
                    best, best_cov = i, cov
        if best is not None:
            out.append((facts[best].topic, facts[best].text))
    return out


def repetition(ws: list[str]) -> float:
    """Share of word trigrams that repeat an earlier trigram (0 for fewer than 3 words)."""
    grams = [tuple(ws[i:i + 3]) for i in range(len(ws) - 2)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


@lru_cache(maxsize=1)
def _filler_phrases() -> dict[str, tuple[tuple[str, ...], ...]]:
    table: dict[str, list[tuple[str, ...]]] = {}
    for p in FILLER_PHRASES:
        ws = tuple(words(p))
        table.setdefault(ws[0], []).append(ws)
    return {w: tuple(v) for w, v in table.items()}


def filler_count(ws: list[str]) -> int:
    """Occurrences of the filler phrases in the word list."""
    table = _filler_phrases()
    return sum(1 for i, w in enumerate(ws) for p in table.get(w, ())
               if tuple(ws[i:i + len(p)]) == p)


@dataclass(frozen=True)
class Judgement:
    score: float
    topic: str | None
    n_on: int
    n_wrong: int
    rep: float
    n_filler: int
    n_words: int


def judge(prompt: str, response: str) -> Judgement:
    """The score with every feature that produced it (see the module docstring)."""
    topic = infer_topic(prompt)
    ws = words(response)
    on: set[str] = set()
    wrong: set[str] = set()
    if topic is not None:
        for t, fact in stated_facts(response):
            (on if t == topic.name else wrong).add(fact)
    rep = repetition(ws)
    n_filler = filler_count(ws)
    n = len(ws)
    score = (BASE
             + FACT_GAIN * (1.0 - FACT_DECAY ** len(on))
             - WRONG_PENALTY * len(wrong)
             - REP_PENALTY * rep
             - min(FILLER_PENALTY * n_filler, FILLER_CAP)
             - SHORT_PENALTY * max(0, LEN_LO - n)
             - min(LONG_PENALTY * max(0, n - LEN_HI), LONG_CAP))
    score = round(min(5.0, max(0.0, score)), 4)
    return Judgement(score, topic.name if topic else None, len(on), len(wrong), rep, n_filler, n)


def gold_score(prompt: str, response: str) -> float:
    """The gold score of `response` to `prompt`, in [0, 5]."""
    return judge(prompt, response).score
