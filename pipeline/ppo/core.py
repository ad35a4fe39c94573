"""PPO math as pure functions: GAE, masked whitening, the clipped surrogate, the value loss, KL.

Everything here takes tensors and returns tensors; nothing touches a model, a file or a global,
so each function is unit-tested on hand-computed tensors (tests/test_ppo_core.py).

    python -m pytest -q tests/test_ppo_core.py

Shapes: B = batch, T = response length (padded), V = vocabulary size. A `mask` is a [B, T] bool
or 0/1 tensor that is true on real response tokens and false on padding.

Conventions (the same as OpenRLHF and TRL): `values[:, t]` is V(s_t), the value of the state
before response token t is generated; the scalar reward of a sequence sits on its LAST real
response token, and every token also carries the per-token KL penalty `-kl_coef * kl_t`
(seed 000 §4.3). GAE bootstraps with 0 after the last real token (an LLM rollout always ends).
"""

from __future__ import annotations

import torch

# A log-distribution whose logsumexp is further than this from 0 is not a full distribution
# (seed 000 §5.4: a truncated top-k distribution makes the KL penalty lie).
_NORMALISATION_TOL = 1e-3


# --------------------------------------------------------------------------- masked statistics
def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` over the positions where `mask` is true (all of them, or along `dim`)."""
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp_min(1.0)
    return (values * mask).sum(dim) / mask.sum(dim).clamp_min(1.0)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over the masked positions; unbiased (Bessel) by default, as TRL and OpenRLHF."""
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        n = mask.to(values.dtype).sum()
        if n < 2:
            raise ValueError("masked_var needs at least two unmasked positions for an unbiased var")
        var = var * n / (n - 1)
    return var


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True,
                  eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the masked positions; padding positions come back as 0.

    `shift_mean=False` keeps the mean (scale only), as used for whitening rewards.
    """
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    out = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask.to(values.dtype)


# --------------------------------------------------------------------------- rewards and GAE
def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """[B] index of the last true position of each row of a [B, T] mask (right padding)."""
    mask = mask.bool()
    if not bool(mask.any(dim=1).all()):
        raise ValueError("every sequence needs at least one response token")
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    return torch.where(mask, positions, torch.full_like(positions, -1)).max(dim=1).values


def per_token_rewards(scores: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor,
                      kl_coef: float) -> torch.Tensor:
    """[B, T] rewards: `-kl_coef * kl` on every real token, plus the scalar score on the last one.

    scores: [B] sequence rewards; kl: [B, T] per-token KL to the reference; mask: [B, T].
    """
    rewards = -kl_coef * kl * mask.to(kl.dtype)
    last = last_token_index(mask)
    rewards[torch.arange(rewards.shape[0], device=rewards.device), last] += scores.to(kl.dtype)
    return rewards


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
        lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) over right-padded sequences.

    delta_t = r_t + gamma * V_{t+1} - V_t, A_t = delta_t + gamma * lam * A_{t+1}, with V and A
    taken as 0 past the last real token. Returns (advantages [B, T], returns = A + V [B, T]),
    both 0 on padding. Not whitened (see `masked_whiten`).
    """
    m = mask.to(values.dtype)
    rewards, values = rewards * m, values * m
    T = rewards.shape[1]
    last = torch.zeros_like(rewards[:, 0])
    out = []
    for t in reversed(range(T)):
        next_value = values[:, t + 1] if t + 1 < T else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        last = (delta + gamma * lam * last) * m[:, t]
        out.append(last)
    advantages = torch.stack(out[::-1], dim=1)
    return advantages, (advantages + values) * m


# --------------------------------------------------------------------------- losses
def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, clip_range: float
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The clipped surrogate (PPO, Schulman et al. 2017), as a loss to minimise.

    loss = mean over real tokens of max(-A * r, -A * clip(r, 1 - eps, 1 + eps)), r = exp(logp -
    old_logp). Returns (loss, clip_fraction: share of tokens where the clipped term was the
    larger, approx_kl: mean of 0.5 * (logp - old_logp)^2 over real tokens), the last two
    detached.
    """
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    loss = masked_mean(torch.maximum(unclipped, clipped), mask)
    with torch.no_grad():
        clip_fraction = masked_mean((clipped > unclipped).to(logprobs.dtype), mask)
        approx_kl = masked_mean(0.5 * log_ratio**2, mask)
    return loss, clip_fraction, approx_kl


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
               mask: torch.Tensor, clip_range_value: float | None = 0.2, kind: str = "mse",
               huber_delta: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss: 0.5 * mean over real tokens of max(e(V), e(V_clipped)).

    V_clipped = old_V + clip(V - old_V, -c, c); e is the squared error (`kind="mse"`, the PPO
    default) or the Huber loss with `huber_delta` (`kind="huber"`, seed 000 §3.2: robust to
    outliers; 0.5 * e^2 inside delta, so both kinds agree on small errors). `clip_range_value=None`
    disables clipping. Returns (loss, clip_fraction).
    """
    def err(pred: torch.Tensor) -> torch.Tensor:
        if kind == "mse":
            return (pred - returns) ** 2
        if kind == "huber":
            # 2 * huber so that the 0.5 below gives exactly the textbook Huber loss
            return 2.0 * torch.nn.functional.huber_loss(pred, returns, reduction="none",
                                                        delta=huber_delta)
        raise ValueError(f"unknown value loss kind {kind!r}; use 'mse' or 'huber'")

    e1 = err(values)
    if clip_range_value is None:
        return 0.5 * masked_mean(e1, mask), torch.zeros((), dtype=values.dtype)
    clipped = old_values + torch.clamp(values - old_values, -clip_range_value, clip_range_value)
    e2 = err(clipped)
    loss = 0.5 * masked_mean(torch.maximum(e1, e2), mask)
    with torch.no_grad():
        clip_fraction = masked_mean((e2 > e1).to(values.dtype), mask)
    return loss, clip_fraction


# --------------------------------------------------------------------------- log-probs and KL
def check_full_distribution(logprobs: torch.Tensor, vocab_size: int | None = None) -> None:
    """Raise ValueError unless `logprobs` [..., V] is a full normalised log-distribution.

    Seed 000 §5.4: a KL computed from truncated (top-k) log-probs is wrong and led to repetition
    collapse. A top-k slice fails both checks: its last dim is k < V and its mass is < 1.
    """
    if vocab_size is not None and logprobs.shape[-1] != vocab_size:
        raise ValueError(
            f"log-probs cover {logprobs.shape[-1]} tokens but the vocabulary has {vocab_size}: "
            "the KL must use the full distribution, never a truncated top-k (seed 000 §5.4)")
    total = torch.logsumexp(logprobs.detach().float(), dim=-1)
    worst = total.abs().max().item() if total.numel() else 0.0
    if worst > _NORMALISATION_TOL:
        raise ValueError(
            f"log-probs do not sum to 1 over the last dim (|logsumexp| up to {worst:.3g}): "
            "a truncated or unnormalised distribution (seed 000 §5.4)")


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k1"
                ) -> torch.Tensor:
    """Per-token Monte-Carlo estimators of KL(pi || ref) on tokens sampled from pi (Schulman,
    "Approximating KL divergence", 2020). With log r = ref_logp - logp:

    k1 = -log r (unbiased, can be negative), k2 = 0.5 (log r)^2 (biased, low variance, >= 0),
    k3 = (r - 1) - log r (unbiased, >= 0).

    `logprobs`/`ref_logprobs` are [B, T] log-probs of the sampled tokens, each taken from a FULL
    vocabulary softmax (`rlhf.pipeline.decode.token_logprobs`), never a truncated top-k
    (seed 000 §5.4).
    """
    log_r = ref_logprobs - logprobs
    if kind == "k1":
        return -log_r
    if kind == "k2":
        return 0.5 * log_r**2
    if kind == "k3":
        return torch.expm1(log_r) - log_r
    raise ValueError(f"unknown KL estimator {kind!r}; use 'k1', 'k2', 'k3' or the exact 'full'")

