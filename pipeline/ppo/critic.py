"""The critic: the value model PPO trains next to the policy (seed 000 §3.2).

`critic: full`: the policy's architecture (AutoModel from the policy's weights) plus a linear
value head. `trunk`: the policy's embeddings (frozen) and first k decoder layers (trained), copied
from the SFT policy, plus a value head. `shared`: those k layers frozen and run without autograd,
with one trainable causal attention block and a value head on top (under `ppo.lora` the
policy's own base, adapters off, instead of a copy: ppo/lora.py). `light`: a from-scratch causal
Transformer encoder. All but `full` read only the first 256 tokens of prompt + response
(truncated, and padded only to the longest sequence of the batch, never to 256), predicting a
value per position. `value_quality` gives explained variance and RMSE of V against the returns.

    python -m pytest -q tests/test_ppo_critic.py tests/test_critic_trunk.py

Definitions (the seed states the ideas, these are the precise versions):

- Reward-aware attention (§3.2: weight 1.2 on positions the RM rates high, 0.8 where it rates
  low). Per-position RM attribution is the *prefix-score increment*: the RM's score of the prefix
  ending at response token t minus that of the prefix ending at t-1 (a sequence-classification
  RM computes a score at every position in the same forward pass that scores the whole
  sequence, so this costs nothing extra; `models.scoring.HFScorer.token_scores` reads it). An
  encoder RM (MiniLM/BERT, the default light RM) has no prefix scores: its increments are
  gradient x input attributions of its tokens, mapped onto the policy's tokens by character
  (`models.scoring.attribution_scores`, one extra backward pass of the RM). Within each
  sequence, response tokens whose increment is in the top `weight_frac` get `weight_high`, the
  bottom `weight_frac` get `weight_low`, all others (and prompt tokens) 1.0. The weights scale
  attention to those keys: log(w) is added to the attention logits, so after the softmax a key
  of weight w gets w times the attention it had relative to a weight-1 key.
- Value per position: `values[:, t]` for response token t is the encoder's output at the
  position just before t (the last prompt token for t = 0), i.e. V of the state in which t is
  generated. Response tokens beyond the 256-token window reuse the window's last value.
- Loss: the clipped Huber value loss (`core.value_loss(kind="huber")`) plus `kl_reg_coef` times
  a KL regulariser pulling the critic's value distribution toward the RM's: over the batch, fit
  a Gaussian to the RM scores (mean, std) and one to the critic's value at each sequence's last
  response token (the value that should equal the expected final score), and take the closed
  form KL(N_rm || N_critic), both stds floored at 0.1 so an untrained critic's near-constant
  output does not blow it up.
- Attention-mask assertion (§5.3: padding must never be attended): `check_attention_mask`
  checks the mask is 0/1, right-padded (a run of ones then zeros), non-empty in every row and
  0 wherever the token is padding; the forward pass also asserts that every padded key gets
  -inf attention. (The seed's own `mask.sum() > 0.9 * numel` is a heuristic that fails on any
  batch with more than 10% padding, so it is not used.)
"""

from __future__ import annotations

import contextlib
import copy
import math

import torch
from torch import nn

from rlhf.pipeline.ppo import core


