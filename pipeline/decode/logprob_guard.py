"""The run-time check that lets the PPO trainer reuse an engine's old log-probs.

An engine that returns the sampled tokens' log-probs (native, static) saves the trainer's
old-log-prob forward. That is only sound while those log-probs are the trainer's: in bf16 on a
GPU the one-token decode kernels and the whole-sequence forward differ. So every `every`
reuse opportunities the guard recomputes the old log-probs of `rows` sampled rows by the
trainer's own forward and compares (mean and max |delta log p| over their response tokens).
Within `tol` (the max) the engine's log-probs are reused; otherwise the trainer warns, counts
it (`logprob_guard_failures` in the metrics) and runs its own pass, and keeps checking every
step until a check passes again. `every` = 0 turns the guard off (the engine's log-probs are
trusted as before). The rows are drawn by the guard's own generator: the check takes no draw
from the global RNG, so a run's samples do not depend on it.

    python -c "from rlhf.pipeline.decode import LogprobGuard; help(LogprobGuard)"
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class LogprobMismatch(UserWarning):
    """The engine's old log-probs differ from the trainer's forward beyond the tolerance."""


@dataclass(frozen=True)
class GuardCheck:
    mean: float   # mean |engine - trainer| log-prob over the checked response tokens
    max: float    # their max
    rows: int
    ok: bool


class LogprobGuard:
    """The guard's state across steps: when to check, which rows, whether to trust."""

    def __init__(self, every: int, rows: int, tol: float, seed: int = 0):
        if every < 0 or rows < 1 or not tol > 0:
            raise ValueError(f"logprob guard: every >= 0, rows >= 1, tol > 0; got every={every}, "
                             f"rows={rows}, tol={tol}")
        self.every, self.rows, self.tol = every, rows, tol
        self.gen = torch.Generator().manual_seed(seed)
        self.seen = 0          # reuse opportunities so far
        self.trusted = True
        self.last: GuardCheck | None = None

    @property
    def active(self) -> bool:
        return self.every > 0

    def due(self) -> bool:
        """Whether this reuse opportunity is checked (call once per opportunity)."""
        self.seen += 1
        return self.active and (not self.trusted or (self.seen - 1) % self.every == 0)

    def pick(self, n: int) -> torch.Tensor:
        """Up to `rows` of `n` rows, drawn without replacement by the guard's generator."""
        return torch.randperm(n, generator=self.gen)[: self.rows].sort().values

    def compare(self, engine_lp: torch.Tensor, trainer_lp: torch.Tensor,
                mask: torch.Tensor) -> GuardCheck:
        """The check of [b, T] log-probs over the response tokens `mask`; sets `trusted`."""
        d = (engine_lp.float() - trainer_lp.float()).abs()[mask.bool()]
        mean, top = (float(d.mean()), float(d.max())) if d.numel() else (0.0, 0.0)
        self.last = GuardCheck(mean, top, int(engine_lp.shape[0]), top <= self.tol)
        self.trusted = self.last.ok
        return self.last
