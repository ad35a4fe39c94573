"""Scoring tiers (seed 001 §4.1): Level 0 routes a prompt (its token budget, its risk; the
router stage, pipeline/route.py); Level 1 scores every valid rollout with the light RM; Level 2,
a post-scoring hook, re-scores the ones a trigger picks (the light RM unsure, a low score, a
high-risk topic, an uncertain topic cluster) with the strong RM, on the light RM's scale through
the reward stage's score map, and sends a few of them to the human queue.

A fallback rollout (timeout, generation error) earns no score: its reward is 0 with no gradient,
and the store keeps a null reward for it (pipeline/ppo/records.py).

    python -c "from rlhf.pipeline.ppo.features.tiers import escalation_triggers as t; \
print(t([True, True], [0.1, -2.0], [0.9, 0.3], 0.6, -1.0, None, None))"
"""

from __future__ import annotations

from typing import Literal

import torch

from rlhf.pipeline.config import ConfigError
from rlhf.pipeline.ppo.features.registry import ConfigField, Feature, Table, register
from rlhf.pipeline.ppo.hooks import HookBase
from rlhf.pipeline.ppo.accounting import StepCost, rm_tokens
from rlhf.pipeline.ranges import COUNT, FRACTION_LT1, NONNEG, PROB, Range


TRIGGERS = ("confidence", "low_score", "high_risk", "uncertain_cluster")


def escalation_triggers(valid, scores, confidence, below: float, score_floor: float | None,
                        high_risk, uncertain) -> list[list[str]]:
    """Per row, the Level-2 triggers it meets (pure; lists of `TRIGGERS`, empty: Level 1 only).

    `below`: light-RM confidence gate (0 = off); `score_floor`: light score below which a row
    escalates (None = off); `high_risk` / `uncertain`: per-row booleans (Level 0's route, the
    scheduler's high-uncertainty clusters) or None (off). Invalid rows never escalate."""
    out = []
    for i, ok in enumerate(valid):
        t = []
        if ok:
            if below > 0 and confidence[i] < below:
                t.append("confidence")
            if score_floor is not None and scores[i] < score_floor:
                t.append("low_score")
            if high_risk is not None and high_risk[i]:
                t.append("high_risk")
            if uncertain is not None and uncertain[i]:
                t.append("uncertain_cluster")
        out.append(t)
    return out


def capped(triggered: list[list[str]], scores, max_share: float) -> list[int]:
    """Rows to escalate: every triggered row, or at most max(1, floor(max_share x batch)) of
    them, lowest light score first (the ones most likely bad), in row order (pure)."""
    rows = [i for i, t in enumerate(triggered) if t]
    cap = len(triggered) if max_share >= 1.0 else max(1, int(max_share * len(triggered)))
    if len(rows) > cap:
        rows = sorted(sorted(rows, key=lambda i: (float(scores[i]), i))[:cap])
    return rows


