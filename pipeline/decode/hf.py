"""The `hf` engine: `model.generate` with our sampling settings (left-padded prompts, the
caller's logits processors and stopping criteria, pad never sampled), in which every row stays in
the batch until the batch's last row ends.

    python -c "from rlhf.pipeline.decode import HFGenerator; print(HFGenerator.name)"
"""

from __future__ import annotations

from collections.abc import Sequence

from rlhf.pipeline.decode.protocol import Generated, Generator
from rlhf.pipeline.decode.sampling import Sampling


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


class HFGenerator(Generator):
    """`model.generate`: every row stays in the batch until the batch's last row ends."""

    name = "hf"

    def generate(self, model, tokenizer, enc, sampling, *, logits_processors=(),
                 stopping_criteria=(), suppress_pad=True, keep_logits=False) -> Generated:
        import torch

        made = generate(model, tokenizer, enc, sampling, logits_processors=logits_processors,
                        stopping_criteria=stopping_criteria, suppress_pad=suppress_pad,
                        output_logits=keep_logits)
        out = made.sequences
        P = enc["input_ids"].shape[1]
        steps = out.shape[1] - P
        logits = None
        if keep_logits:  # model.generate's raw logits (before every processor) / temperature
            temp = 1.0 if sampling.greedy else sampling.temperature
            logits = torch.stack(made.logits, 1).float() / (temp + 1e-7)
        return Generated(sequences=out, prompt_len=P, forwards=steps,
                         token_forwards=out.shape[0] * (P + max(steps - 1, 0)),
                         batch_sizes=[out.shape[0]] * steps, logits=logits)
