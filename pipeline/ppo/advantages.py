"""Advantage estimators: how a step's per-token rewards become the advantages the clipped
surrogate weighs, behind one protocol (`ppo.advantage_estimator`).

- `gae` (PPO): generalised advantage estimation against the critic's values (core.gae).
- `rloo` (REINFORCE leave-one-out, Ahmadian et al. 2024): each of a prompt's k samples gets its
  return minus the mean return of the other k - 1 samples; no critic.
- `grpo` (Shao et al. 2024): the return standardised within the prompt's group,
  (R - mean) / (std + 1e-4), the std unbiased as TRL computes it; no critic.

A return R is the response's per-token rewards summed (the RM score minus the per-token KL
penalty, core.per_token_rewards), so the group estimators see the same KL-shaped reward as GAE.
Group estimators need k samples of each prompt (`ppo.group_size`, the trainer draws them as
contiguous rows); rows without a trainable token (fallbacks, pruned rows) sit out of their
group's statistics and get advantage 0. A group estimator broadcasts one advantage over every
token of its response; its `returns` are 0 (there is no value target), the trainer builds no
critic, and `ppo.whiten_advantages` (for GAE) does not whiten its advantages a second time.

    python -c "import torch; from rlhf.pipeline.ppo.advantages import group_advantages as g; \
print(g(torch.tensor([1., 0., 3., 3.]), torch.tensor([0, 0, 1, 1]), torch.ones(4).bool(), 'rloo'))"
"""

from __future__ import annotations

from typing import Protocol

import torch

from rlhf.pipeline.ppo import core


class AdvantageEstimator(Protocol):
    name: str
    needs_critic: bool  # False: the trainer neither builds, runs nor trains a critic
    # True: the advantages already carry their baseline (and GRPO its scale) from the group, so
    # `ppo.whiten_advantages` leaves them as they are (see `GroupEstimator`)
    normalised: bool

    def estimate(self, rewards: torch.Tensor, values: torch.Tensor | None, mask: torch.Tensor,
                 groups: torch.Tensor, gamma: float, lam: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """(advantages [B, T], returns [B, T]) of right-padded per-token `rewards` on `mask`;
        `groups` [B]: the prompt group of each row (rows of a prompt share an id)."""
        ...


def group_advantages(returns: torch.Tensor, groups: torch.Tensor, live: torch.Tensor,
                     kind: str) -> torch.Tensor:
    """One advantage per row from its sequence return and its group's (`live` rows only)."""
    out = torch.zeros_like(returns)
    for g in torch.unique(groups):
        rows = ((groups == g) & live).nonzero().flatten()
        k = rows.numel()
        if k < 2:
            continue  # one live sample: no baseline, no signal
        r = returns[rows]
        if kind == "rloo":
            out[rows] = r - (r.sum() - r) / (k - 1)
        elif kind == "grpo":
            out[rows] = (r - r.mean()) / (r.std() + 1e-4)
        else:
            raise ValueError(f"unknown group estimator {kind!r}")
    return out


class GAE:
    # PPO whitens GAE advantages over the batch (`ppo.whiten_advantages`; TRL's PPO trainer and
    # OpenAI's baselines do the same)
    name, needs_critic, normalised = "gae", True, False

    def estimate(self, rewards, values, mask, groups, gamma, lam):
        return core.gae(rewards, values, mask, gamma, lam)


class GroupEstimator:
    # Not whitened again over the batch: GRPO's advantage is already the group-standardised
    # return (Shao et al. 2024, §4.1.2; TRL's GRPOTrainer scales by the group std and no more,
    # `scale_rewards="group"`), and RLOO's is the return minus the leave-one-out baseline, used as
    # it is by Ahmadian et al. 2024 and by TRL's RLOOTrainer (`normalize_advantages` defaults to
    # False). Whitening them again would re-centre and re-scale every group by the batch's spread.
    needs_critic, normalised = False, True

    def __init__(self, name: str):
        self.name = name

    def estimate(self, rewards, values, mask, groups, gamma, lam):
        m = mask.to(rewards.dtype)
        seq = (rewards * m).sum(1)
        adv = group_advantages(seq, groups.to(seq.device), mask.any(1), self.name)
        return adv[:, None] * m, torch.zeros_like(rewards)


ESTIMATORS: dict[str, AdvantageEstimator] = {"gae": GAE(), "rloo": GroupEstimator("rloo"),
                                             "grpo": GroupEstimator("grpo")}


def estimator(name: str) -> AdvantageEstimator:
    try:
        return ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown ppo.advantage_estimator {name!r}; known: "
                         f"{', '.join(ESTIMATORS)}") from None
