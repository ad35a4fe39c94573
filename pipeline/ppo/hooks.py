"""The rollout seam: the protocols every rollout-economy feature plugs in through.

A feature never edits the loop (trainer.py). It is one module under `features/` that registers a
`Feature` (features/__init__.py): its switch, the config fields it owns, the inputs it needs, the
tables it writes and a `build(cfg, ctx)` that returns objects implementing these protocols. The
trainer asks the registry for the hooks of the features `cfg` turns on; each hook has a unique
`name` and `state_dict()` / `load_state_dict()`, which the trainer saves in every checkpoint, so
a resumed run continues exactly.

- `PromptGate` (before generation): sees the step's candidate prompts and keeps or skips each;
  the trainer refills the batch from the sampler until `batch_size x processes` prompts are
  kept, so every process trains on the same count. It must decide the same on every process
  (it sees the whole global batch, and its state only changes through observers).
- `GenerationHook` (during generation): `prepare(batch)` is told the batch's (prompt_id, text)
  pairs; `processors` gives per-sequence logits processors and stopping criteria (transformers
  objects) for one batch, and a criterion that stops a row stops spending tokens on it; after
  generation, `finish(rollout)` may flag rows (e.g. `pruned`, `valid=False`).
- `PostScoringHook` (after scoring): may re-score (escalate to a stronger scorer) or replace
  samples (resample the bad part) through the narrow `RolloutContext` (the scorers, the
  generation engine, the event log, the run folder); it adds what it spends to the step's
  `StepCost` (its own counters through `cost.count(name, n)`).
- `StepObserver` (after the step): sees every finished step's rows of all processes and its
  metrics (reward history for schedulers, RM evolution).
- `ReplaySource` (before prompt selection and after the log-prob pass): says how many of the
  step's rows it will supply from stored rollouts (the trainer then samples that many fewer
  prompts), and adds them to the freshly sampled batch, whose rows it may store in turn (seed
  000 §2.2's replay buffer, features/replay.py).

Every hook may write rows of its own tables (`table_rows(step)`: {table: rows}, the tables its
feature declares). `HookBase` gives the methods a hook does not need their no-op defaults.

The pattern is OpenRLHF's filter hook and TRL's `rollout_func` / callbacks, kept smaller.

    python -c "from rlhf.pipeline.ppo.hooks import RolloutHooks; print(RolloutHooks().names())"
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Hook(Protocol):
    name: str

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def table_rows(self, step: int) -> dict[str, list[dict]]:
        """{table: rows} this hook writes for `step` ({} for none); tables its feature declares."""
        ...


@runtime_checkable
class PromptGate(Hook, Protocol):
    def select(self, step: int, candidates: list[tuple[str, str]]) -> list[bool]:
        """One keep (True) / skip (False) per candidate (prompt_id, text)."""
        ...


@runtime_checkable
class GenerationHook(Hook, Protocol):
    def prepare(self, batch: list[tuple[str, str]]) -> None:
        """Told the generation batch's (prompt_id, text) pairs before `processors`."""
        ...

    def processors(self, step: int, batch_size: int) -> tuple[list, list]:
        """(logits processors, stopping criteria) for one generation batch of `batch_size`."""
        ...

    def finish(self, rollout) -> None:
        """Called once the batch is generated, before scoring: flag rows it stopped."""
        ...


@dataclass
class RolloutContext:
    """What a post-scoring hook may use, and nothing else of the trainer: the config, the
    tokenizer, the light and strong scorers, `generation()` (a context manager yielding the
    policy ready to sample), `rollout(batch, cost)` (generate (prompt_id, text) pairs with the
    generation hooks and score them at Level 1, every token counted in `cost`: what a hook that
    refills the batch calls), `event(kind, **fields)` (events.jsonl), the run folder and the
    current step."""
    cfg: Any
    tokenizer: Any
    scorer: Any
    strong_scorer: Any = None
    generation: Callable[[], AbstractContextManager] | None = None
    rollout: Callable[[list[tuple[str, str]], Any], Any] | None = None
    event: Callable[..., None] = lambda kind, **fields: None
    out: Path | None = None
    step: int = 0


@runtime_checkable
class PostScoringHook(Hook, Protocol):
    def after_score(self, ctx: RolloutContext, rollout, cost) -> None:
        """May re-score or replace rows of `rollout` through `ctx`; adds what it spends to
        `cost` (accounting.StepCost)."""
        ...


@runtime_checkable
class StepObserver(Hook, Protocol):
    def observe(self, step: int, rows: list[dict], metrics: dict) -> None:
        """Every process's rollout rows of a finished step, and the step's metrics."""
        ...


@runtime_checkable
class ReplaySource(Hook, Protocol):
    def replayed(self, step: int, batch_size: int) -> int:
        """How many of the step's `batch_size` rows come from stored rollouts (0: none)."""
        ...

    def mix(self, step: int, rollout, cost):
        """After the log-prob pass: `rollout` plus the stored rows `replayed` announced, each
        with its stored old log-probs, reference log-probs, KL and score (the importance ratio
        is against the policy that generated it); the fresh rows may be stored. Adds what it
        replayed to `cost`. Returns the batch the update trains on."""
        ...


class HookBase:
    """No-op defaults of the methods a hook does not need (state, tables, prepare, finish)."""

    name = "hook"

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def table_rows(self, step: int) -> dict[str, list[dict]]:
        return {}

    def prepare(self, batch: list[tuple[str, str]]) -> None:
        pass

    def finish(self, rollout) -> None:
        pass


@dataclass
class RolloutHooks:
    gates: list = field(default_factory=list)
    generation: list = field(default_factory=list)
    post_scoring: list = field(default_factory=list)
    observers: list = field(default_factory=list)
    replay: list = field(default_factory=list)

    def __post_init__(self) -> None:
        kinds = (("gates", PromptGate), ("generation", GenerationHook),
                 ("post_scoring", PostScoringHook), ("observers", StepObserver),
                 ("replay", ReplaySource))
        for attr, proto in kinds:
            for h in getattr(self, attr):
                if not isinstance(h, proto):
                    raise TypeError(f"{type(h).__name__} is not a {proto.__name__} "
                                    f"(RolloutHooks.{attr})")
        names = self.names()
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"two rollout hooks share a name: {', '.join(dup)}")

    def all(self) -> list:
        seen, out = set(), []
        for h in self.gates + self.generation + self.post_scoring + self.observers + self.replay:
            if id(h) not in seen:  # one object may implement several protocols
                seen.add(id(h))
                out.append(h)
        return out

    def names(self) -> list[str]:
        return [h.name for h in self.all()]

    def state_dict(self) -> dict[str, dict]:
        return {h.name: h.state_dict() for h in self.all()}

    def load_state_dict(self, state: dict[str, dict]) -> None:
        missing = [h.name for h in self.all() if h.name not in state]
        if missing:
            raise ValueError(f"the checkpoint has no state for rollout hook(s) "
                             f"{', '.join(missing)}: it was saved with other features on")
        for h in self.all():
            h.load_state_dict(state[h.name])
