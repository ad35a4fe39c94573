"""The Rollout: one batch of generated responses and everything PPO computes about them.

One dataclass carries a batch through the loop (generate -> score -> advantages -> PPO epochs ->
records); the shape comment on each field says what it holds. B = rollouts in the batch (this
process), P = prompt length (left-padded), T = response length (right-padded), L = critic input
length (prompt + response, right-padded, at most `critic_max_tokens`).

    python -c "from rlhf.pipeline.ppo.rollout import Rollout; help(Rollout)"
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


# [B, T] fields the log-prob pass sets, which `cat` right-pads like the responses (a replayed
# row brings them from when it was generated: features/replay.py)
LOGPROB_FIELDS = ("logprobs", "ref_logprobs", "kl", "entropy")


@dataclass
class Rollout:
    # --- what was asked and generated
    prompt_ids: list[str]            # [B] store prompt ids
    prompts: list[str]               # [B] prompt texts (as given to the formatter)
    responses: list[str]             # [B] decoded responses (fallback text on a timeout)
    query: torch.Tensor              # [B, P] prompt tokens, left-padded with pad_id
    query_mask: torch.Tensor         # [B, P] 1 on real prompt tokens
    response: torch.Tensor           # [B, T] response tokens up to and including eos, then pad
    response_mask: torch.Tensor      # [B, T] bool, true on real response tokens
    valid: torch.Tensor              # [B] bool, false for fallback rollouts (no gradient)
    flags: list[list[str]]           # [B] e.g. ["timeout"], ["no_eos"]
    policy_version: str              # checkpoint id of the policy that generated the batch
    # --- scored
    scores: torch.Tensor | None = None        # [B] the reward PPO uses (strong RM's if escalated)
    confidence: torch.Tensor | None = None    # [B] confidence in [0, 1] of the scorer of `scores`
    level1_scores: torch.Tensor | None = None      # [B] the light RM's score (seed 001 §4.1 L1)
    level1_confidence: torch.Tensor | None = None  # [B] the light RM's confidence
    escalated: torch.Tensor | None = None     # [B] bool, re-scored by the strong RM (Level 2)
    # --- from the policy and reference forward passes (full vocabulary, §5.4)
    logprobs: torch.Tensor | None = None      # [B, T] log pi_old(token)
    ref_logprobs: torch.Tensor | None = None  # [B, T] log pi_ref(token)
    kl: torch.Tensor | None = None            # [B, T] per-token KL(pi_old || pi_ref)
    entropy: torch.Tensor | None = None       # [B, T] entropy of pi_old at each position
    # --- critic inputs and outputs
    critic_ids: torch.Tensor | None = None    # [B, L] prompt + response, right-padded, truncated
    critic_mask: torch.Tensor | None = None   # [B, L] 1 on real tokens
    critic_start: torch.Tensor | None = None  # [B] index of the first response token
    key_weights: torch.Tensor | None = None   # [B, L] reward-aware attention weights (§3.2)
    values: torch.Tensor | None = None        # [B, T] V_old(s_t)
    # --- advantages
    rewards: torch.Tensor | None = None       # [B, T] per-token rewards (KL penalty + score)
    advantages: torch.Tensor | None = None    # [B, T] GAE advantages (whitened if configured)
    returns: torch.Tensor | None = None       # [B, T] advantages + values (unwhitened)
    extras: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def loss_mask(self) -> torch.Tensor:
        """[B, T] bool: real response tokens of valid (non-fallback) rollouts."""
        return self.response_mask & self.valid[:, None]

    @property
    def response_lengths(self) -> torch.Tensor:
        """[B] number of real response tokens."""
        return self.response_mask.sum(1)

    # ------------------------------------------------------------------ rows
    def take(self, rows: list[int]) -> Rollout:
        """A new Rollout of `rows` (in that order), before the log-prob pass: every per-row
        field set so far, list extras included."""
        idx = torch.tensor(rows, dtype=torch.long, device=self.query.device)
        out = {}
        for name, value in vars(self).items():
            if torch.is_tensor(value):
                out[name] = value[idx]
            elif isinstance(value, list) and len(value) == len(self):
                out[name] = [value[i] for i in rows]
            else:
                out[name] = value
        out["extras"] = {k: ([v[i] for i in rows] if isinstance(v, list) and len(v) == len(self)
                             else v) for k, v in self.extras.items()}
        return Rollout(**out)

    @staticmethod
    def cat(parts: list[Rollout], pad_id: int) -> Rollout:
        """Rows of `parts` one after another (queries re-padded on the left, responses on the
        right, and with them the per-token fields of the log-prob pass: `LOGPROB_FIELDS`);
        fields one part lacks are dropped; non-row extras come from the first part."""
        def left(t, width, value):
            return torch.nn.functional.pad(t, (width - t.shape[1], 0), value=value)

        def right(t, width, value):
            return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value)

        P = max(p.query.shape[1] for p in parts)
        T = max(p.response.shape[1] for p in parts)
        first, out = parts[0], {}
        for name, value in vars(first).items():
            if name == "extras":
                continue
            vals = [getattr(p, name) for p in parts]
            if any(v is None for v in vals):
                out[name] = None
            elif name in ("query", "query_mask"):
                out[name] = torch.cat([left(v, P, pad_id if name == "query" else 0)
                                       for v in vals])
            elif name in ("response", "response_mask"):
                out[name] = torch.cat([right(v, T, pad_id if name == "response" else False)
                                       for v in vals])
            elif name in LOGPROB_FIELDS:
                out[name] = torch.cat([right(v, T, 0.0) for v in vals])
            elif torch.is_tensor(value) and value.dim() == 1:
                out[name] = torch.cat(vals)
            elif isinstance(value, list):
                out[name] = [x for v in vals for x in v]
            elif torch.is_tensor(value):
                raise ValueError(f"Rollout.cat: {name} is set (cat before the log-prob pass)")
            else:
                out[name] = value
        out["extras"] = {k: ([x for p in parts for x in p.extras.get(k, [None] * len(p))]
                             if isinstance(v, list) and len(v) == len(first) else v)
                         for k, v in first.extras.items()}
        return Rollout(**out)
