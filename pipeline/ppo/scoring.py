"""The trainer's side of scoring: Level 1 of the scoring tiers (every valid rollout scored by the
light scorer), the rows a reward declined, and the features a reward that is code or a server
rules out. The scorers themselves (an RM folder, a reward function or server) are shared model
code: pipeline/models/scoring.py and pipeline/models/code_rewards.py.

    python -m pytest -q tests/test_ppo_rewards.py tests/test_ppo_tiers.py
"""

from __future__ import annotations

from pathlib import Path

import torch
from rlhf.pipeline.models.code_rewards import kind

# Features that read an RM's insides (feature name -> what it reads), refused with a reward that
# is code or a server: its confidence (Level 2's trigger, the gate), per-token scores (the light
# critic's reward-aware attention), its weights (RM evolution fine-tunes them).
NEEDS_RM = {"escalation": "the light RM's confidence and a strong-to-light score map",
            "human_queue": "Level-2 escalation (the light RM's confidence)",
            "rm_evolution": "the light RM's confidence and weights (it fine-tunes them)",
            "reward_attention": "the RM's per-token scores"}


def check_features(cfg, spec: str | Path) -> None:
    """A ValueError (one line) when a feature that reads an RM's insides is on while the reward
    `spec` is code or a server; nothing for a folder."""
    what = kind(spec)
    if what == "folder":
        return
    from rlhf.pipeline.ppo.features import registry

    for f in registry.on(cfg):
        if f.name in NEEDS_RM:
            keys = [k for k, v in f.switches.items() if getattr(cfg, k) != v] or list(f.switches)
            raise ValueError(f"--reward {spec}: ppo.{keys[0]} ({f.name}) needs {NEEDS_RM[f.name]}, "
                             f"which a reward {'function' if what == 'python' else 'server'} "
                             "does not have; switch it off or give a reward model folder")


@torch.no_grad()
def score_level1(scorer, r, cost, device) -> None:
    """Level 1 of the scoring tiers: light-RM scores and confidences of every valid row into
    `r.level1_*` and `r.scores` (a fallback row earns none, nor a row a reward function
    declines: `mark_unscored`); its calls go to `cost`."""
    from rlhf.pipeline.ppo.accounting import rm_tokens

    r.level1_scores = torch.zeros(len(r), dtype=torch.float32, device=device)
    r.level1_confidence = torch.zeros(len(r), dtype=torch.float32, device=device)
    ok = r.valid.nonzero().flatten().tolist()
    if ok:
        prompts, resps = [r.prompts[i] for i in ok], [r.responses[i] for i in ok]
        scores, conf, *valid = scorer.score(prompts, resps)
        cost.add_rm("light", len(ok), rm_tokens(scorer, prompts, resps))
        r.level1_scores[ok] = torch.as_tensor(scores, dtype=torch.float32, device=device)
        r.level1_confidence[ok] = torch.as_tensor(conf, dtype=torch.float32, device=device)
        if valid:
            mark_unscored(r, ok, valid[0])
    r.scores, r.confidence = r.level1_scores.clone(), r.level1_confidence.clone()
    r.escalated = torch.zeros(len(r), dtype=torch.bool, device=device)


def mark_unscored(r, rows: list[int], valid) -> None:
    """The rows of `rows` a reward declined to score (`valid` False, one a row: a reward function
    or server, code_rewards.py): they earn no score and leave the update, flagged "unscored"."""
    for i, scored in zip(rows, valid.tolist()):
        if not scored:
            r.valid[i] = False
            r.flags[i] = r.flags[i] + ["unscored"]