class Escalation(HookBase):
    """Level 2: a valid rollout that meets a trigger (`escalation_triggers`) is re-scored by the
    strong scorer, whose score (through `score_map` onto the light scale, when given) and
    confidence PPO then uses. Its state: the recent Level-1 scores the low-score quantile is
    taken over (checkpointed)."""

    name = "escalation"

    def __init__(self, strong_scorer, cfg, score_map=None, routes=None, uncertain=None):
        self.strong, self.cfg, self.map = strong_scorer, cfg, score_map
        self.routes = routes  # {prompt_id: Route} of Level 0, read when escalate_high_risk
        self.uncertain = uncertain  # prompt_id -> bool (the scheduler's marked clusters)
        self.history: list[list[float]] = []  # Level-1 scores of the last steps
        self.last: dict = {}  # this step's triggers per row (records, the human queue)

    def score_floor(self, r) -> float | None:
        q = self.cfg.escalate_score_quantile
        if q <= 0:
            return None
        import numpy as np

        now = [float(r.level1_scores[i]) for i in r.valid.nonzero().flatten().tolist()]
        pooled = [x for step in self.history for x in step] + now
        self.history = (self.history + [now])[-self.cfg.escalate_window:]
        return float(np.quantile(pooled, q)) if pooled else None

    @torch.no_grad()
    def after_score(self, ctx, r, cost: StepCost) -> None:
        cfg = self.cfg
        risk = ([bool(getattr(self.routes.get(p), "high_risk", False)) for p in r.prompt_ids]
                if cfg.escalate_high_risk and self.routes is not None else None)
        unsure = ([bool(self.uncertain(p)) for p in r.prompt_ids]
                  if cfg.escalate_uncertain and self.uncertain is not None else None)
        triggered = escalation_triggers(r.valid.tolist(), r.level1_scores.tolist(),
                                        r.level1_confidence.tolist(), cfg.escalate_below,
                                        self.score_floor(r), risk, unsure)
        chosen = capped(triggered, r.level1_scores.tolist(), cfg.escalate_max_share)
        for i in chosen:
            r.flags[i] = r.flags[i] + [f"l2_{t}" for t in triggered[i]]
        r.escalated = torch.zeros(len(r), dtype=torch.bool, device=r.scores.device)
        self.last = {"triggered": sum(1 for t in triggered if t), "escalated": len(chosen)}
        if not chosen:
            return
        r.escalated[chosen] = True
        prompts, resps = [r.prompts[i] for i in chosen], [r.responses[i] for i in chosen]
        s, c = self.strong.score(prompts, resps)
        cost.add_rm("strong", len(chosen), rm_tokens(self.strong, prompts, resps))
        s = torch.as_tensor(s, dtype=torch.float32).cpu()
        if self.map is not None:
            s = torch.as_tensor(self.map(s.numpy()), dtype=torch.float32)
        dev = r.scores.device
        r.scores[chosen] = s.to(dev)
        r.confidence[chosen] = torch.as_tensor(c, dtype=torch.float32, device=dev)

    def state_dict(self) -> dict:
        return {"history": self.history}

    def load_state_dict(self, state: dict) -> None:
        self.history = [list(map(float, h)) for h in state.get("history", [])]


class HumanQueue(HookBase):
    """The human queue: up to `human_labels_per_step` escalated samples a step, the
    lowest light scores first, are labelled by the annotator pool (the world's stand-in for
    human annotation: gold plus noise, bias and drift) at a simulated time that advances
    `minutes_per_step` a step, so labels do not depend on the wall clock and a resumed run
    labels the same. Rows go to the `human_labels` table; `labels` keeps the run's labels for
    RM evolution (checkpointed)."""

    name = "human_queue"

    def __init__(self, cfg, pool, start, minutes_per_step: float = 10.0):
        self.cfg, self.pool, self.start = cfg, pool, start
        self.minutes = float(minutes_per_step)
        self.labels: list[dict] = []  # {prompt, response, score, annotator_id, step}
        self._rows: list[dict] = []

    def after_score(self, ctx, r, cost: StepCost) -> None:
        step = ctx.step
        chosen = r.escalated.nonzero().flatten().tolist()
        chosen = sorted(chosen, key=lambda i: (float(r.level1_scores[i]), i))
        self._rows = []
        for i in chosen[:self.cfg.human_labels_per_step]:
            r.flags[i] = r.flags[i] + ["human_labelled"]
            self.label(step, r.prompt_ids[i], r.prompts[i], r.responses[i],
                       float(r.level1_scores[i]),
                       [f[3:] for f in r.flags[i] if f.startswith("l2_")], cost)

    def label(self, step: int, prompt_id: str, prompt: str, response: str,
              light_score: float | None,
              triggers: list[str], cost: StepCost) -> float:
        """One annotator label of (prompt, response) at the step's simulated time: stored (the
        `human_labels` row), kept for RM evolution, counted; returns the 0-5 score."""
        from datetime import timedelta

        from rlhf.store.hashing import content_hash

        when = self.start + timedelta(minutes=self.minutes * step)
        label = self.pool.label(prompt, [response], when)
        cost.add_rm("human", 1, 0)
        self._rows.append({"step": step, "prompt_id": prompt_id,
                           "prompt_hash": content_hash(prompt),
                           "response_hash": content_hash(response),
                           "annotator_id": label.annotator_id, "labeled_at": label.labeled_at,
                           "score": float(label.scores[0]), "light_score": light_score,
                           "triggers": triggers})
        self.labels.append({"prompt": prompt, "response": response,
                            "score": float(label.scores[0]),
                            "annotator_id": label.annotator_id, "step": step})
        return float(label.scores[0])

    def table_rows(self, step: int) -> dict[str, list[dict]]:
        return {"human_labels": self._rows}

    def state_dict(self) -> dict:
        return {"labels": self.labels}

    def load_state_dict(self, state: dict) -> None:
        self.labels = list(state.get("labels", []))


