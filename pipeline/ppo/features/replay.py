"""Seed 000 §2.2's replay buffer as a PPO switch (`ppo.replay_on`): part of every step's training
batch is drawn from a buffer of old rollouts instead of being sampled again.

The seed's experiment: PPO with its rollouts replaced by samples of a buffer of 2,000, whose
reward oscillated after the third round and ended 17.3 % below fresh rollouts (stale samples:
the policy has moved since they were generated). Here:

- the buffer keeps the last `replay_size` valid rollouts (first in, first out), each with what
  its step computed: tokens, the old log-probs of the policy that generated it, the reference
  log-probs, the per-token KL, entropy and the reward (Level 1 and, if escalated, Level 2);
- once it holds enough, `round(replay_fraction x batch_size)` rows of a step are drawn from it
  uniformly without replacement (a generator seeded by (ppo.seed, step), so a resumed run draws
  the same), and the trainer samples only the rest afresh;
- a replayed row trains with its **stored** old log-probs: the clipped surrogate's importance
  ratio pi_theta / pi_old is against the policy that generated it, as in off-policy PPO (the
  clip then bounds how far a stale sample can pull). Its values and advantages are this
  step's (the critic runs on the whole batch); its reward and KL penalty are the stored ones;
- it costs no generation, no RM call and no old-log-prob pass (all counted when it was first
  generated): `rollouts_replayed` says how many trained rows came from the buffer. Its store
  row carries the flag `replayed` and the checkpoint that generated it, and 0 generated,
  drafted and accepted tokens (what they were is in the row of the step that generated it);
  its RM score is not written to `rm_scores` again.

The buffer is this hook's state, saved in every checkpoint (hooks.py), so `--resume` continues
with it. One process only (the checkpoint saves rank 0's hooks).

    python -c "from rlhf.pipeline.ppo.features.replay import replay_rows; print(replay_rows(16, 0.5))"
"""

from __future__ import annotations

import random

from rlhf.pipeline.config import ConfigError
from rlhf.pipeline.ppo.features.registry import ConfigField, Feature, register
from rlhf.pipeline.ppo.hooks import HookBase
from rlhf.pipeline.ranges import COUNT, Range

# the per-token fields a stored row keeps (what the log-prob pass computed when it was generated)
TOKEN_FIELDS = ("logprobs", "ref_logprobs", "kl", "entropy")
ROW_FIELDS = ("scores", "confidence", "level1_scores", "level1_confidence")


def replay_rows(batch_size: int, fraction: float) -> int:
    """Rows of a `batch_size` batch drawn from the buffer: round(fraction x batch_size)."""
    return round(fraction * batch_size)


