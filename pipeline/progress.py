"""Progress of every long step, in one style: a rich bar with counts, elapsed time and an
estimate on a terminal; a plain line every 10% (or 30 s) when stderr is not one (`dvc repro`
piped to a file, CI logs), so a log still shows how far a stage got and how long it has left.

The `rlhf` command turns bars on (`enable`); library use (tests, benchmarks) stays quiet unless
it does the same. A step that reports progress either takes a `progress(k)` callback from its
caller or, given none, opens its own `bar`:

    with bar("sampling rollouts", total=len(prompts), unit="prompts") as advance:
        ...
        advance(len(chunk))
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

_state: dict[str, Any] = {"enabled": False, "progress": None, "depth": 0}
# non-terminal mode: a line per 10% (at most one per 2 s) or per 30 s, and one at the end
MIN_SECONDS, EVERY_SECONDS = 2.0, 30.0


def enable(on: bool = True) -> None:
    _state["enabled"] = on


def enabled() -> bool:
    return _state["enabled"]


def _console():
    from rich.console import Console

    return Console(stderr=True)


def _fmt_seconds(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class _Lines:
    """Non-terminal mode: `description  k/total unit  p%  elapsed h:mm:ss  eta h:mm:ss`."""

    def __init__(self, description: str, total: int | None, unit: str):
        self.description, self.total, self.unit = description, total, unit
        # the clock starts at the first advance: a bar opened before its work (dedup's clustering
        # bar, open while the embedding runs) shows the time of its own work
        self.done, self.t0 = 0, None
        self.last_t, self.last_tenth = None, 0

    def line(self) -> str:
        elapsed = time.monotonic() - self.t0 if self.t0 is not None else 0.0
        unit = f" {self.unit}" if self.unit else ""
        if not self.total:
            return f"{self.description}  {self.done:,}{unit}  elapsed {_fmt_seconds(elapsed)}"
        share = self.done / self.total
        eta = elapsed / share - elapsed if share > 0 else float("nan")
        eta_s = _fmt_seconds(eta) if share > 0 else "?"
        return (f"{self.description}  {self.done:,}/{self.total:,}{unit}  {share:4.0%}  "
                f"elapsed {_fmt_seconds(elapsed)}  eta {eta_s}")

    def advance(self, k: int) -> None:
        self.done += k
        now = time.monotonic()
        if self.t0 is None:
            self.t0 = self.last_t = now
        tenth = int(self.done * 10 // self.total) if self.total else 0
        quiet_for = now - self.last_t
        if (tenth > self.last_tenth and quiet_for >= MIN_SECONDS) or quiet_for >= EVERY_SECONDS:
            if not (self.total and self.done >= self.total):  # the end prints its own line
                self._print()
            self.last_t, self.last_tenth = now, tenth

    def _print(self) -> None:
        print(self.line(), file=sys.stderr, flush=True)


def _rich_progress(console):
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                    MofNCompleteColumn(), TextColumn("{task.fields[unit]}"), TimeElapsedColumn(),
                    TextColumn("eta"), TimeRemainingColumn(), console=console)


@contextmanager
def bar(description: str, total: int | None = None,
        unit: str = "") -> Iterator[Callable[[int], None]]:
    """Yield `advance(k)`; shows the bar only when enabled (else `advance` does nothing). Bars
    opened inside another share its display (one live display at a time)."""
    if not _state["enabled"]:
        yield lambda k: None
        return
    console = _console()
    if not console.is_terminal:
        lines = _Lines(description, total, unit)
        try:
            yield lines.advance
        finally:
            lines._print()
        return
    outer = _state["progress"] is None
    if outer:
        _state["progress"] = _rich_progress(console)
        _state["progress"].start()
    prog = _state["progress"]
    task = prog.add_task(description, total=total, unit=unit, start=False)

    started = []

    def advance(k: int) -> None:
        if not started:  # the clock starts with the work (see _Lines)
            prog.start_task(task)
            started.append(True)
        prog.advance(task, k)

    try:
        yield advance
    finally:
        if outer:
            prog.stop()
            _state["progress"] = None
        else:
            prog.remove_task(task)


def track(items: Iterable[T], description: str, total: int | None = None,
          unit: str = "") -> Iterator[T]:
    """`items`, advancing a `bar` by one per item (PPO steps, eval policies)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with bar(description, total, unit) as advance:
        for item in items:
            yield item
            advance(1)


def advance_or_bar(progress: Callable[[int], None] | None, description: str, total: int,
                   unit: str = ""):
    """The caller's `progress` callback as a context manager, or a new `bar` without one."""
    if progress is not None:
        @contextmanager
        def given():
            yield progress
        return given()
    return bar(description, total, unit)


def trainer_callback(description: str):
    """A transformers `TrainerCallback` that shows the trainer's optimiser steps as a `bar`
    (TRL's SFTTrainer runs with its own tqdm bar off)."""
    from transformers import TrainerCallback

    class _Bar(TrainerCallback):
        def __init__(self):
            self._cm = self._advance = None

        def on_train_begin(self, args, state, control, **kwargs):
            self._cm = bar(description, state.max_steps or None, "steps")
            self._advance = self._cm.__enter__()

        def on_step_end(self, args, state, control, **kwargs):
            if self._advance is not None:
                self._advance(1)

        def on_train_end(self, args, state, control, **kwargs):
            if self._cm is not None:
                self._cm.__exit__(None, None, None)
                self._cm = self._advance = None

    return _Bar()


# Messages a user cannot act on: the libraries' own bars (each stage shows its own) and notices
# about the libraries themselves.
_UNACTIONABLE_WARNINGS = (
    (r".*is_gradient_checkpointing.*", FutureWarning),  # transformers' own alias, called by TRL
)
_UNACTIONABLE_LOGS = {"DeepSpeed": ("Setting accelerator to CPU",)}  # CPU is the embedded default


class _DropMessages:
    def __init__(self, prefixes: tuple[str, ...]):
        self.prefixes = prefixes

    def filter(self, record) -> bool:
        return not str(record.getMessage()).startswith(self.prefixes)


def quiet_libraries() -> None:
    """No library progress bars (transformers' "Loading weights", "Writing model shards",
    datasets' map bars) and none of `_UNACTIONABLE_*`; call before the libraries are imported."""
    import logging
    import os
    import warnings

    for var in ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS",
                "TRANSFORMERS_NO_ADVISORY_WARNINGS"):
        os.environ.setdefault(var, "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    for message, category in _UNACTIONABLE_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    for name, prefixes in _UNACTIONABLE_LOGS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessages) for f in logger.filters):
            logger.addFilter(_DropMessages(prefixes))
