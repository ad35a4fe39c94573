"""The one generation module: how every stage prompts a causal LM, samples, cuts and scores tokens.

Shared by the PPO trainer, `eval`, `preferences`, `reward`, `difficulty` and `sft` (through
`pipeline/policy.sample`), so that a response means the same thing everywhere:

- prompts are rendered with `text.format_prompt`, **left-padded** (and optionally truncated to
  `max_prompt_tokens`); position ids count real tokens only, so a padded row sees the positions
  it would see alone;
- a response is the generated tokens **up to and including the first eos**; a row that never
  emitted eos keeps its non-pad tokens (a sequence stopped by a per-sequence stopping criterion
  ends there too);
- log-probabilities and entropies come from **full-vocabulary** distributions (seed 000 §5.4),
  of the logits divided by the sampling temperature (the distribution actually sampled);
- sampling settings are one `Sampling` value (temperature, top-p, max new tokens).

    python -c "from rlhf.pipeline.generation import cut_at_eos; print(cut_at_eos([5, 6, 2, 0], eos=2, pad=0))"
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rlhf.pipeline.text import format_prompt


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0  # <= 0: greedy
    top_p: float = 1.0
    max_new_tokens: int = 48

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


def encode_prompts(tokenizer, prompts: Sequence[str], max_prompt_tokens: int | None = None):
    """Left-padded `format_prompt` encodings ({"input_ids", "attention_mask"}, [B, P])."""
    tokenizer.padding_side = "left"
    kw = {"truncation": True, "max_length": max_prompt_tokens} if max_prompt_tokens else {}
    return tokenizer([format_prompt(p) for p in prompts], return_tensors="pt", padding=True, **kw)


def cut_at_eos(ids: Sequence[int], eos: int | None, pad: int | None) -> list[int]:
    """The response tokens of one generated row: up to and including the first eos, else every
    non-pad token (when pad is eos, the first eos is the stop and nothing after it is kept)."""
    ids = list(ids)
    if eos is not None and eos in ids:
        return ids[: ids.index(eos) + 1]
    return [t for t in ids if t != pad]


def generate(model, tokenizer, enc, sampling: Sampling, *, num_return_sequences: int = 1,
             logits_processors: Sequence = (), stopping_criteria: Sequence = (),
             suppress_pad: bool = True, output_logits: bool = False):
    """model.generate on left-padded `enc` with these sampling settings; returns the
    transformers output (`.sequences` [rows, P + T], `.logits` if asked).

    `logits_processors` / `stopping_criteria`: per-sequence hooks (transformers objects). A
    stopping criterion that returns a per-row bool stops that row only; the row then gets pad
    tokens, which `cut_at_eos` drops, so it costs no further tokens in the accounting.
    `suppress_pad`: a sampled pad token would read as padding downstream (critic mask, seed 000
    §5.3), so it is never sampled unless pad doubles as eos."""
    from transformers import LogitsProcessorList, StoppingCriteriaList

    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    greedy = sampling.greedy
    return model.generate(
        **enc, do_sample=not greedy, temperature=None if greedy else sampling.temperature,
        top_p=None if greedy else sampling.top_p, top_k=None if greedy else 0,
        max_new_tokens=sampling.max_new_tokens,
        num_return_sequences=1 if greedy else num_return_sequences,
        pad_token_id=pad, eos_token_id=eos,
        suppress_tokens=[pad] if suppress_pad and pad is not None and pad != eos else None,
        logits_processor=LogitsProcessorList(list(logits_processors)),
        stopping_criteria=StoppingCriteriaList(list(stopping_criteria)),
        output_logits=output_logits, return_dict_in_generate=True)


def position_ids(mask):
    """[B, L] positions of a left-padded mask: 0 at the first real token."""
    return (mask.cumsum(-1) - 1).clamp_min(0)


def response_logits(model, query, query_mask, response, response_mask, temperature: float):
    """[B, T, V] logits / temperature at the T response positions of left-padded prompts
    ([B, P]) followed by right-padded responses ([B, T]): what scored the sampled tokens."""
    import torch

    ids = torch.cat([query, response], 1)
    mask = torch.cat([query_mask, response_mask.long()], 1)
    P, T = query.shape[1], response.shape[1]
    logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits
    return logits[:, P - 1: P - 1 + T].float() / (temperature + 1e-7)


def token_logprobs(logits, tokens):
    """[B, T] log-probability of each token under full-vocabulary softmax of `logits`."""
    from trl.trainer.utils import selective_log_softmax

    return selective_log_softmax(logits, tokens)


def token_entropy(logits):
    """[B, T] entropy (nats) of the full-vocabulary distribution at each position."""
    from trl.trainer.utils import entropy_from_logits

    return entropy_from_logits(logits)


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
