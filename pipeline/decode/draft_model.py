"""The self-speculative draft model (`ppo.draft: model`): the policy's own first `draft_layers`
decoder layers with its final norm and LM head, sharing its weights (no copy, no training, never
stale after an update), drafting k tokens per row from a distribution q known at verification.

The accept rule (Leviathan et al. 2023; Chen et al. 2023). At a position whose target
distribution is p (the policy's, after temperature and top-p) the draft token x was drawn from q
(the draft model's logits through the same pad suppression, temperature and top-p). Draw a
fresh u ~ U(0, 1); accept x if u < min(1, p(x) / q(x)); otherwise sample y from the residual
r = max(0, p - q) / Z, Z = sum_y max(0, p(y) - q(y)). Then for every token y
    P(y) = q(y) min(1, p(y)/q(y)) + P(reject) r(y)
         = min(p(y), q(y)) + (1 - sum_x min(p(x), q(x))) max(0, p(y) - q(y)) / Z
         = min(p(y), q(y)) + max(0, p(y) - q(y)) = p(y),
since 1 - sum_x min(p(x), q(x)) = sum_x max(0, p(x) - q(x)) = Z. So every verified token is
distributed exactly as the policy's, whatever q is, provided x is drawn fresh from q and u is
independent of it; the cache then holds the accepted prefix only (pipeline/decode/drafted.py), so
by induction over positions the whole response is the policy's own sample. A point mass q = [x] is
the special case the lookup drafter uses (accept with p(x); residual: p without x).

Drafting costs no extra cache and no recomputation: the first `draft_layers` layers' keys and
values of the accepted prefix are exactly the policy's own first layers' (same weights, tokens
and positions), so the draft forwards read the verification cache, append their k positions to
those layers only, and the k draft slots are cropped before the policy verifies the block (which
writes every layer's keys and values for those positions itself). Recomputing the draft from
the whole context instead would push the context through the draft layers k times per
verification; a separate draft cache would hold a copy of what the policy's already holds.

    python -c "from rlhf.pipeline.decode import ModelDrafter; print(ModelDrafter(0).name)"
"""

from __future__ import annotations

import contextlib

import torch
from rlhf.pipeline.decode.drafters import Drafter


def decoder_layers(model):
    """The decoder stack (`model.model.layers`: Llama, Qwen, Mistral, Gemma ...); a one-line
    error for a model without one."""
    from rlhf.pipeline.config import ConfigError

    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ConfigError(f"ppo.draft 'model' needs a decoder whose layers are model.model.layers "
                          f"(Llama, Qwen, Mistral ...), not {type(model).__name__}")
    return layers


def draft_layer_count(n_layers: int, draft_layers: int) -> int:
    """Layers of the draft model: `draft_layers`, 0 = a quarter of the policy's (at least one),
    at most all but one (a draft as deep as the policy is the policy)."""
    want = draft_layers if draft_layers > 0 else max(1, n_layers // 4)
    return max(1, min(want, n_layers - 1)) if n_layers > 1 else 1


@contextlib.contextmanager
def shallow(model, n: int):
    """`model` running only its first `n` decoder layers (then its final norm and LM head)."""
    full = decoder_layers(model)
    model.model.layers = torch.nn.ModuleList(list(full)[:n])
    try:
        yield model
    finally:
        model.model.layers = full


class ModelDrafter(Drafter):
    """Self-speculative drafts: k tokens a row from the policy's first layers (module docstring)."""

    name = "model"
    exact = True

    def __init__(self, draft_layers: int = 0):
        self.draft_layers = draft_layers

    def layers_of(self, model) -> int:
        return draft_layer_count(len(decoder_layers(model)), self.draft_layers)

    @torch.no_grad()
    def draft(self, ctx):
        """(drafts, q): k tokens per live row drawn from the draft model, and q [k, V] per row
        (the distribution each was drawn from). A draft ends at its first eos."""
        model, cache, k = ctx.model, ctx.cache, ctx.k
        if k < 1:
            return [[] for _ in ctx.rows], None
        m = self.layers_of(model)
        tok, mask = ctx.last, ctx.mask
        toks, qs = [], []
        with shallow(model, m):
            for t in range(k):
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
                out = model(input_ids=tok[:, None], attention_mask=mask,
                            position_ids=(ctx.next_pos + t)[:, None], cache=cache,
                            use_cache=True)
                q = ctx.target(out.logits[:, -1])                  # [n, V]
                tok = torch.multinomial(q, 1).squeeze(1)
                toks.append(tok)
                qs.append(q)
        for layer in cache.layers[:m]:  # the draft slots leave; verification writes its own
            layer.crop(-k)
        ctx.cost["draft_forwards"] += k
        ctx.cost["draft_token_forwards"] += k * len(ctx.rows)
        ctx.cost["draft_share"] = m / len(decoder_layers(model))
        T, Q = torch.stack(toks, 1).tolist(), torch.stack(qs, 1)   # [n, k], [n, k, V]
        drafts = []
        for row in T:
            cut = row.index(ctx.eos) + 1 if ctx.eos is not None and ctx.eos in row else k
            drafts.append(row[:cut])
        return drafts, [Q[r, : len(d)] for r, d in enumerate(drafts)]

    def state_dict(self) -> dict:
        return {"draft_layers": self.draft_layers}  # the weights are the policy's own

    def load_state_dict(self, state: dict) -> None:
        self.draft_layers = int(state["draft_layers"])
