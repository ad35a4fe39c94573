"""Prompts in, responses out, as tokens: how every stage renders and pads a batch of prompts and
where a generated row's response ends, so that a response means the same thing everywhere:

- prompts are rendered with `text.render_prompt` (the chat template or the plain format),
  **left-padded** (and optionally truncated to `max_prompt_tokens`); position ids count real
  tokens only, so a padded row sees the positions it would see alone;
- a response is the generated tokens **up to and including the first eos**; a row that never
  emitted eos keeps its non-pad tokens (a sequence stopped by a per-sequence stopping criterion
  ends there too).

    python -c "from rlhf.pipeline.decode import cut_at_eos; print(cut_at_eos([5, 6, 2, 0], 2, 0))"
"""

from __future__ import annotations

from collections.abc import Sequence

from rlhf.pipeline.models.text import encode_kwargs, render_prompt


def encode_prompts(tokenizer, prompts: Sequence[str], max_prompt_tokens: int | None = None):
    """Left-padded `render_prompt` encodings ({"input_ids", "attention_mask"}, [B, P])."""
    tokenizer.padding_side = "left"
    kw = {"truncation": True, "max_length": max_prompt_tokens} if max_prompt_tokens else {}
    return tokenizer([render_prompt(p, tokenizer) for p in prompts], return_tensors="pt",
                     padding=True, **encode_kwargs(tokenizer), **kw)


def cut_at_eos(ids: Sequence[int], eos: int | None, pad: int | None) -> list[int]:
    """The response tokens of one generated row: up to and including the first eos, else every
    non-pad token (when pad is eos, the first eos is the stop and nothing after it is kept)."""
    ids = list(ids)
    if eos is not None and eos in ids:
        return ids[: ids.index(eos) + 1]
    return [t for t in ids if t != pad]


def position_ids(mask):
    """[B, L] positions of a left-padded mask: 0 at the first real token."""
    return (mask.cumsum(-1) - 1).clamp_min(0)


def pad_responses(rows: Sequence[Sequence[int]], pad: int):
    """([B, T] right-padded tokens, [B, T] bool mask) of variable-length responses."""
    import torch

    T = max((len(r) for r in rows), default=0) or 1
    out = torch.full((len(rows), T), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            out[i, : len(r)] = torch.tensor(list(r))
    mask = torch.arange(T)[None, :] < torch.tensor([len(r) for r in rows])[:, None]
    return out, mask
