"""Training diagnostics: gradient-norm histograms (seed 000 §3.3) and reward collapse (§5.1).

Both are small stateful observers the trainer feeds once per step; they return suggestions or
events, which the trainer prints as warnings and logs. Pure Python (no torch), so they are tested
on hand-made sequences (tests/test_ppo_schedules.py).

    python -m pytest -q tests/test_ppo_schedules.py

Gradient-norm histogram (§3.3: "when the peak of the actor's gradient L2-norm distribution moves
from 1e-3 to 1e-2, updates are too weak: raise ε; when it turns bimodal, main peak at 1e-4 and a
second at 1e-1, some parameters update too hard: lower λ"). Precisely:

- Each step the trainer passes the L2 norm of the gradient of every parameter tensor of the
  actor. Their log10 values are binned into `bin_width`-decade bins over [log_min, log_max].
- The step's *peak* is the centre of the fullest bin (ties: the lower bin).
- The *reference peak* is the median of the peaks of the first `reference_steps` steps. When a
  later step's peak sits at least `shift_decades` (1.0 = ×10) above the reference: suggestion
  "increase_clip".
- *Bimodal*: the histogram has two local maxima (bins with no fuller neighbour; a plateau counts
  once) at least `bimodal_separation` decades apart, the smaller holding at least
  `bimodal_min_frac` of all norms, and the emptiest bin between them holding at most
  `bimodal_valley_ratio` × the smaller peak. Suggestion "decrease_lambda".

Reward collapse (§5.1: "when rew_mean drops more than 30% in one step while rew_std rises more
than 200%, trigger RM fine-tuning; meanwhile raise kl_coef to 2.0"): an event when
(prev_mean - mean) / |prev_mean| > `mean_drop` and (std - prev_std) / prev_std > `std_rise`,
comparing consecutive steps.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field


# --------------------------------------------------------------------------- gradient norms
def log_histogram(norms: list[float], log_min: float = -8.0, log_max: float = 2.0,
                  bin_width: float = 0.5) -> list[int]:
    """Counts of log10(norm) in bins of `bin_width` decades over [log_min, log_max].

    Zero or non-finite norms are dropped; norms outside the range land in the end bins.
    """
    n_bins = int(round((log_max - log_min) / bin_width))
    counts = [0] * n_bins
    for x in norms:
        if not (x > 0 and math.isfinite(x)):
            continue
        i = int(math.floor((math.log10(x) - log_min) / bin_width))
        counts[min(max(i, 0), n_bins - 1)] += 1
    return counts


def _local_maxima(counts: list[int]) -> list[int]:
    """Indices of the local maxima of `counts` (a flat plateau counts once, at its left end)."""
    peaks, i, n = [], 0, len(counts)
    while i < n:
        j = i
        while j + 1 < n and counts[j + 1] == counts[i]:
            j += 1
        left = counts[i - 1] if i > 0 else -1
        right = counts[j + 1] if j + 1 < n else -1
        if counts[i] > 0 and counts[i] > left and counts[i] > right:
            peaks.append(i)
        i = j + 1
    return peaks


@dataclass
class GradNormMonitor:
    """Watches the per-tensor gradient-norm histogram; see the module docstring for the rules."""

    log_min: float = -8.0
    log_max: float = 2.0
    bin_width: float = 0.5
    reference_steps: int = 10
    shift_decades: float = 1.0
    bimodal_separation: float = 2.0
    bimodal_min_frac: float = 0.1
    bimodal_valley_ratio: float = 0.5
    reference_peaks: list[float] = field(default_factory=list)

    def centre(self, i: int) -> float:
        return self.log_min + (i + 0.5) * self.bin_width

    def peak(self, counts: list[int]) -> float:
        """log10 of the centre of the fullest bin (lowest such bin on ties)."""
        return self.centre(max(range(len(counts)), key=lambda i: (counts[i], -i)))

    def is_bimodal(self, counts: list[int]) -> bool:
        total = sum(counts)
        if total == 0:
            return False
        peaks = sorted(_local_maxima(counts), key=lambda i: (-counts[i], i))[:2]
        if len(peaks) < 2:
            return False
        a, b = sorted(peaks)
        smaller = min(counts[a], counts[b])
        if (b - a) * self.bin_width < self.bimodal_separation:
            return False
        if smaller < self.bimodal_min_frac * total:
            return False
        return min(counts[a + 1:b]) <= self.bimodal_valley_ratio * smaller

    def observe(self, norms: list[float]) -> dict:
        """Feed one step's per-tensor gradient norms; returns the step's diagnosis:
        {"peak_log10", "reference_log10" (None until set), "bimodal", "suggestions": [...]}.
        """
        counts = log_histogram(norms, self.log_min, self.log_max, self.bin_width)
        result = {"peak_log10": None, "reference_log10": None, "bimodal": False,
                  "suggestions": [], "histogram": counts}
        if sum(counts) == 0:
            return result
        peak = self.peak(counts)
        result["peak_log10"] = peak
        if len(self.reference_peaks) < self.reference_steps:
            self.reference_peaks.append(peak)
        else:
            ref = statistics.median(self.reference_peaks)
            result["reference_log10"] = ref
            if peak - ref >= self.shift_decades - 1e-9:
                result["suggestions"].append("increase_clip")
        if self.is_bimodal(counts):
            result["bimodal"] = True
            result["suggestions"].append("decrease_lambda")
        return result

    def state_dict(self) -> dict:
        return {"reference_peaks": list(self.reference_peaks)}

    def load_state_dict(self, state: dict) -> None:
        self.reference_peaks = list(state["reference_peaks"])


SUGGESTION_TEXT = {
    "increase_clip": "gradient-norm peak moved up by >= {shift} decade(s): updates too weak, "
                     "consider a larger clip_range ε (seed 000 §3.3)",
    "decrease_lambda": "gradient-norm histogram is bimodal: some parameters update too hard, "
                       "consider a smaller gae_lambda λ (seed 000 §3.3)",
}


# --------------------------------------------------------------------------- reward collapse
@dataclass
class RewardCollapseDetector:
    """Flags a one-step reward collapse: mean drop > `mean_drop` and std rise > `std_rise`."""

    mean_drop: float = 0.30
    std_rise: float = 2.00
    prev: tuple[float, float] | None = None

    def observe(self, mean: float, std: float) -> bool:
        """Feed one step's reward mean and std; True when this step is a collapse."""
        prev, self.prev = self.prev, (float(mean), float(std))
        if prev is None:
            return False
        prev_mean, prev_std = prev
        if prev_mean == 0 or prev_std <= 0:
            return False
        drop = (prev_mean - mean) / abs(prev_mean)
        rise = (std - prev_std) / prev_std
        return drop > self.mean_drop and rise > self.std_rise

    def state_dict(self) -> dict:
        return {"prev": list(self.prev) if self.prev else None}

    def load_state_dict(self, state: dict) -> None:
        self.prev = tuple(state["prev"]) if state["prev"] else None


class GradNormDiagnosis(UserWarning):
    """The gradient-norm diagnosis's advice to the user (printed once when it appears; every
    occurrence is an `grad_norm_diagnosis` event in events.jsonl)."""
