"""What a PPO run measures of the machine rather than makes, and where it goes.

A run's versioned outputs (metrics.jsonl, summary.json, the checkpoints' trainer_state.json and
the store rows) hold only what its inputs determine, so `dvc repro` on unchanged inputs writes the
same bytes and `git status` stays clean after `make run` (docs/reliability.md):

- wall-clock figures (`seconds_<phase>`, `seconds_cum`, `gpu_peak_gib_<phase>`) go to
  `timings.jsonl` in the run folder and to each checkpoint's `timings.json`, which .dvcignore
  keeps out of the stage's output hashes (as it does the TensorBoard folder);
- the store rows' timestamps (`created_at`, `scored_at`, `logged_at`) are the time of the run,
  unless SOURCE_DATE_EPOCH is set (the reproducible-builds convention; `make run` sets it): then
  each is that epoch plus the row's step in seconds, so they still order by step, and
  `train_metrics.seconds_cum` is left null.

    SOURCE_DATE_EPOCH=1767225600 rlhf ppo ...   # rows stamped 2026-01-01 00:00:00 UTC + step s
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from rlhf.pipeline.config import ConfigError

ENV = "SOURCE_DATE_EPOCH"
MEASURED_PREFIXES = ("seconds", "gpu_peak_gib")


def fixed_epoch() -> datetime | None:
    """SOURCE_DATE_EPOCH as a UTC time; None when it is unset or empty."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        raise ConfigError(f"{ENV}={raw!r}: expected whole seconds since 1970-01-01 UTC (>= 0)")
    return datetime.fromtimestamp(int(raw), UTC)


def stamp(step: int) -> datetime:
    """The timestamp a row of `step` carries: now, or SOURCE_DATE_EPOCH + step seconds."""
    epoch = fixed_epoch()
    return datetime.now(UTC) if epoch is None else epoch + timedelta(seconds=int(step))


def measured(value: float | None) -> float | None:
    """A wall-clock figure as a versioned store row keeps it: None under SOURCE_DATE_EPOCH."""
    return None if fixed_epoch() is not None else value


def is_measured(key: str) -> bool:
    return key.startswith(MEASURED_PREFIXES)


def split(metrics: dict) -> tuple[dict, dict]:
    """(`metrics` without its wall-clock figures, those figures); `step` stays in both."""
    kept = {k: v for k, v in metrics.items() if not is_measured(k)}
    timings = {k: v for k, v in metrics.items() if is_measured(k)}
    if "step" in metrics:
        timings = {"step": metrics["step"], **timings}
    return kept, timings