class RouteBudget(HookBase):
    """Level 0's token budget: each row stops at its prompt's route `max_new_tokens`
    (prompts without a route: ppo.max_new_tokens). A generation hook; `prepare(batch)` tells it
    the batch's prompt ids before `processors`."""

    name = "route_budget"

    def __init__(self, routes: dict, ceiling: int):
        self.routes, self.ceiling = routes, int(ceiling)
        self.budgets: list[int] = []

    def prepare(self, batch: list[tuple[str, str]]) -> None:
        self.budgets = [min(self.ceiling, int(getattr(self.routes.get(pid), "max_new_tokens",
                                                      self.ceiling) or self.ceiling))
                        for pid, _ in batch]

    def processors(self, step: int, batch_size: int) -> tuple[list, list]:
        from transformers import StoppingCriteria

        budgets = self.budgets

        class _Budget(StoppingCriteria):
            def __init__(self):
                self.start = None

            def __call__(self, input_ids, scores, **kwargs):
                if self.start is None:
                    self.start = input_ids.shape[1] - 1
                made = input_ids.shape[1] - self.start
                return torch.tensor([made >= b for b in budgets], dtype=torch.bool,
                                    device=input_ids.device)

        return [], [_Budget()]

    def finish(self, rollout) -> None:
        for i, b in enumerate(self.budgets):
            if b < self.ceiling and int(rollout.response_mask[i].sum()) >= b:
                rollout.flags[i] = rollout.flags[i] + ["route_budget"]

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


# --------------------------------------------------------------------------- the registry
def _route_budget(cfg, ctx) -> list:
    return [RouteBudget(ctx.get("routes", "ppo.route_budget_on"), cfg.max_new_tokens)]


def _escalation(cfg, ctx) -> list:
    strong = ctx.optional("strong_reward")
    if strong is None:  # no strong RM: Level 1 only
        return []
    smap = None
    if cfg.escalate_map == "fitted":
        smap = ctx.optional("score_map")
        if smap is None:
            raise ValueError("ppo.escalate_map fitted needs the reward stage's score map "
                             "(score_map.json in the strong RM's folder)")
    routes = ctx.get("routes", "ppo.escalate_high_risk") if cfg.escalate_high_risk else None
    scheduler = ctx.built.get("prompt_scheduler", [None])[0]
    return [Escalation(strong, cfg, smap, routes,
                       scheduler.is_uncertain if scheduler is not None else None)]


def _human_queue(cfg, ctx) -> list:
    return [HumanQueue(cfg, *ctx.get("annotators", "ppo.human_labels_per_step and "
                                                   "ppo.rm_label_source annotators"))]


def level2_on(cfg) -> bool:
    """Whether any Level-2 trigger is on (escalation needs a strong RM then)."""
    return (cfg.escalate_below > 0 or cfg.escalate_score_quantile > 0 or cfg.escalate_high_risk
            or cfg.escalate_uncertain)


def _check_escalation(cfg) -> None:
    if cfg.escalate_uncertain and not cfg.schedule_on:
        raise ConfigError("ppo.escalate_uncertain reads the rollout scheduler's "
                          "high-uncertainty clusters: it needs ppo.schedule_on")


