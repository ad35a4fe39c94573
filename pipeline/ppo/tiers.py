"""Scoring tiers (seed 001 §4.1): Level 1 scores every valid rollout with the light RM; Level 2,
a post-scoring hook, re-scores the ones the light RM is unsure of with the strong RM.

A fallback rollout (timeout, generation error) earns no score: its reward is 0 with no gradient,
and the store keeps a null reward for it (pipeline/ppo/records.py).

    python -c "from rlhf.pipeline.ppo.tiers import Escalation; print(Escalation(None, 0.6).name)"
"""

from __future__ import annotations

import torch

from rlhf.pipeline.ppo.accounting import StepCost, rm_tokens


@torch.no_grad()
def score_level1(scorer, r, cost: StepCost, device) -> None:
    """Light-RM scores and confidences of every valid row into `r.level1_*`, `r.scores`."""
    r.level1_scores = torch.zeros(len(r), dtype=torch.float32, device=device)
    r.level1_confidence = torch.zeros(len(r), dtype=torch.float32, device=device)
    ok = r.valid.nonzero().flatten().tolist()
    if ok:
        prompts, resps = [r.prompts[i] for i in ok], [r.responses[i] for i in ok]
        scores, conf = scorer.score(prompts, resps)
        cost.add_rm("light", len(ok), rm_tokens(scorer, prompts, resps))
        r.level1_scores[ok] = torch.as_tensor(scores, dtype=torch.float32, device=device)
        r.level1_confidence[ok] = torch.as_tensor(conf, dtype=torch.float32, device=device)
    r.scores, r.confidence = r.level1_scores.clone(), r.level1_confidence.clone()
    r.escalated = torch.zeros(len(r), dtype=torch.bool, device=device)


class Escalation:
    """Level 2: a valid rollout whose light-RM confidence is below `below` is re-scored by the
    strong scorer, whose score (and confidence) PPO then uses. Stateless."""

    name = "escalation"

    def __init__(self, strong_scorer, below: float):
        self.strong, self.below = strong_scorer, below

    @torch.no_grad()
    def after_score(self, trainer, r, cost: StepCost) -> None:
        r.escalated = r.valid & (r.level1_confidence < self.below)
        chosen = r.escalated.nonzero().flatten().tolist()
        if not chosen:
            return
        prompts, resps = [r.prompts[i] for i in chosen], [r.responses[i] for i in chosen]
        s, c = self.strong.score(prompts, resps)
        cost.add_rm("strong", len(chosen), rm_tokens(self.strong, prompts, resps))
        dev = r.scores.device
        r.scores[chosen] = torch.as_tensor(s, dtype=torch.float32, device=dev)
        r.confidence[chosen] = torch.as_tensor(c, dtype=torch.float32, device=dev)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