# --------------------------------------------------------------------------- inputs
def pack_right(prompt_ids: list[list[int]], response_ids: list[list[int]], pad_id: int,
               max_tokens: int | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prompt + response token lists as one right-padded batch, truncated to `max_tokens`.

    Returns input_ids [B, L], attention_mask [B, L] (1 = real token) and response_start [B]
    (index of the first response token in the untruncated sequence). L is the longest
    (truncated) sequence of the batch, never more.
    """
    seqs = [list(p) + list(r) for p, r in zip(prompt_ids, response_ids)]
    if max_tokens is not None:
        seqs = [s[:max_tokens] for s in seqs]
    length = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), length), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, : len(s)] = 1
    start = torch.tensor([len(p) for p in prompt_ids], dtype=torch.long)
    return ids, mask, start


def response_values(values: torch.Tensor, attention_mask: torch.Tensor,
                    response_start: torch.Tensor, n_response: int) -> torch.Tensor:
    """[B, n_response] per-response-token values from per-position critic outputs [B, L].

    Token t's value is the output at position start + t - 1 (the state before t); positions past
    the (possibly truncated) sequence reuse the last real position's value.
    """
    last_real = attention_mask.sum(1) - 1  # [B]
    t = torch.arange(n_response, device=values.device)
    pos = response_start[:, None] - 1 + t[None, :]  # [B, T]
    pos = torch.minimum(pos.clamp_min(0), last_real[:, None])
    return torch.gather(values, 1, pos)


def check_attention_mask(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         pad_id: int | None = None) -> None:
    """AssertionError unless the mask is a valid right-padding mask (seed 000 §5.3)."""
    assert attention_mask.shape == input_ids.shape, "attention mask and input ids differ in shape"
    m = attention_mask.long()
    assert bool(((m == 0) | (m == 1)).all()), "attention mask must hold only 0 and 1"
    assert bool((m.sum(1) > 0).all()), "a sequence has no attended token"
    # right padding: once a 0 appears, the rest of the row is 0 (no attended token after padding)
    assert bool((m[:, 1:] <= m[:, :-1]).all()), "attention mask is not a right-padding mask"
    if pad_id is not None:
        lengths = m.sum(1)
        positions = torch.arange(m.shape[1], device=m.device)[None, :]
        beyond = positions >= lengths[:, None]
        assert bool((input_ids[beyond] == pad_id).all()), \
            "a position past the sequence end holds a non-pad token"
        # with a dedicated pad token (pad != eos), an attended pad means the mask is broken
        assert not bool((input_ids[~beyond] == pad_id).any()), \
            "a padding token is attended (seed 000 §5.3)"


def reward_attention_weights(prefix_scores: torch.Tensor, response_mask: torch.Tensor,
                             weight_high: float = 1.2, weight_low: float = 0.8,
                             weight_frac: float = 0.25) -> torch.Tensor:
    """[B, L] key weights from per-position RM prefix scores [B, L] (see module docstring).

    `response_mask` [B, L] marks the response tokens, the only ones that get a weight != 1.
    The increment at the first response token is taken against the score of the prompt alone
    (the previous position), so prompt positions need a score too (0 is fine when unknown).
    """
    inc = prefix_scores.clone()
    inc[:, 1:] = prefix_scores[:, 1:] - prefix_scores[:, :-1]
    weights = torch.ones_like(prefix_scores)
    for i in range(prefix_scores.shape[0]):
        idx = torch.nonzero(response_mask[i].bool()).flatten()
        n = int(idx.numel())
        k = int(math.floor(weight_frac * n))
        if k == 0:
            continue
        # stable order: ties broken by position, so the weights are deterministic
        order = idx[torch.argsort(inc[i, idx], stable=True)]
        weights[i, order[:k]] = weight_low
        weights[i, order[n - k:]] = weight_high
    return weights


def gaussian_kl(target: torch.Tensor, pred: torch.Tensor, std_floor: float = 0.1) -> torch.Tensor:
    """KL(N(mean, std of target) || N(mean, std of pred)) over a batch of scalars (differentiable
    in `pred`). Used to pull the critic's value distribution toward the RM's (seed 000 §3.2).

    Both stds are floored at `std_floor`: a freshly initialised critic predicts nearly the same
    value everywhere, and an unfloored KL would then explode (it grows as 1 / std_pred^2).
    """
    mu_t, mu_p = target.mean(), pred.mean()
    sd_t = target.std(unbiased=False).clamp_min(std_floor)
    sd_p = pred.std(unbiased=False).clamp_min(std_floor)
    return torch.log(sd_p / sd_t) + (sd_t**2 + (mu_t - mu_p) ** 2) / (2 * sd_p**2) - 0.5


def critic_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                mask: torch.Tensor, rm_scores: torch.Tensor, clip_range_value: float | None,
                huber_delta: float, kl_reg_coef: float
                ) -> tuple[torch.Tensor, dict[str, float]]:
    """Huber value loss + kl_reg_coef * KL(RM score distribution || last-token value distribution).

    values/old_values/returns/mask: [B, T] over response tokens; rm_scores: [B].
    """
    vloss, vclip = core.value_loss(values, old_values, returns, mask, clip_range_value,
                                   kind="huber", huber_delta=huber_delta)
    loss = vloss
    reg = torch.zeros((), dtype=values.dtype)
    rows = mask.bool().any(1)  # rollouts without a trainable token (fallbacks) sit out
    if kl_reg_coef > 0 and int(rows.sum()) > 1:
        last = core.last_token_index(mask[rows])
        v_last = values[rows][torch.arange(int(rows.sum())), last]
        reg = gaussian_kl(rm_scores[rows].to(values.dtype), v_last)
        loss = loss + kl_reg_coef * reg
    return loss, {"value_loss": float(vloss.detach()), "value_clipfrac": float(vclip),
                  "critic_kl_reg": float(reg.detach())}


# --------------------------------------------------------------------------- models
def attention_bias(attention_mask: torch.Tensor, key_weights: torch.Tensor | None,
                   num_heads: int, causal: bool) -> torch.Tensor:
    """[B * heads, L, L] additive attention bias: -inf on padded keys (and, when `causal`, on
    keys after the query), log(weight) on the other keys."""
    B, L = attention_mask.shape
    keep = attention_mask.bool()
    w = attention_mask.new_ones((B, L)).float() if key_weights is None else key_weights.float()
    bias = torch.where(keep, torch.log(w.clamp_min(1e-6)), torch.full_like(w, -math.inf))
    bias = bias[:, None, :].expand(B, L, L)
    if causal:  # V(s_t) is the value before token t: it must not read the tokens after t
        future = torch.ones(L, L, dtype=torch.bool, device=bias.device).triu(1)
        bias = bias.masked_fill(future[None], -math.inf)
    bias = bias[:, None].expand(B, num_heads, L, L)
    # §5.3: a padded key must never receive attention
    assert bool(torch.isneginf(bias.masked_select(~keep[:, None, None, :])).all()), \
        "a padded position would be attended"
    return bias.reshape(-1, L, L)


class LightCritic(nn.Module):
    """A from-scratch Transformer encoder over the first `max_tokens` tokens (its own random
    embeddings); a value per position. Causal by default: with bidirectional attention the value
    before token t would read t and every later token, the very actions it should be a baseline
    for (it could then predict the final score and leave no advantage)."""

    def __init__(self, vocab_size: int, hidden_size: int = 1024, num_layers: int = 3,
                 num_heads: int = 8, max_tokens: int = 256, dropout: float = 0.0,
                 pad_id: int = 0, causal: bool = True):
        super().__init__()
        self.max_tokens, self.num_heads, self.pad_id = max_tokens, num_heads, pad_id
        self.causal = causal
        self.embed = nn.Embedding(vocab_size, hidden_size)
        self.pos = nn.Embedding(max_tokens, hidden_size)
        layer = nn.TransformerEncoderLayer(hidden_size, num_heads, 4 * hidden_size, dropout,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(hidden_size)
        self.head = nn.Linear(hidden_size, 1)

    def attention_bias(self, attention_mask: torch.Tensor,
                       key_weights: torch.Tensor | None) -> torch.Tensor:
        """[B * heads, L, L] additive bias (see `attention_bias`)."""
        return attention_bias(attention_mask, key_weights, self.num_heads, self.causal)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                key_weights: torch.Tensor | None = None) -> torch.Tensor:
        """values [B, L'] for input_ids/attention_mask [B, L] (L' = min(L, max_tokens))."""
        input_ids = input_ids[:, : self.max_tokens]
        attention_mask = attention_mask[:, : self.max_tokens].float()  # §5.3: float, not bool
        if key_weights is not None:
            key_weights = key_weights[:, : self.max_tokens]
        check_attention_mask(input_ids, attention_mask, self.pad_id)
        L = input_ids.shape[1]
        h = self.embed(input_ids) + self.pos(torch.arange(L, device=input_ids.device))[None]
        bias = self.attention_bias(attention_mask, key_weights).to(h.dtype)
        h = self.encoder(h, mask=bias)
        values = self.head(self.norm(h)).squeeze(-1)
        return values * attention_mask  # padded positions report 0, never a stray value


class FullCritic(nn.Module):
    """A policy-sized backbone (transformers AutoModel) plus a linear value head."""

    def __init__(self, backbone: nn.Module, hidden_size: int, pad_id: int = 0):
        super().__init__()
        self.backbone, self.pad_id = backbone, pad_id
        self.head = nn.Linear(hidden_size, 1)
        self.max_tokens = None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                key_weights: torch.Tensor | None = None) -> torch.Tensor:
        check_attention_mask(input_ids, attention_mask, self.pad_id)
        h = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.head(h).squeeze(-1) * attention_mask.to(h.dtype)


class PolicyTrunkCritic(nn.Module):
    """The policy's embeddings and first k decoder layers (a transformers AutoModel of the
    policy's architecture with k layers), read over the first `max_tokens` tokens, plus a value
    head. The weights start as the policy's (`copy_from_policy`, called when the engines are
    built, i.e. from the SFT policy at step 0).

    `frozen=False` (`critic: trunk`): the k layers train; the embedding table stays frozen (it
    is the largest tensor at any real vocabulary, and training it would add 12 bytes of gradient
    and Adam state per entry). `frozen=True` (`critic: shared`): the whole trunk is frozen and
    run without autograd (no gradient, no optimiser state, no stored activations); on top of it
    one trainable causal attention block of the policy's width (the `adapter`, which also takes
    the reward-aware key weights), a norm and the value head. With `base` (`critic: shared` under
    `ppo.lora`) no trunk is built: the frozen trunk is the peft policy's own base read with its
    adapters off after k layers (ppo/lora.py `base_hidden_states`), so no layer is copied.
    """

    def __init__(self, policy_config, num_layers: int, max_tokens: int = 256, pad_id: int = 0,
                 frozen: bool = False, base=None):
        super().__init__()
        from transformers import AutoModel

        total = policy_config.num_hidden_layers
        self.num_layers = trunk_layers(num_layers, total)
        cfg = copy.deepcopy(policy_config)
        cfg.num_hidden_layers = self.num_layers
        if isinstance(getattr(cfg, "layer_types", None), list):  # per-layer lists (Qwen2 etc.)
            cfg.layer_types = cfg.layer_types[: self.num_layers]
        self.max_tokens, self.pad_id, self.frozen = max_tokens, pad_id, frozen
        hidden = cfg.hidden_size
        # `base` (a frozen critic under ppo.lora): the peft policy itself, read with its adapters
        # off (ppo/lora.py), so the trunk is no copy; a tuple keeps it out of the critic's
        # parameters, state and optimiser
        self.base = (base,) if base is not None else None
        self.backbone = None
        if base is None:
            self.backbone = AutoModel.from_config(cfg)
            self.backbone.get_input_embeddings().requires_grad_(False)
        if frozen:
            if self.backbone is not None:
                self.backbone.requires_grad_(False)
            self.num_heads = cfg.num_attention_heads
            self.adapter = nn.TransformerEncoderLayer(
                hidden, self.num_heads, 4 * hidden, 0.0, activation="gelu", batch_first=True,
                norm_first=True)
            self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, 1)

    def copy_from_policy(self, policy: nn.Module) -> None:
        """Load the policy's embeddings and first k layers (and its final norm) into the trunk."""
        if self.backbone is None:  # the trunk is the policy's own base
            return
        if hasattr(policy, "get_base_model"):  # a peft policy (ppo.lora): its base's weights
            from rlhf.pipeline.models.lora import base_state_dict

            state = base_state_dict(policy)
        else:
            state = getattr(policy, getattr(policy, "base_model_prefix", ""), policy).state_dict()
        missing, _ = self.backbone.load_state_dict(state, strict=False)
        if missing:
            raise ValueError(f"the policy lacks the critic trunk's weights {missing[:3]}: is it "
                             "the architecture the critic was built from?")

    def train(self, mode: bool = True):
        super().train(mode)
        if self.frozen and self.backbone is not None:
            self.backbone.eval()
        return self

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                key_weights: torch.Tensor | None = None) -> torch.Tensor:
        """values [B, L'] for input_ids/attention_mask [B, L] (L' = min(L, max_tokens))."""
        input_ids = input_ids[:, : self.max_tokens]
        attention_mask = attention_mask[:, : self.max_tokens]
        check_attention_mask(input_ids, attention_mask, self.pad_id)
        if self.base is not None:
            from rlhf.pipeline.ppo.lora import base_hidden_states

            h = base_hidden_states(self.base[0], input_ids, attention_mask, self.num_layers)
        else:
            with torch.no_grad() if self.frozen else contextlib.nullcontext():
                h = self.backbone(input_ids=input_ids,
                                  attention_mask=attention_mask).last_hidden_state
        if self.frozen:
            if key_weights is not None:
                key_weights = key_weights[:, : self.max_tokens]
            bias = attention_bias(attention_mask, key_weights, self.num_heads, True)
            h = self.norm(self.adapter(h, src_mask=bias.to(h.dtype)))
        return self.head(h).squeeze(-1) * attention_mask.to(h.dtype)