ROUTE_BUDGET_FIELDS = (
    ConfigField("route_budget_on", bool, False,
                help="Level 0: generate at most the route's token budget for each prompt (router "
                     'section of params.yaml, `rlhf ppo --routes`; max_new_tokens stays the '
                     'ceiling)'),
)
ESCALATION_FIELDS = (
    ConfigField("escalate_below", float, 0.0, range=PROB,
                help='seed 001 §4.1 Level-2 escalation: a valid rollout whose light-RM confidence'
                     ' is below this is re-scored by the strong RM (`rlhf ppo --strong-reward`) '
                     'and PPO uses the strong score. The seed triggers Level 2 on a low score or '
                     "a high-risk topic; we use the RM's own doubt, the confidence gate of seed "
                     '000 §3.4 (0.6). 0 = never (and no strong RM: never).'),
    ConfigField("escalate_score_quantile", float, 0.0, range=FRACTION_LT1,
                help="Level 2's other triggers (pipeline/ppo/features/tiers.py). A valid rollout "
                     'also escalates when its light-RM score is below the '
                     '`escalate_score_quantile` quantile of the Level-1 scores of the last '
                     "`escalate_window` steps and this one (the seed's 3.2 / 5.0 as a quantile of"
                     " the run's own distribution; 0 = off), when Level 0 routes its prompt as a "
                     'high-risk topic (`escalate_high_risk`, `rlhf ppo --routes`), or when its '
                     'topic cluster is one the rollout scheduler marked high-uncertainty '
                     '(`escalate_uncertain`, needs ppo.schedule_on). At most `escalate_max_share`'
                     ' of a batch escalates (the lowest light scores first; seed: < 7%).'),
    ConfigField("escalate_high_risk", bool, False),
    ConfigField("escalate_uncertain", bool, False),
    ConfigField("escalate_window", int, 20, range=COUNT),
    ConfigField("escalate_max_share", float, 1.0, range=Range(0, 1, lo_open=True)),
    ConfigField("escalate_map", Literal["none", "fitted"], "none",
                help='"fitted": an escalated sample\'s strong score goes through the '
                     'strong-to-light score map the reward stage fitted '
                     '(rm_strong/score_map.json; pipeline/reward/score_map.py), so it is on its '
                     'batch-mates\' light-RM scale; "none": the strong RM\'s own scale (two scales '
                     'in a batch)'),
)
HUMAN_QUEUE_FIELDS = (
    ConfigField("human_labels_per_step", int, 0, range=NONNEG,
                help='the human queue: up to this many Level-2 samples a step (lowest light '
                     "scores first) are labelled by the world's annotator pool (params.yaml "
                     'preferences.annotators; `rlhf ppo --human-labels`), stored with annotator '
                     'and time in `human_labels`, and feed RM evolution'),
)

ROUTE_BUDGET = register(Feature(
    "route_budget", ("route_budget_on",),
    help="Level 0: generate at most the route's token budget for each prompt (seed 001 §4.1)",
    fields=ROUTE_BUDGET_FIELDS, follows="human_labels_per_step",
    build=_route_budget, inputs={"routes": ()}, modules=("pipeline/route.py",)))
ESCALATION = register(Feature(
    "escalation", ("escalate_below", "escalate_score_quantile", "escalate_high_risk",
                   "escalate_uncertain", "escalate_map"),
    help="Level 2: re-score the rollouts a trigger picks with the strong RM (seed 001 §4.1)",
    fields=ESCALATION_FIELDS, follows="critic_kl_reg_coef", check=_check_escalation,
    build=_escalation,
    inputs={"strong_reward": ("escalate_below", "escalate_score_quantile", "escalate_high_risk",
                              "escalate_uncertain"),
            "score_map": ("escalate_map",), "routes": ("escalate_high_risk",)},
    after=("prompt_scheduler", "resample"), active=level2_on,
    modules=("pipeline/reward/score_map.py",)))
HUMAN_QUEUE = register(Feature(
    "human_queue", ("human_labels_per_step",),
    help="the human queue: the annotator pool labels a few Level-2 samples a step",
    fields=HUMAN_QUEUE_FIELDS, follows="critic_kl_reg_coef",
    build=_human_queue, inputs={"annotators": ()},
    tables=(Table("human_labels", "the human queue's annotator labels (rlhf audit annotators)"),),
    after=("escalation",),
    active=lambda cfg: cfg.human_labels_per_step > 0 or (
        cfg.rm_evolve_on and cfg.rm_label_source == "annotators"),
    modules=("pipeline/world/annotators.py",)))
