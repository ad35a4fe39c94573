"""DAPO's dynamic sampling (Yu et al. 2025; veRL's `filter_groups`) on the group estimators: a
prompt group whose k rewards do not vary carries no gradient under GRPO / RLOO (every advantage
is 0), so after Level-1 scoring such groups are dropped and the batch is refilled with fresh
prompts, k samples each, until it holds only groups that vary or `dynamic_sampling_rounds`
refills were spent; every token generated, the dropped groups' included, is counted. Groups
still flat after the last round fill the batch back up to its size (they train on advantage 0).

The refill prompts come from the feature's own shuffled pass over the run's prompts (seeded from
`ppo.seed`, checkpointed), so the trainer's sampler, and with it every other process's batches,
is untouched.

    python -c "from rlhf.pipeline.ppo.features.dynamic_sampling import flat_groups as f; \
print(f([1.0, 1.0, 0.0, 2.0], [True] * 4, 2))"
"""

from __future__ import annotations

from rlhf.pipeline.ppo.features.registry import ConfigField, Feature, register
from rlhf.pipeline.ppo.hooks import HookBase
from rlhf.pipeline.ranges import COUNT


def flat_groups(scores: list[float], valid: list[bool], k: int, tol: float = 1e-6) -> list[int]:
    """Indices of the k-row groups whose valid rows' rewards do not vary (fewer than two valid
    rows count as flat: no baseline)."""
    out = []
    for g in range(len(scores) // k):
        s = [x for x, v in zip(scores[g * k:(g + 1) * k], valid[g * k:(g + 1) * k]) if v]
        if len(s) < 2 or max(s) - min(s) <= tol:
            out.append(g)
    return out


class DynamicSampling(HookBase):
    name = "dynamic_sampling"

    def __init__(self, cfg, prompts: list[tuple[str, str]], pad_id: int):
        from rlhf.pipeline.samplers import PromptSampler

        self.k, self.rounds, self.pad_id = cfg.group_size, cfg.dynamic_sampling_rounds, pad_id
        self.sampler = PromptSampler(prompts, cfg.seed * 7919 + 17)

    def after_score(self, ctx, r, cost) -> None:
        from rlhf.pipeline.ppo.rollout import Rollout

        k = self.k
        groups = len(r) // k

        def split(x):
            flat = set(flat_groups(x.scores.tolist(), x.valid.tolist(), k))
            good = [g for g in range(len(x) // k) if g not in flat]
            return good, sorted(flat)

        good, flat = split(r)
        cost.count("groups_flat", len(flat))
        kept = [r.take([g * k + j for g in good for j in range(k)])] if good else []
        dropped = [r.take([g * k + j for g in flat for j in range(k)])] if flat else []
        have, spent = len(good), 0
        while have < groups and spent < self.rounds:
            spent += 1
            prompts = self.sampler.next_batch(groups - have)
            new = ctx.rollout([p for p in prompts for _ in range(k)], cost)
            cost.count("rollouts_refilled", len(new))
            g2, f2 = split(new)
            cost.count("groups_flat", len(f2))
            if g2:
                kept.append(new.take([g * k + j for g in g2 for j in range(k)]))
                have += len(g2)
            if f2:
                dropped.append(new.take([g * k + j for g in f2 for j in range(k)]))
        if not flat and spent == 0:
            return  # nothing dropped: the batch as generated
        merged = Rollout.cat(kept + dropped, self.pad_id)
        merged = merged.take(list(range(groups * k)))  # varying groups first, then flat ones
        vars(r).update(vars(merged))

    def state_dict(self) -> dict:
        return {"sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state["sampler"])


def _build(cfg, ctx) -> list:
    if cfg.advantage_estimator == "gae" or cfg.group_size < 2:
        raise ValueError("ppo.dynamic_sampling_on drops groups of samples whose rewards do not "
                         "vary: it needs a group estimator (ppo.advantage_estimator rloo / grpo, "
                         "ppo.group_size >= 2)")
    if ctx.prompts is None:
        raise ValueError("ppo.dynamic_sampling_on refills from the run's prompts")
    return [DynamicSampling(cfg, ctx.prompts, ctx.tokenizer.pad_token_id)]


FIELDS = (
    ConfigField("dynamic_sampling_on", bool, False,
                help="DAPO's dynamic sampling (features/dynamic_sampling.py), group estimators "
                     'only: groups whose rewards do not vary are dropped after scoring and the '
                     'batch refilled with fresh prompts, at most `dynamic_sampling_rounds` '
                     'refills a step (every token generated is counted)'),
    ConfigField("dynamic_sampling_rounds", int, 3, range=COUNT),
)

FEATURE = register(Feature(
    "dynamic_sampling", ("dynamic_sampling_on",),
    help="DAPO dynamic sampling: drop prompt groups whose rewards do not vary, refill the batch",
    fields=FIELDS, build=_build,
    counters=("groups_flat", "rollouts_refilled"),
    after=("entropy_prune", "resample", "escalation", "human_queue", "rm_evolution")))