class ReplayBuffer(HookBase):
    """The buffer (`rows`, oldest first) and the step's draw (`ReplaySource`, hooks.py)."""

    name = "replay"

    def __init__(self, size: int, fraction: float, seed: int, pad_id: int):
        self.size, self.fraction, self.seed, self.pad_id = size, fraction, seed, pad_id
        self.rows: list[dict] = []
        self.pending = 0  # rows announced for this step by `replayed`

    def replayed(self, step: int, batch_size: int) -> int:
        n = replay_rows(batch_size, self.fraction)
        self.pending = n if len(self.rows) >= n else 0  # none until the buffer holds enough
        return self.pending

    def draw(self, step: int, n: int) -> list[dict]:
        """`n` stored rows, uniformly without replacement (seeded by ppo.seed and the step)."""
        picks = random.Random(self.seed * 1_000_003 + step).sample(range(len(self.rows)), n)
        return [self.rows[i] for i in picks]

    def push(self, r, step: int) -> None:
        """Store the valid rows of the fresh rollout `r`; the oldest leave past `size`."""
        mask = r.response_mask
        for i in range(len(r)):
            if not bool(r.valid[i]):
                continue  # a fallback or dropped sample has nothing to train on
            n = int(mask[i].sum())
            row = {"prompt_id": r.prompt_ids[i], "prompt": r.prompts[i],
                   "response_text": r.responses[i],
                   "query": r.query[i][r.query_mask[i].bool()].tolist(),
                   "response": r.response[i, :n].tolist(), "flags": list(r.flags[i]),
                   "escalated": bool(r.escalated[i]), "version": r.policy_version,
                   "step": step}
            row.update({f: getattr(r, f)[i, :n].tolist() for f in TOKEN_FIELDS})
            row.update({f: float(getattr(r, f)[i]) for f in ROW_FIELDS})
            self.rows.append(row)
        self.rows = self.rows[-self.size:]

    def mix(self, step: int, r, cost):
        from rlhf.pipeline.ppo.rollout import Rollout

        picked = self.draw(step, self.pending) if self.pending else []
        self.push(r, step)  # after the draw: a step never replays its own rows
        if not picked:
            return r
        cost.rollouts_replayed += len(picked)
        r.extras.setdefault("policy_version", [None] * len(r))
        return Rollout.cat([r, self.as_rollout(picked, r.query.device)], self.pad_id)

    def as_rollout(self, rows: list[dict], device):
        """Stored rows as a Rollout after its log-prob pass (the fields `Rollout.cat` joins)."""
        import torch
        from rlhf.pipeline.decode import pad_responses
        from rlhf.pipeline.ppo.rollout import Rollout

        P = max(len(row["query"]) for row in rows)
        query = torch.full((len(rows), P), self.pad_id, dtype=torch.long)
        query_mask = torch.zeros(len(rows), P, dtype=torch.long)
        for i, row in enumerate(rows):  # left padded
            query[i, P - len(row["query"]):] = torch.tensor(row["query"])
            query_mask[i, P - len(row["query"]):] = 1
        response, response_mask = pad_responses([row["response"] for row in rows], self.pad_id)
        T = response.shape[1]

        def tokens(field):
            out = torch.zeros(len(rows), T)
            for i, row in enumerate(rows):
                out[i, : len(row[field])] = torch.tensor(row[field])
            return out.to(device)

        out = Rollout(prompt_ids=[row["prompt_id"] for row in rows],
                      prompts=[row["prompt"] for row in rows],
                      responses=[row["response_text"] for row in rows],
                      query=query.to(device), query_mask=query_mask.to(device),
                      response=response.to(device), response_mask=response_mask.to(device),
                      valid=torch.ones(len(rows), dtype=torch.bool, device=device),
                      flags=[row["flags"] + ["replayed"] for row in rows],
                      policy_version=rows[0]["version"],
                      escalated=torch.tensor([row["escalated"] for row in rows], device=device),
                      # a replayed row costs this step no generation: its tokens and drafts
                      # are in the row stored at the step that generated it (same response,
                      # no `replayed` flag), so here they are 0 and each step's rows add up to
                      # its StepCost
                      extras={"generated_tokens": [0] * len(rows), "drafted": [0] * len(rows),
                              "accepted": [0] * len(rows),
                              "policy_version": [row["version"] for row in rows]})
        for f in ROW_FIELDS:
            setattr(out, f, torch.tensor([row[f] for row in rows], device=device))
        for f in TOKEN_FIELDS:
            setattr(out, f, tokens(f))
        return out

    def state_dict(self) -> dict:
        return {"rows": self.rows}

    def load_state_dict(self, state: dict) -> None:
        self.rows = [dict(row) for row in state["rows"]]


def _build(cfg, ctx) -> list:
    from accelerate import PartialState

    if PartialState().num_processes > 1:
        raise ConfigError("ppo.replay_on runs in one process (a checkpoint saves the main "
                          "process's replay buffer)")
    return [ReplayBuffer(cfg.replay_size, cfg.replay_fraction, cfg.seed,
                         ctx.tokenizer.pad_token_id)]


def _check(cfg) -> None:
    """A step replays 1 to batch_size - 1 rows (fresh rollouts keep filling the buffer)."""
    if not cfg.replay_on:
        return
    n = round(cfg.replay_fraction * cfg.batch_size)
    if not 1 <= n < cfg.batch_size:
        raise ConfigError(f"ppo.replay_fraction x ppo.batch_size must round to between 1 and "
                          f"batch_size - 1 rows, got {cfg.replay_fraction} x {cfg.batch_size}")
    if cfg.replay_size < n:
        raise ConfigError(f"ppo.replay_size ({cfg.replay_size}) must hold at least the "
                          f"{n} rows a step replays")
    if cfg.advantage_estimator != "gae" or cfg.group_size != 1:
        raise ConfigError("ppo.replay_on needs advantage_estimator gae with group_size 1 "
                          "(a group estimator compares fresh samples of one prompt)")


FIELDS = (
    ConfigField("replay_on", bool, False,
                help="seed 000 §2.2's replay buffer (features/replay.py): once it holds enough, "
                     'round( `replay_fraction` x batch_size) rows of each step are drawn from the'
                     ' last `replay_size` valid rollouts and trained with their stored old '
                     "log-probs (the seed's buffer: 2,000)"),
    ConfigField("replay_size", int, 2000, range=COUNT),
    ConfigField("replay_fraction", float, 0.5, range=Range(0, 1, lo_open=True, hi_open=True)),
)

register(Feature("replay", ("replay_on",),
                 help="seed 000 §2.2's replay buffer: part of each batch drawn from old rollouts, "
                      "trained with their stored old log-probs",
                 fields=FIELDS, check=_check, build=_build))
