"""A light reward model that evolves with the policy (seed 000 §3.4, §5.1).

Seed 000 §3.4: an RM that is re-checked and re-trained as the policy moves keeps its ranking
accuracy (0.87 ± 0.02 over three months), a static one falls below 0.75. One post-scoring hook
and step observer, `RMEvolution`, on the trainer's seam:

- The confidence gate (`ppo.rm_gate_mask_on`): a valid sample whose final confidence is below
  the light RM's gate (0.6) and that Level 2 did not re-score is kept out of the step's update
  (`valid` false, flag `gated`) and queued for fine-tuning (at most `rm_queue_max`, newest kept).
- The check (`ppo.rm_evolve_on`), every `rm_check_every` steps: the last `rm_check_samples`
  samples of the current policy are labelled (with `rm_label_source: annotators` every one by
  the annotator pool; else the human queue's label where it has one and the strong RM's score
  through the reward stage's score map for the rest; human scores are mapped onto the light
  scale by quantile matching against the light RM's scores of the labelled samples) and the light RM's
  Spearman against the labels is compared with the first check's (`reference`). A relative drop
  above `rm_drop`, or an `rm_refresh` request of the reward-collapse detector (seed 000 §5.1, in
  the step's metrics), fine-tunes the light RM on those labels and the queue (labelled by the
  strong RM then) and hot-swaps it: a new `rm_version` on every row it scores from the next step
  on, an `rm_swap` event, the weights under <out>/rm_versions/ (named in the checkpoint, so a
  resumed run continues with the RM it had).

Every strong-RM and light-RM call the check makes is added to the step's cost.

    python -c "from rlhf.pipeline.ppo.features.rm_evolution import relative_drop; print(relative_drop(0.8, 0.7))"
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch

from rlhf.pipeline.ppo.features.registry import ConfigField, Feature, register
from rlhf.pipeline.ppo.hooks import HookBase
from rlhf.pipeline.ppo.accounting import StepCost, rm_tokens
from rlhf.pipeline.models.scoring import scorer_identity
from rlhf.pipeline.ranges import COUNT, FRACTION_LT1, Range


def relative_drop(reference: float, current: float) -> float:
    """(reference - current) / |reference|; 0 without a usable reference (pure)."""
    if reference != reference or current != current or abs(reference) < 1e-9:
        return 0.0
    return (reference - current) / abs(reference)


def gate_mask(valid, confidence, escalated, gate: float) -> list[int]:
    """Rows the confidence gate keeps out of the update: valid, not re-scored by Level 2, and
    below the gate (pure)."""
    return [i for i, (v, c, e) in enumerate(zip(valid, confidence, escalated))
            if v and not e and c < gate]


class RMEvolution(HookBase):
    name = "rm_evolution"

    def __init__(self, cfg, light, strong=None, score_map=None, human=None):
        self.cfg, self.light, self.strong, self.map, self.human = (cfg, light, strong,
                                                                   score_map, human)
        self.base_version = getattr(light, "version", None) or "unversioned"
        self.window: list[list[str]] = []  # [prompt, response] of the latest samples
        self.queue: list[list[str]] = []   # gated samples waiting for a label
        self.reference: float | None = None
        self.checks: list[dict] = []
        self.swaps = 0
        self.weights: str | None = None  # the current evolved weights (None: as loaded)
        self.pending_refresh = False
        self.out: Path | None = None
        self.ids: dict[str, str] = {}  # prompt text -> prompt id (the human_labels rows)

    # ------------------------------------------------------------------ the hook
    def after_score(self, ctx, r, cost: StepCost) -> None:
        cfg = self.cfg
        self.out = Path(ctx.out)
        step = ctx.step
        r.extras["rm_version"] = self.version  # who scored this batch (records.py)
        _, _, gate = scorer_identity(self.light)  # 0 means no gate; unset, the 0.6 default
        low = gate_mask(r.valid.tolist(), r.confidence.tolist(), r.escalated.tolist(), gate)
        if cfg.rm_gate_mask_on:
            for i in low:
                r.valid[i] = False
                r.flags[i] = r.flags[i] + ["gated"]
        self.queue = (self.queue + [[r.prompts[i], r.responses[i]] for i in low])[
            -cfg.rm_queue_max:]
        ok = [i for i in range(len(r)) if bool(r.valid[i]) or i in low]
        self.ids.update((r.prompts[i], r.prompt_ids[i]) for i in ok)
        self.window = (self.window + [[r.prompts[i], r.responses[i]] for i in ok])[
            -cfg.rm_check_samples:]
        due = step % cfg.rm_check_every == 0 or self.pending_refresh
        if cfg.rm_evolve_on and due and len(self.window) >= 4:
            self.check(ctx, step, cost)

    def observe(self, step: int, rows: list[dict], metrics: dict) -> None:
        if self.cfg.rm_evolve_on and metrics.get("rm_refresh"):
            self.pending_refresh = True  # the collapse detector asks: refresh at the next step

    # ------------------------------------------------------------------ check and swap
    @property
    def version(self) -> str:
        return getattr(self.light, "version", None) or self.base_version

    def labels(self, pairs: list[list[str]], cost: StepCost) -> tuple[list[float], list[str]]:
        """Light-scale labels of `pairs` and where each came from (human / strong)."""
        import numpy as np

        from rlhf.pipeline.reward.score_map import ScoreMap

        human = {(h["prompt"], h["response"]): h for h in (self.human.labels if self.human
                                                           else [])}
        hmap = None
        if len(human) >= 4:
            hp = list(human.values())
            light_of_h = self._light([h["prompt"] for h in hp], [h["response"] for h in hp],
                                     cost)
            try:
                hmap = ScoreMap.fit([h["score"] for h in hp], light_of_h, knots=11)
            except ValueError:  # every label alike: no scale to map
                hmap = None
        todo = [i for i, (p, x) in enumerate(pairs) if hmap is None or (p, x) not in human]
        out, src = [0.0] * len(pairs), ["human"] * len(pairs)
        if todo:
            if self.strong is None:
                raise ValueError("ppo.rm_evolve_on needs the strong RM (rlhf ppo "
                                 "--strong-reward) for the labels the human queue has not given")
            ps, rs = [pairs[i][0] for i in todo], [pairs[i][1] for i in todo]
            s, _ = self.strong.score(ps, rs)
            cost.add_rm("strong", len(todo), rm_tokens(self.strong, ps, rs))
            s = np.asarray(torch.as_tensor(s, dtype=torch.float32).cpu())
            if self.map is not None:
                s = self.map(s)
            for i, v in zip(todo, s.tolist()):
                out[i], src[i] = float(v), "strong"
        for i, (p, x) in enumerate(pairs):
            if src[i] == "human":
                out[i] = float(hmap([human[(p, x)]["score"]])[0])
        return out, src

    def _light(self, prompts: list[str], responses: list[str], cost: StepCost) -> list[float]:
        s, _ = self.light.score(prompts, responses)
        cost.add_rm("light", len(prompts), rm_tokens(self.light, prompts, responses))
        return torch.as_tensor(s, dtype=torch.float32).cpu().tolist()

    def check(self, ctx, step: int, cost: StepCost) -> None:
        from rlhf.pipeline.reward.onpolicy import spearman

        refresh, self.pending_refresh = self.pending_refresh, False
        pairs = [list(p) for p in self.window]
        if self.cfg.rm_label_source == "annotators":  # every check sample labelled by hand
            have = {(h["prompt"], h["response"]) for h in self.human.labels}
            for p, x in pairs:
                if (p, x) not in have:
                    self.human.label(step, self.ids.get(p, ""), p, x, None, ["rm_check"], cost)
        labels, src = self.labels(pairs, cost)
        light = self._light([p for p, _ in pairs], [x for _, x in pairs], cost)
        rho = spearman(light, labels)
        if self.reference is None and rho == rho:
            self.reference = rho
        drop = relative_drop(self.reference if self.reference is not None else rho, rho)
        swap = refresh or drop > self.cfg.rm_drop
        rec = {"step": step, "spearman": rho, "reference": self.reference, "drop": drop,
               "n": len(pairs), "human_labels": src.count("human"), "queue": len(self.queue),
               "refresh_request": refresh, "swapped": False, "rm_version": self.version}
        if swap:
            qlabels = self.labels(self.queue, cost)[0] if self.queue else []
            self.finetune(pairs + self.queue, labels + qlabels, step)
            rec.update(swapped=True, rm_version=self.version)
            ctx.event("rm_swap", step=step, spearman=rho,
                                   reference=self.reference, drop=drop,
                                   reason="rm_refresh" if refresh else "spearman_drop",
                                   rm_version=self.version, trained_on=len(pairs) + len(self.queue))
            self.queue = []
        self.checks.append(rec)

    def finetune(self, pairs: list[list[str]], labels: list[float], step: int) -> None:
        """Fit the light RM to `labels` (light-scale rewards) and swap it in."""
        from dataclasses import replace

        from rlhf.pipeline.reward.distill import LightConfig, distill
        from rlhf.pipeline.reward.scorer import encode_texts
        from rlhf.store.hashing import content_hash

        inner = self.light.scorer  # rlhf.pipeline.reward.scorer.RMEnsemble, one member
        model, tok, ref = inner.models[0], inner.tokenizer, inner.references[0]
        ids = encode_texts(tok, [p for p, _ in pairs], [x for _, x in pairs], inner.max_length)
        cfg = replace(LightConfig(), epochs=self.cfg.rm_finetune_epochs,
                      learning_rate=self.cfg.rm_finetune_lr, listwise_weight=0.0)
        groups = [[i] for i in range(len(pairs))]
        with torch.random.fork_rng():  # the policy's sampling stream stays as it was
            distill(model, tok, ids, [x + ref for x in labels], groups, cfg,
                    seed=self.cfg.seed + step)
        model.eval()
        if inner.memo is not None:
            inner.memo.clear()
        self.swaps += 1
        state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        digest = content_hash(str([(k, float(v.float().sum())) for k, v in state.items()]))
        folder = (self.out or Path(".")) / "rm_versions"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"swap-{self.swaps:03d}-step-{step:06d}.pt"
        tmp = path.with_suffix(".tmp")
        torch.save(state, tmp)
        tmp.replace(path)
        self.weights = str(path)
        self.light.version = f"{self.base_version}+e{self.swaps}-{digest[:8]}"

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict:
        return {"window": self.window, "queue": self.queue, "reference": self.reference,
                "checks": self.checks, "swaps": self.swaps, "weights": self.weights,
                "pending_refresh": self.pending_refresh, "version": self.version}

    def load_state_dict(self, state: dict) -> None:
        self.window = [list(p) for p in state.get("window", [])]
        self.queue = [list(p) for p in state.get("queue", [])]
        self.reference = state.get("reference")
        self.checks = list(state.get("checks", []))
        self.swaps = int(state.get("swaps", 0))
        self.weights = state.get("weights")
        self.pending_refresh = bool(state.get("pending_refresh", False))
        if self.weights:
            inner = self.light.scorer
            inner.models[0].load_state_dict(torch.load(self.weights))
            inner.models[0].eval()
            if inner.memo is not None:
                inner.memo.clear()
            self.light.version = state.get("version", self.version)


# --------------------------------------------------------------------------- the registry
def _build(cfg, ctx) -> list:
    if ctx.light_scorer is None:
        raise ValueError("ppo.rm_gate_mask_on / rm_evolve_on need the light RM")
    human = ctx.built.get("human_queue", [None])[0]
    smap = ctx.optional("score_map") if cfg.rm_evolve_on else None
    strong = ctx.optional("strong_reward")
    return [RMEvolution(cfg, ctx.light_scorer, strong, smap, human)]


FIELDS = (
    ConfigField("rm_gate_mask_on", bool, False,
                help='RM evolution (seed 000 §3.4, §5.1; pipeline/ppo/features/rm_evolution.py). '
                     "rm_gate_mask_on: a sample whose final confidence is below the light RM's "
                     "gate (0.6) and that Level 2 did not re-score is kept out of the step's "
                     'update and queued for fine-tuning.'),
    ConfigField("rm_evolve_on", bool, False,
                help='rm_evolve_on: every `rm_check_every` steps, `rm_check_samples` samples of '
                     'the current policy from the last steps are labelled (human labels where the'
                     ' queue has them, else the strong RM through the score map) and the light '
                     "RM's Spearman against those labels is compared with its first check's; a "
                     "relative drop above `rm_drop` (or the reward-collapse detector's "
                     'rm_refresh) fine-tunes the light RM on the queue and those labels '
                     '(`rm_finetune_epochs` at `rm_finetune_lr`) and hot-swaps it (a new '
                     'rm_version)'),
    ConfigField("rm_label_source", Literal["strong", "annotators"], "strong",
                help='who labels a check\'s samples: "strong" (the strong RM through the score '
                     'map; the human queue\'s labels where it has them) or "annotators" (the '
                     "world's annotator pool labels every check sample: human labels, counted as "
                     'human_rm_calls and stored in `human_labels`)'),
    ConfigField("rm_check_every", int, 10, range=COUNT),
    ConfigField("rm_check_samples", int, 48, range=Range(4, why="a Spearman needs samples")),
    ConfigField("rm_drop", float, 0.05, range=FRACTION_LT1),
    ConfigField("rm_queue_max", int, 256, range=COUNT),
    ConfigField("rm_finetune_epochs", int, 2, range=COUNT),
    ConfigField("rm_finetune_lr", float, 0.0001, range=Range(0, 1, lo_open=True, hi_open=True)),
)

FEATURE = register(Feature(
    "rm_evolution", ("rm_gate_mask_on", "rm_evolve_on"),
    help="the light RM that evolves: a confidence-gate loss mask, Spearman checks and fine-tunes "
         "(seed 000 §3.4, §5.1)",
    fields=FIELDS, follows="critic_kl_reg_coef",
    build=_build, inputs={"strong_reward": ("rm_evolve_on",), "score_map": ("rm_evolve_on",)},
    after=("escalation", "human_queue"),
    modules=("pipeline/reward/onpolicy.py",)))
