"""The rollout seam: the four small protocols every rollout-economy feature plugs in through.

A feature never edits the loop (trainer.py); it is one object implementing one of these, handed
to `PPOTrainer(hooks=RolloutHooks(...))` by `hooks_for(cfg, ...)` when its `params.yaml` switch
is on. Each hook has a unique `name` and `state_dict()` / `load_state_dict()`; the trainer saves
every hook's state in the checkpoint generically, so a resumed run continues exactly.

- `PromptGate` (before generation): sees the step's candidate prompts and keeps or skips each;
  the trainer refills the batch from the sampler until `batch_size x processes` prompts are
  kept, so every process trains on the same count. It must decide the same on every process
  (it sees the whole global batch, and its state only changes through observers).
- `GenerationHook` (during generation): per-sequence logits processors and stopping criteria
  (transformers objects) for one batch; a criterion that stops a row stops spending tokens on
  it. After generation, `finish(rollout)` may flag rows (e.g. `pruned`, `valid=False`). A hook
  with a `prepare(batch)` method is first told the batch's (prompt_id, text) pairs.
- `PostScoringHook` (after scoring): may re-score (escalate to a stronger scorer) or replace
  samples (resample the bad part); it adds what it spends to the step's `StepCost`.
- `StepObserver` (after the step): sees every finished step's rows of all processes and its
  metrics (reward history for schedulers, RM evolution).

The pattern is OpenRLHF's filter hook and TRL's `rollout_func` / callbacks, kept smaller.

    python -c "from rlhf.pipeline.ppo.hooks import RolloutHooks; print(RolloutHooks().names())"
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Hook(Protocol):
    name: str

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class PromptGate(Hook, Protocol):
    def select(self, step: int, candidates: list[tuple[str, str]]) -> list[bool]:
        """One keep (True) / skip (False) per candidate (prompt_id, text)."""
        ...


@runtime_checkable
class GenerationHook(Hook, Protocol):
    def processors(self, step: int, batch_size: int) -> tuple[list, list]:
        """(logits processors, stopping criteria) for one generation batch of `batch_size`."""
        ...

    def finish(self, rollout) -> None:
        """Called once the batch is generated, before scoring: flag rows it stopped."""
        ...


@runtime_checkable
class PostScoringHook(Hook, Protocol):
    def after_score(self, trainer, rollout, cost) -> None:
        """May re-score or replace rows of `rollout` (the trainer's generation and scorers are
        reachable through `trainer`); adds what it spends to `cost` (accounting.StepCost)."""
        ...


@runtime_checkable
class StepObserver(Hook, Protocol):
    def observe(self, step: int, rows: list[dict], metrics: dict) -> None:
        """Every process's rollout rows of a finished step, and the step's metrics."""
        ...


@dataclass
class RolloutHooks:
    gates: list = field(default_factory=list)
    generation: list = field(default_factory=list)
    post_scoring: list = field(default_factory=list)
    observers: list = field(default_factory=list)

    def __post_init__(self) -> None:
        kinds = (("gates", PromptGate), ("generation", GenerationHook),
                 ("post_scoring", PostScoringHook), ("observers", StepObserver))
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
        for h in self.gates + self.generation + self.post_scoring + self.observers:
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
