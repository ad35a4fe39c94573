"""Simulated annotators: the gold judge plus noise, a configurable bias and drift over time.

Seed 001 §3.1 ("annotation pollution"): annotators drift (mean score 3.8 over the first 50 items,
4.2 over the last 50) and learn the model's bad patterns. Each simulated annotator scores every
response of a prompt as

    score = clamp(gold + b.length * n_words / 50 + b.filler * n_filler + b.repetition * rep
                  + drift_per_day * days_since_start + N(0, noise_std), 0, 5)
    b.k    = bias[k] + bias[k + "_per_day"] * days_since_start     (k: length, filler, repetition)

so a bias can also grow with time (`{"filler_per_day": 0.02}`: the annotator slowly learns to
like the model's filler phrases, seed 001 §3.1).

and ranks the responses best first. Every label carries `annotator_id` and `labeled_at`, so the
drift can be audited later. Noise is drawn from a generator seeded by (seed, annotator, prompt,
time), so a label does not depend on the order of calls.

    python -c "from datetime import datetime, timezone as tz; from rlhf.pipeline.world.annotators import AnnotatorPool; p = AnnotatorPool(3, 0.3, {}, 0.0, 0, datetime(2026, 1, 1, tzinfo=tz.utc)); print(p.label('What is DNA made of?', ['DNA is a double helix built from four chemical bases.', 'No idea.'], datetime(2026, 1, 2, tzinfo=tz.utc)))"
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from datetime import UTC, datetime

from rlhf.pipeline.world.judge import judge

BIAS_FEATURES = ("length", "filler", "repetition")
BIAS_KEYS = BIAS_FEATURES + tuple(f"{k}_per_day" for k in BIAS_FEATURES)


@dataclass(frozen=True)
class Label:
    annotator_id: str
    labeled_at: datetime
    scores: tuple[float, ...]  # in response order, 0-5
    ranking: tuple[int, ...]  # response indices, best first (ties: lower index first)


def _utc(when: datetime) -> datetime:
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


class AnnotatorPool:
    """A pool of `n_annotators` simulated annotators with ids ann-000, ann-001, ..."""

    def __init__(self, n_annotators: int, noise_std: float, bias: dict[str, float],
                 drift_per_day: float, seed: int, start: datetime):
        if n_annotators < 1:
            raise ValueError("n_annotators must be >= 1")
        if noise_std < 0:
            raise ValueError("noise_std must be >= 0")
        unknown = sorted(set(bias) - set(BIAS_KEYS))
        if unknown:
            raise ValueError(f"unknown bias key(s) {unknown}; known: {list(BIAS_KEYS)}")
        self.ids = tuple(f"ann-{i:03d}" for i in range(n_annotators))
        self.noise_std = float(noise_std)
        self.bias = {k: float(bias.get(k, 0.0)) for k in BIAS_KEYS}
        self.drift_per_day = float(drift_per_day)
        self.seed = int(seed)
        self.start = _utc(start)

    def _rng(self, *parts: object) -> random.Random:
        key = "|".join(str(p) for p in (self.seed, *parts)).encode("utf-8")
        return random.Random(int.from_bytes(hashlib.sha256(key).digest()[:8], "big"))

    def pick(self, prompt: str, when: datetime) -> str:
        """The annotator who labels `prompt` at `when` (deterministic, spread over the pool)."""
        return self.ids[self._rng("pick", prompt, _utc(when).isoformat()).randrange(len(self.ids))]

    def days(self, when: datetime) -> float:
        return (_utc(when) - self.start).total_seconds() / 86400.0

    def drift(self, when: datetime) -> float:
        """Mean shift of every annotator's scores at `when` (seed 001 §3.1)."""
        return self.drift_per_day * self.days(when)

    def bias_at(self, when: datetime) -> dict[str, float]:
        """The bias coefficients at `when`: the base bias plus its growth per day."""
        d = self.days(when)
        return {k: self.bias[k] + self.bias[f"{k}_per_day"] * d for k in BIAS_FEATURES}

    def label(self, prompt: str, responses: list[str], when: datetime,
              annotator_id: str | None = None) -> Label:
        """Score and rank `responses` to `prompt` as one annotator at time `when`."""
        when = _utc(when)
        aid = annotator_id if annotator_id is not None else self.pick(prompt, when)
        if aid not in self.ids:
            raise ValueError(f"unknown annotator {aid!r}")
        rng = self._rng("noise", aid, prompt, when.isoformat())
        shift = self.drift(when)
        b = self.bias_at(when)
        scores = []
        for response in responses:
            j = judge(prompt, response)
            s = (j.score + b["length"] * j.n_words / 50.0 + b["filler"] * j.n_filler
                 + b["repetition"] * j.rep + shift)
            if self.noise_std > 0:
                s += rng.gauss(0.0, self.noise_std)
            scores.append(round(min(5.0, max(0.0, s)), 4))
        ranking = tuple(sorted(range(len(scores)), key=lambda i: (-scores[i], i)))
        return Label(aid, when, tuple(scores), ranking)
