"""Reward-model confidence: what the 0.6 gate of seed 000 §3.4 measures, as pure math.

Seed 000 §3.4 asks the RM for a confidence "based on the last-layer logits entropy" next to its
scalar reward, and keeps a sample out of the update (and queues it for RM fine-tuning) when the
confidence is below 0.6. PPO always records such a score as `queued` in the `rm_scores` table;
with `ppo.rm_gate_mask_on` it also keeps the sample out of the update (flag `gated`) and queues
it for the light RM's fine-tuning (pipeline/ppo/features/rm_evolution.py); with the switch off
(the default) PPO still trains on it. `ppo.escalate_below` can send it to the strong RM instead.
A scalar RM has no distribution of its own, so we use the one its training loss defines: under
the Bradley-Terry model the RM was fit with, a score margin `m` between two texts is a logit,
and `sigmoid(m / T)` is the probability that the first is preferred (T: a temperature fitted on
held-out pairs so that the probability is calibrated).

- For a pair (a, b): P(a > b) = mean_i sigmoid((r_i(a) - r_i(b)) / T) over the ensemble members i.
- For one sample x (what PPO needs): the same distribution against the reference score, the mean
  score of the SFT policy's responses: P(x beats the baseline policy) =
  mean_i sigmoid((r_i(x) - ref_i) / T).

confidence = 1 - H2(P), with H2 the binary entropy in bits: 1 when the RM (all members) is sure
of the direction, 0 when P = 0.5. Averaging the members' probabilities before taking the entropy
makes disagreement between members lower the confidence too (the entropy of the mean includes
the members' mutual information). The gate `confidence >= 0.6` is the same as
P >= 0.9206 or P <= 0.0794 (`probability_at_confidence(0.6)`): the RM, calibrated, is at least
92 % sure whether the sample is better or worse than what the baseline policy writes.
The reward stage reports held-out pairwise accuracy by confidence bin to check that.

    python -c "from rlhf.pipeline.reward.confidence import probability_at_confidence as p; print(p(0.6))"
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# Seed 000 §3.4: samples below this confidence go to the RM fine-tune queue (`queued` in
# rm_scores) and, with ppo.rm_gate_mask_on, are kept out of the update as the seed asks.
CONFIDENCE_GATE = 0.6


def binary_entropy_bits(p):
    """H2(p) in bits, elementwise, for a float or a torch tensor (0 at p in {0, 1}, 1 at 0.5)."""
    if isinstance(p, (int, float)):
        if p <= 0.0 or p >= 1.0:
            return 0.0
        return -(p * math.log2(p) + (1 - p) * math.log2(1 - p))
    import torch

    p = p.clamp(0.0, 1.0)
    return -(torch.special.xlogy(p, p) + torch.special.xlogy(1 - p, 1 - p)) / math.log(2.0)


def preference_probability(margins, temperature: float = 1.0):
    """P(first preferred) from score margins [members, B] (or [B]): mean over members of sigmoid."""
    import torch

    margins = torch.as_tensor(margins, dtype=torch.float32)
    if margins.dim() == 1:
        margins = margins.unsqueeze(0)
    return torch.sigmoid(margins / temperature).mean(dim=0)


def confidence_from_margins(margins, temperature: float = 1.0):
    """Confidence in [0, 1] per column of margins [members, B]: 1 - H2(P(first preferred))."""
    return 1.0 - binary_entropy_bits(preference_probability(margins, temperature))


def probability_at_confidence(confidence: float) -> float:
    """The P >= 0.5 at which 1 - H2(P) equals `confidence` (bisection; H2 falls on [0.5, 1])."""
    if not 0.0 <= confidence <= 1.0:
        raise ValueError(f"confidence must be in [0, 1], got {confidence}")
    lo, hi = 0.5, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if 1.0 - binary_entropy_bits(mid) < confidence:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def fit_temperature(pair_margins, grid: Sequence[float] | None = None) -> float:
    """The temperature T minimising the held-out log-loss of P(chosen > rejected).

    `pair_margins` [members, n_pairs]: r_i(chosen) - r_i(rejected). A 1-D search over a log grid
    (robust, no optimiser state); T > 1 softens an over-confident RM, T < 1 sharpens it.
    """
    import torch

    margins = torch.as_tensor(pair_margins, dtype=torch.float32)
    if margins.dim() == 1:
        margins = margins.unsqueeze(0)
    if margins.shape[1] == 0:
        return 1.0
    grid = grid or [10 ** (k / 20) for k in range(-30, 41)]  # 0.03 .. 100
    best_t, best_nll = 1.0, math.inf
    for t in grid:
        p = preference_probability(margins, t).clamp(1e-7, 1 - 1e-7)
        nll = float(-torch.log(p).mean())
        if nll < best_nll - 1e-9:
            best_t, best_nll = float(t), nll
    return best_t


def accuracy_by_confidence(pair_margins, temperature: float = 1.0,
                           edges: Sequence[float] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0001)) -> list[dict]:
    """Held-out pairwise accuracy per confidence bin (and the share of pairs in each).

    A pair counts as correct when P(chosen > rejected) > 0.5. Rows: {"bin": "[0.6, 0.8)",
    "lo", "hi", "n", "share", "accuracy"} (accuracy None for an empty bin).
    """
    p = preference_probability(pair_margins, temperature)
    conf = 1.0 - binary_entropy_bits(p)
    correct = (p > 0.5).float()
    n_total = int(p.numel())
    rows = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        mask = (conf >= lo) & (conf < hi)
        n = int(mask.sum())
        rows.append({
            "bin": f"[{lo:.1f}, {min(hi, 1.0):.1f}{']' if hi > 1 else ')'}",
            "lo": float(lo), "hi": float(min(hi, 1.0)), "n": n,
            "share": n / n_total if n_total else 0.0,
            "accuracy": float(correct[mask].mean()) if n else None,
        })
    return rows
