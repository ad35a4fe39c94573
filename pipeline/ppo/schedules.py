"""PPO schedules: the dynamic λ-ε table, adaptive clipping from the batch KL, the KL warm-up.

Pure functions of the step (and the batch KL) plus one small stateful controller for kl_coef, so
the trainer asks "what are λ, ε and kl_coef at this step?" in one place. Each feature is a
switch in params.yaml (`ppo.lambda_eps_table_on`, `ppo.adaptive_clip_on`, `ppo.kl_warmup_on`);
all off gives plain PPO with the fixed `gae_lambda`, `clip_range` and `kl_coef`.

    python -c "from rlhf.pipeline.ppo.schedules import lambda_eps; print(lambda_eps(1500))"
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# Seed 000 §3.3: (first step of the phase, λ, ε). Early: stable; middle: faster; late: fine-tune.
DEFAULT_LAMBDA_EPS_TABLE: tuple[tuple[int, float, float], ...] = (
    (0, 0.92, 0.10),
    (1000, 0.95, 0.15),
    (5000, 0.98, 0.08),
)


def lambda_eps(step: int, table: tuple[tuple[int, float, float], ...] = DEFAULT_LAMBDA_EPS_TABLE
               ) -> tuple[float, float]:
    """(gae_lambda, clip_range) of the table row whose first step is the largest one <= step."""
    check_lambda_eps_table(table)
    lam, eps = table[0][1], table[0][2]
    for start, row_lam, row_eps in table:
        if step >= start:
            lam, eps = row_lam, row_eps
    return lam, eps


def check_lambda_eps_table(table: tuple[tuple[int, float, float], ...]) -> None:
    """ValueError unless the table starts at step 0, is strictly increasing and in range."""
    if not table:
        raise ValueError("lambda_eps_table is empty")
    starts = [row[0] for row in table]
    if starts[0] != 0:
        raise ValueError(f"lambda_eps_table must start at step 0, starts at {starts[0]}")
    if any(b <= a for a, b in zip(starts, starts[1:])):
        raise ValueError(f"lambda_eps_table steps must increase strictly: {starts}")
    for start, lam, eps in table:
        if not 0.0 <= lam <= 1.0 or not 0.0 < eps < 1.0:
            raise ValueError(f"lambda_eps_table row {start}: need 0 <= λ <= 1 and 0 < ε < 1, "
                             f"got λ={lam}, ε={eps}")


def adaptive_clip(batch_kl: float, base_clip: float, kl_low: float = 0.02, kl_high: float = 0.1,
                  clip_low: float = 0.02, clip_high: float = 0.1,
                  between: Literal["keep", "interpolate"] = "keep") -> float:
    """ε from the batch KL (seed 001 §5.2: KL > 0.1 → ε = 0.1; KL < 0.02 → ε = 0.02).

    `batch_kl` is the current batch's mean per-token KL to the reference policy. The seed gives
    only the two ends; in between (kl_low <= KL <= kl_high) `between="keep"` keeps `base_clip`
    (the table's or the fixed ε), so this composes with the λ-ε table, while
    `between="interpolate"` moves ε linearly from clip_low to clip_high (continuous at both
    thresholds).
    """
    if not kl_low < kl_high:
        raise ValueError(f"adaptive clip needs kl_low < kl_high, got {kl_low} and {kl_high}")
    if batch_kl > kl_high:
        return clip_high
    if batch_kl < kl_low:
        return clip_low
    if between == "keep":
        return base_clip
    if between == "interpolate":
        frac = (batch_kl - kl_low) / (kl_high - kl_low)
        return clip_low + frac * (clip_high - clip_low)
    raise ValueError(f"unknown adaptive clip mode {between!r}; use 'keep' or 'interpolate'")


def kl_warmup(step: int, target: float, warmup_steps: int = 100) -> float:
    """kl_coef rising linearly from 0 at step 0 to `target` at `warmup_steps` (seed 001 §5.1)."""
    if warmup_steps <= 0:
        return target
    return target * min(1.0, max(step, 0) / warmup_steps)


@dataclass
class KLController:
    """kl_coef at each step: the target (optionally warmed up), overridden after a reward collapse.

    Seed 000 §5.1: on a reward collapse, raise kl_coef to 2.0 for a while so the KL penalty pulls
    the policy back while the RM is refreshed. The override holds for `override_steps` steps.
    Its state (`state_dict`) goes into every checkpoint so a resumed run continues exactly.
    """

    target: float
    warmup_on: bool = False
    warmup_steps: int = 100
    override_value: float = 2.0
    override_steps: int = 100
    override_until: int = -1  # last step (inclusive) of an active override; -1 = none

    def value(self, step: int) -> float:
        if step <= self.override_until:
            return self.override_value
        if self.warmup_on:
            return kl_warmup(step, self.target, self.warmup_steps)
        return self.target

    def trigger_override(self, step: int) -> None:
        """Hold kl_coef at `override_value` for `override_steps` steps, starting at `step`."""
        self.override_until = step + self.override_steps - 1

    def state_dict(self) -> dict:
        return {"override_until": self.override_until}

    def load_state_dict(self, state: dict) -> None:
        self.override_until = int(state["override_until"])
