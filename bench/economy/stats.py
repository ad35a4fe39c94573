"""The arithmetic of the benchmark's report (report.py): gold curves on a token grid, tokens to reach a
target, bootstrap intervals over seeds, the "learns" verdict. Pure numpy, no models.

A run is a list of points (cumulative generated tokens, held-out gold mean), the SFT policy at 0
tokens first. Between points gold is interpolated linearly; past a run's last point it is
undefined (NaN): no run is credited with tokens it did not spend.

    .venv/bin/python -c "from bench.economy import stats as s; \
print(s.tokens_to_reach([0, 100, 200], [1.0, 1.2, 1.4], 1.3))"
"""

from __future__ import annotations

import math

import numpy as np

LEARNS_SE = 3.0  # mean gain >= 3 standard errors above 0, and every seed positive


def curve(points: list[tuple[float, float]], grid: np.ndarray) -> np.ndarray:
    """Gold of one run at each grid token count (linear between points, NaN past the last)."""
    x = np.array([p[0] for p in points], dtype=float)
    y = np.array([p[1] for p in points], dtype=float)
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    out = np.interp(grid, x, y)
    out[grid > x[-1] + 1e-9] = np.nan
    return out


def tokens_to_reach(grid, mean_curve, target: float) -> float:
    """The first token count at which `mean_curve` reaches `target` (linear between grid
    points); inf when it never does within its defined part."""
    grid, y = np.asarray(grid, dtype=float), np.asarray(mean_curve, dtype=float)
    for i in range(len(grid)):
        if not math.isfinite(y[i]):
            break
        if y[i] >= target:
            if i == 0:
                return float(grid[0])
            y0, y1 = y[i - 1], y[i]
            return float(grid[i - 1] + (target - y0) / (y1 - y0) * (grid[i] - grid[i - 1]))
    return math.inf


def mean_curve(curves: np.ndarray) -> np.ndarray:
    """Mean over seeds (rows), NaN wherever any seed is undefined."""
    return np.asarray(curves, dtype=float).mean(axis=0)


def ratio_with_interval(grid, base: np.ndarray, arm: np.ndarray, final_index: int,
                        fraction: float = 1.0, n_boot: int = 2000, seed: int = 0) -> dict:
    """Tokens for `arm` to reach `fraction` x the baseline's mean gold at grid[final_index], as a
    ratio to the tokens the baseline itself needs, with a 95 % bootstrap interval (seeds of each
    arm resampled with replacement, target recomputed each time). Rows of base/arm are seeds."""
    def one(b, a):
        target = fraction * mean_curve(b)[final_index]
        tb = tokens_to_reach(grid, mean_curve(b), target)
        ta = tokens_to_reach(grid, mean_curve(a), target)
        return target, tb, ta, (ta / tb if tb > 0 else math.nan)

    target, tb, ta, ratio = one(base, arm)
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(n_boot):
        b = base[rng.integers(0, len(base), len(base))]
        a = arm[rng.integers(0, len(arm), len(arm))]
        boots.append(one(b, a)[3])
    boots = np.array(boots, dtype=float)
    boots = boots[~np.isnan(boots)]  # resamples whose baseline reached its target at 0 tokens
    # no interpolation between draws: an arm that never reaches the target in a draw is inf
    lo, hi = (np.quantile(boots, [0.025, 0.975], method="inverted_cdf") if len(boots)
              else (math.nan, math.nan))
    return {"target": float(target), "tokens_base": tb, "tokens_arm": ta, "ratio": ratio,
            "ci_low": float(lo), "ci_high": float(hi), "n_boot": len(boots)}


def gain_stats(gains: list[float]) -> dict:
    """Mean gold gain over SFT, its standard error over seeds, and the "learns" verdict."""
    g = np.asarray(gains, dtype=float)
    n = len(g)
    mean = float(g.mean()) if n else math.nan
    se = float(g.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    if n < 2:
        verdict = "n/a (1 seed)" if n else "n/a"
    else:
        learns = bool(mean >= LEARNS_SE * se and (g > 0).all())
        verdict = "yes" if learns else "no"
    return {"mean": mean, "se": se, "n": n, "gains": [float(x) for x in g], "learns": verdict}


def difference_interval(base: list[float], arm: list[float], n_boot: int = 2000,
                        seed: int = 0) -> tuple[float, float, float]:
    """Mean(arm) - mean(base) with a 95 % bootstrap interval (each arm's seeds resampled with
    replacement): (difference, low, high)."""
    b, a = np.asarray(base, dtype=float), np.asarray(arm, dtype=float)
    diff = float(a.mean() - b.mean())
    if len(a) < 2 or len(b) < 2:
        return diff, math.nan, math.nan
    rng = np.random.default_rng(seed)
    draws = (rng.choice(a, (n_boot, len(a))).mean(axis=1)
             - rng.choice(b, (n_boot, len(b))).mean(axis=1))
    lo, hi = np.quantile(draws, [0.025, 0.975])
    return diff, float(lo), float(hi)


SAVES = 0.95  # an arm saves compute when it spends at most this share of the baseline's


def verdict(low: float, high: float, compute_ratio: float | None) -> str:
    """The one-line verdict of an arm against the baseline: its gold at equal tokens (the 95 %
    interval [low, high] of the difference) and its generation compute (policy token-forwards in
    generation and old log-probs, as a share of the baseline's)."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return "not enough seeds for a verdict"
    saves = compute_ratio is not None and compute_ratio <= SAVES
    cost = (f"{compute_ratio:.2f}x the generation compute" if compute_ratio is not None
            else "generation compute not counted")
    if high < 0:
        return f"costs gold ({cost}): off"
    if low > 0:
        return f"more gold at equal tokens ({cost})"
    if saves:
        return f"same gold for {cost}: saves compute"
    return f"same gold, no saving ({cost})"
