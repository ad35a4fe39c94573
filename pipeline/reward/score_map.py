"""One reward scale for two reward models: a monotone map from one RM's scores onto another's.

Level 2 (seed 001 §4.1) re-scores a few rollouts of a batch with the strong RM. PPO whitens and
compares the rewards of one batch, so an escalated sample's strong score must mean what its
batch-mates' light scores mean: without a map, two scales mixed in one batch cut the held-out
gold gain from +0.110 to +0.043. The map is fitted on samples both RMs scored (the
reward stage's distillation rollouts, SFT samples drawn as PPO draws them: `fit_on_rollouts`) by
quantile matching: the strong
score's quantile in the strong RM's distribution is sent to the same quantile of the light RM's,

    f(s) = F_light^-1(F_strong(s)),

piecewise linear between `knots` matched quantiles and linear beyond the ends (with the ratio
of the two RMs' spreads as slope), so f is strictly increasing: it keeps the strong RM's order
(what Level 2 is for) and gives its scores the light RM's location and spread. (Regressing light
on strong, E[light | strong], is monotone too but shrinks the strong RM's signal towards the
mean wherever the light RM disagrees: the opposite of what escalation asks for.)

Saved as `score_map.json` in the strong RM's folder; `rlhf ppo --strong-reward` reads it there.

    python -c "from rlhf.pipeline.reward.score_map import ScoreMap; \
m = ScoreMap.fit([0, 1, 2, 3], [10, 20, 30, 40]); print(m([1.5, 5]))"
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

FILENAME = "score_map.json"


@dataclass(frozen=True)
class ScoreMap:
    xs: tuple[float, ...]  # knots on the source scale (the strong RM's), strictly increasing
    ys: tuple[float, ...]  # their images on the target scale (the light RM's), increasing
    slope: float  # beyond the ends: target spread / source spread
    n: int = 0  # samples it was fitted on
    source: str = "strong_rm"
    target: str = "light_rm"

    def __post_init__(self) -> None:
        if len(self.xs) != len(self.ys) or len(self.xs) < 2:
            raise ValueError("a score map needs >= 2 knots, as many xs as ys")
        if any(b <= a for a, b in zip(self.xs, self.xs[1:])):
            raise ValueError("score map knots must be strictly increasing")
        if any(b < a for a, b in zip(self.ys, self.ys[1:])) or not self.slope > 0:
            raise ValueError("a score map must be increasing (ys non-decreasing, slope > 0)")

    @classmethod
    def fit(cls, source: Sequence[float], target: Sequence[float], knots: int = 21) -> ScoreMap:
        """Quantile matching of `source` onto `target` (the same samples, scored by each RM)."""
        s = np.asarray(source, dtype=np.float64)
        t = np.asarray(target, dtype=np.float64)
        if len(s) != len(t):
            raise ValueError(f"fit needs the same samples scored by both RMs, got {len(s)} "
                             f"and {len(t)} scores")
        if len(s) < 4 or np.ptp(s) == 0 or np.ptp(t) == 0:
            raise ValueError(f"fit needs >= 4 samples with varying scores on both sides, "
                             f"got {len(s)}")
        q = np.linspace(0.0, 1.0, max(2, int(knots)))
        xs, ys = np.quantile(s, q), np.quantile(t, q)
        keep = np.concatenate([[True], np.diff(xs) > 1e-9 * max(1.0, np.ptp(s))])
        xs, ys = xs[keep], np.maximum.accumulate(ys[keep])
        slope = float(t.std() / s.std())
        return cls(tuple(map(float, xs)), tuple(map(float, ys)), slope, n=len(s))

    def __call__(self, scores) -> np.ndarray:
        x = np.asarray(scores, dtype=np.float64)
        xs, ys = np.asarray(self.xs), np.asarray(self.ys)
        y = np.interp(x, xs, ys)
        y = np.where(x < xs[0], ys[0] + (x - xs[0]) * self.slope, y)
        return np.where(x > xs[-1], ys[-1] + (x - xs[-1]) * self.slope, y)

    def save(self, folder: str | Path) -> Path:
        from rlhf.store.io import write_text_atomic

        path = Path(folder) / FILENAME
        write_text_atomic(path, json.dumps(asdict(self), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> ScoreMap:
        """From `path` (a score_map.json, or an RM folder holding one)."""
        path = Path(path)
        if path.is_dir():
            path = path / FILENAME
        if not path.is_file():
            raise FileNotFoundError(f"no score map at {path}: the reward stage writes one into "
                                    f"the strong RM's folder (re-run `dvc repro reward`)")
        d = json.loads(path.read_text())
        return cls(tuple(d["xs"]), tuple(d["ys"]), float(d["slope"]), int(d.get("n", 0)),
                   d.get("source", "strong_rm"), d.get("target", "light_rm"))

    def report(self, source: Sequence[float], target: Sequence[float]) -> dict:
        """How well the mapped source matches the target: rank order kept, means and spreads."""
        from rlhf.pipeline.reward.onpolicy import spearman

        mapped = self(source)
        t = np.asarray(target, dtype=np.float64)
        return {"n": len(t), "knots": len(self.xs), "slope": round(self.slope, 4),
                "spearman_mapped_vs_light": spearman(list(mapped), list(t)),
                "mean_mapped": float(mapped.mean()), "mean_light": float(t.mean()),
                "std_mapped": float(mapped.std()), "std_light": float(t.std())}


def fit_on_rollouts(strong_scores: Sequence[float], light, prompts: Sequence[str],
                    responses: Sequence[str], strong_dir: str | Path) -> dict:
    """The reward stage's map: fitted on the distillation set's SFT samples (drawn as PPO draws
    them) that the strong RM labelled, scored by the distilled `light` scorer; saved into
    `strong_dir`. -> its report on those samples (`make report` checks it on fresh on-policy
    samples: reward/figures.py)."""
    if len(responses) < 4:
        return {"skipped": "fewer than 4 SFT samples in the distillation set"}
    light_scores = [float(x) for x in light(list(prompts), list(responses))[0]]
    smap = ScoreMap.fit(strong_scores, light_scores)
    smap.save(strong_dir)
    return smap.report(strong_scores, light_scores)