def trunk_layers(num_layers: int, policy_layers: int) -> int:
    """How many of the policy's layers a trunk critic keeps: `num_layers`, or with 0 a quarter
    of the policy's (at least 1). Fewer than the policy's, or the critic would not be lighter."""
    k = num_layers if num_layers > 0 else max(1, policy_layers // 4)
    if k >= policy_layers:
        raise ValueError(f"ppo.critic_layers {k} must be fewer than the policy's {policy_layers} "
                         "layers for a trunk or shared critic (0 = a quarter of them)")
    return k


def build_critic(kind: str, vocab_size: int, pad_id: int, hidden_size: int = 1024,
                 num_layers: int = 3, num_heads: int = 8, max_tokens: int = 256,
                 policy_source: str | None = None, policy_config=None) -> nn.Module:
    """`kind="light"`: LightCritic (from scratch). `kind="full"`: AutoModel of the policy (weights
    from `policy_source` when given, else a fresh model from `policy_config`) + value head.
    `kind="trunk"` / `"shared"`: PolicyTrunkCritic over the policy's first `num_layers` layers
    (0 = a quarter), trained / frozen with an adapter; built from `policy_config`, its weights
    copied from the policy by `copy_from_policy`."""
    if kind == "light":
        return LightCritic(vocab_size, hidden_size, num_layers, num_heads, max_tokens,
                           pad_id=pad_id)
    if kind in ("trunk", "shared"):
        if policy_config is None:
            raise ValueError(f"critic {kind!r} needs the policy's config")
        return PolicyTrunkCritic(policy_config, num_layers, max_tokens, pad_id,
                                 frozen=kind == "shared")
    if kind == "full":
        from transformers import AutoModel

        if policy_source is not None:
            backbone = AutoModel.from_pretrained(policy_source)
        elif policy_config is not None:
            backbone = AutoModel.from_config(policy_config)
        else:
            raise ValueError("critic 'full' needs the policy's weights or config")
        return FullCritic(backbone, backbone.config.hidden_size, pad_id)
    raise ValueError(f"unknown critic {kind!r}; use 'light', 'trunk', 'shared' or 'full'")


# --------------------------------------------------------------------------- value quality
def value_quality_sums(values: torch.Tensor, returns: torch.Tensor,
                       mask: torch.Tensor) -> torch.Tensor:
    """[5] float64 sums over the masked tokens: count, sum R, sum R^2, sum (R-V), sum (R-V)^2.
    Sums add across processes, so the quality of a sharded batch is that of the whole."""
    m = mask.bool()
    r = returns.detach()[m].double()
    e = r - values.detach()[m].double()
    return torch.stack([r.new_tensor(float(r.numel())), r.sum(), (r * r).sum(), e.sum(),
                        (e * e).sum()])


def value_quality(sums: torch.Tensor) -> dict[str, float]:
    """Explained variance 1 - Var(R - V) / Var(R) and RMSE sqrt(mean (V - R)^2) of the values
    against the returns, from `value_quality_sums` (NaN without two tokens or with constant
    returns, where the explained variance is undefined)."""
    n, sr, srr, se, see = (float(x) for x in sums.cpu())
    if n < 2:
        return {"value_explained_variance": math.nan, "value_rmse": math.nan}
    var_r = srr / n - (sr / n) ** 2
    var_e = see / n - (se / n) ** 2
    ev = 1.0 - var_e / var_r if var_r > 1e-12 else math.nan
    return {"value_explained_variance": ev, "value_rmse": math.sqrt(max(see / n, 0.0))}
