"""The native engine's decode step for Llama-shaped models (`LlamaForCausalLM`,
`Qwen2ForCausalLM` without a sliding window), without transformers' per-forward overhead
(`FastDecoder`).

Why: at the sizes this project trains on a CPU, a decode forward's matrix products are
microseconds; what a step costs is the Python around them (transformers builds the 4-D mask,
the rotary tables and a `DynamicCache` that concatenates every layer's keys and values anew each
step). Evicting finished rows cannot save that per-forward overhead, so it set the engine's
seconds. This step runs the same modules on the same inputs in the same order (the model's own
norms, projections, MLPs and LM head; the rotary formula, and transformers' own
`sdpa` attention function), over keys and values preallocated once for the whole response:
its logits are **bit for bit** those of `model(...)` with the cache (tests/test_fast_decode.py
checks it token for token, with padding and evicted rows, on a Llama and a Qwen2).

Only a model it can reproduce exactly gets it (`FastDecoder.attach` returns None otherwise and
the engine calls the model): the two classes above themselves (not a PEFT wrapper), default
rotary embeddings, `sdpa` attention, eval mode. The prefill still goes through the model; its
cache is copied in once.

    python -c "from rlhf.pipeline.decode import FastDecoder; help(FastDecoder.attach)"
"""

from __future__ import annotations

import torch


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), -1)


class FastDecoder:
    """One decode step at a time for the live rows of a batch; `batch_select_indices` drops
    finished rows."""

    def __init__(self, model, cache, extra: int):
        self.body, self.head = model.model, model.lm_head
        cfg = model.config
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.inv_freq = self.body.rotary_emb.inv_freq
        self.rope_scale = self.body.rotary_emb.attention_scaling
        self.keys, self.values = [], []
        for layer in cache.layers:     # room for `extra` more positions, filled in place
            k, v = layer.keys, layer.values
            b, h, n, d = k.shape
            big_k, big_v = k.new_empty(b, h, n + extra, d), v.new_empty(b, h, n + extra, d)
            big_k[:, :, :n], big_v[:, :, :n] = k, v
            self.keys.append(big_k)
            self.values.append(big_v)
        self.length = n

    @classmethod
    def attach(cls, model, cache, extra: int) -> FastDecoder | None:
        """A decoder over `cache` (a prefilled `DynamicCache`), or None when `model` is one
        whose forward this step does not reproduce exactly."""
        name = type(model).__name__
        cfg = getattr(model, "config", None)
        if name not in ("LlamaForCausalLM", "Qwen2ForCausalLM") or model.training:
            return None
        if getattr(cfg, "_attn_implementation", None) != "sdpa":
            return None
        if name == "Qwen2ForCausalLM" and getattr(cfg, "use_sliding_window", False):
            return None
        rope = getattr(cfg, "rope_parameters", None) or {}
        if rope.get("rope_type", "default") != "default":
            return None
        layers = getattr(cache, "layers", None)
        if not layers or len(layers) != len(model.model.layers) or any(
                getattr(layer, "keys", None) is None for layer in layers):
            return None
        return cls(model, cache, extra)

    def batch_select_indices(self, keep: torch.Tensor) -> None:
        """Keep only the cache rows `keep` (what `DynamicCache.batch_select_indices` does)."""
        self.keys = [k.index_select(0, keep) for k in self.keys]
        self.values = [v.index_select(0, keep) for v in self.values]

    @torch.no_grad()
    def step(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Logits [rows, V] of the next token. `ids` [rows, 1] the last tokens, `positions`
        [rows] their position ids, `mask` [rows, cached + 1] the attention mask (1 = attend)."""
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        x = self.body.embed_tokens(ids)
        rows, n = x.shape[0], self.length
        freqs = positions[:, None, None].float() * self.inv_freq.to(x.device, torch.float)
        emb = torch.cat((freqs, freqs), -1)
        cos = (emb.cos() * self.rope_scale).to(x.dtype)[:, None]
        sin = (emb.sin() * self.rope_scale).to(x.dtype)[:, None]
        # transformers passes no mask to SDPA when no key is masked, a boolean one otherwise
        attn_mask = None if bool(mask.all()) else mask[:, None, None, :].bool()
        for i, layer in enumerate(self.body.layers):
            attn = layer.self_attn
            residual = x
            x = layer.input_layernorm(x)
            q = attn.q_proj(x).view(rows, 1, -1, self.head_dim).transpose(1, 2)
            k = attn.k_proj(x).view(rows, 1, -1, self.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(rows, 1, -1, self.head_dim).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            self.keys[i][:, :, n:n + 1] = k
            self.values[i][:, :, n:n + 1] = v
            keys, values = self.keys[i][:, :, :n + 1], self.values[i][:, :, :n + 1]
            out, _ = sdpa_attention_forward(attn, q, keys, values, attn_mask,
                                            scaling=attn.scaling)
            x = residual + attn.o_proj(out.reshape(rows, 1, -1))
            residual = x
            x = residual + layer.mlp(layer.post_attention_layernorm(x))
        self.length = n + 1
        return self.head(self.body.norm(x))[:, -1]
