"""Drafted decoding in the trainer (`ppo.draft`, pipeline/decode/): the run's drafter lives in
a generation hook, so its state carries from step to step and is saved in every checkpoint with
the other hooks' (a resumed run drafts what the uninterrupted one would): the lookup drafter's
recent responses, the reuse drafter's stored responses per prompt (SPEC-RL's sample reuse), the
draft model's depth (its weights are the policy's own, checkpointed with it). generate.py's
`generator_of` builds the engine that drafts with it (pipeline/decode: `get_generator(draft=...)`).

The hook adds no logits processor or stopping criterion (drafting needs none: the drafting
generator decodes plain when another hook adds some). `prepare` gives the reuse drafter each
row's stored response by prompt id; `finish` stores the batch's responses with the log-probs of
the distribution they were sampled from.

    python -c "from rlhf.pipeline.ppo.features import FEATURES; print(FEATURES['drafts'].help)"
"""

from __future__ import annotations

from typing import Literal

from rlhf.pipeline.config import ConfigError
from rlhf.pipeline.ppo.features.registry import ConfigField, Feature, register
from rlhf.pipeline.ppo.hooks import HookBase
from rlhf.pipeline.ranges import COUNT, NONNEG


class DraftHook(HookBase):
    """Holds the run's drafter (`drafter`, which generate_rollout drafts with)."""

    name = "drafts"

    def __init__(self, cfg):
        from rlhf.pipeline.decode import get_drafter

        self.drafter = get_drafter(cfg.draft, cfg.draft_layers)

    def prepare(self, batch: list[tuple[str, str]]) -> None:
        if hasattr(self.drafter, "prepare_prompts"):
            self.drafter.prepare_prompts([pid for pid, _ in batch])

    def processors(self, step: int, batch_size: int) -> tuple[list, list]:
        return [], []

    def finish(self, rollout) -> None:
        if not hasattr(self.drafter, "remember"):
            return
        lps = rollout.extras.get("sampled_logprobs") or [None] * len(rollout)
        keep = [i for i, lp in enumerate(lps) if lp is not None and bool(rollout.valid[i])]
        mask = rollout.response_mask
        self.drafter.remember([rollout.prompt_ids[i] for i in keep],
                              [rollout.response[i][mask[i]].tolist() for i in keep],
                              [lps[i] for i in keep])

    def state_dict(self) -> dict:
        return self.drafter.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.drafter.load_state_dict(state)


def _check(cfg) -> None:
    if cfg.draft != "none" and cfg.engine not in ("native", "auto"):  # auto: checked on resolving
        raise ConfigError(f"ppo.draft {cfg.draft!r} needs ppo.engine: native, got {cfg.engine!r}")


FIELDS = (
    ConfigField("draft", Literal["none", "lookup", "reuse", "model"], "none",
                help='pipeline/decode/drafters.py, native only: "lookup" (n-gram drafts from '
                     'the context and recent responses, verified exactly), "model" (the policy\'s '
                     'own first `draft_layers` layers with its head draft from a distribution q, '
                     'verified exactly: decode/draft_model.py), "reuse" (SPEC-RL\'s rule on stored '
                     'old responses: an arm, not exact); up to `draft_k` drafted tokens per row '
                     'and forward'),
    ConfigField("draft_k", int, 4, range=COUNT),
    ConfigField("draft_layers", int, 0, range=NONNEG,
                help="the draft model's layers (0 = a quarter of the policy's)"),
)

register(Feature("drafts", ("draft",),
                 help="drafted tokens verified in one forward: lookup and model (exact), "
                      "reuse (SPEC-RL's rule, not exact)", fields=FIELDS, check=_check,
                 build=lambda cfg, ctx: [DraftHook(cfg)],
                 modules=("pipeline/decode",)))
