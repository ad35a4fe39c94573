"""The native rollout engine: our own decode loop over an HF causal LM and its KV cache, in
which a row that stops **leaves the batch at once**.

Same inputs and outputs as the `hf` engine (`model.generate`, pipeline/decode/hf.py): left-padded
prompts whose position ids count real tokens only, `Sampling` (temperature, top-p, max new tokens),
the per-sequence logits processors and stopping criteria, `suppress_pad`, the timeout (a
`MaxTimeCriteria` among the criteria). The order the scores pass through is model.generate's: pad
suppressed, then the caller's processors, then temperature, then top-p.

What differs is the cost. `model.generate` keeps every row until the batch's last one ends (a
finished row is fed pad tokens); here a row that emitted eos or was stopped by a criterion has its
cache rows dropped (`DynamicCache.batch_select_indices`) before the next forward, so the next
forward pushes only the live rows. After the prefill, the steps run through `FastDecoder`
(pipeline/decode/llama_step.py) where it reproduces the model's forward bit for bit (Llama, Qwen2:
the same logits without transformers' per-call overhead, which sets a small model's decode time);
any other model is called each step. The processors and criteria still see the full batch
(`input_ids` [B, P + t], scores [B, V]: a finished row's scores are zeros and its appended tokens
pad, as model.generate would give them), so a hook that keeps per-row state by batch index works
unchanged.

The engine also returns, at every generated position, the log-probability of the sampled token
under the distribution it was drawn from (after processors, temperature and top-p:
`sampled_logprobs`) and under the trainer's old-log-prob definition (full-vocabulary softmax of
the raw logits / temperature: `logprobs`, with `entropy` and optionally those `logits`), so the
PPO trainer can skip its old-log-prob forward (pipeline/ppo/generate.py).

    python -c "from rlhf.pipeline.decode import native_generate; help(native_generate)"
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from rlhf.pipeline.decode.llama_step import FastDecoder
from rlhf.pipeline.decode.protocol import Generated, Generator
from rlhf.pipeline.decode.sampling import Sampling, top_p_sample
from rlhf.pipeline.decode.tokens import position_ids


def prefill(model, ids, mask):
    """The prompt forward of a decode loop over left-padded `ids` / `mask` ([B, P]): (the
    filled `DynamicCache`, the [B, V] logits of the next token). The LM head runs on the last
    position only where the model supports it (`logits_to_keep`, as model.generate asks)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    keep1 = {"logits_to_keep": 1} if getattr(model, "_supports_logits_to_keep",
                                             lambda: False)() else {}
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask),
                cache=cache, use_cache=True, **keep1)
    return cache, out.logits[:, -1]


@torch.no_grad()
def native_generate(model, tokenizer, enc, sampling: Sampling, *,
                    logits_processors: Sequence = (), stopping_criteria: Sequence = (),
                    suppress_pad: bool = True, keep_logits: bool = False,
                    fast: bool = True) -> Generated:
    """Sample (or greedy-decode) one continuation per left-padded row of `enc`.

    `keep_logits`: also return the [B, T, V] raw logits / temperature of every generated
    position (what a full-vocabulary KL needs; memory B x T x V floats). `fast`: decode through
    `FastDecoder` where it reproduces the model's forward bit for bit (Llama, Qwen2); False
    calls the model every step (the same logits, slower)."""
    from transformers import TemperatureLogitsWarper

    ids, mask = enc["input_ids"], enc["attention_mask"]
    B, P = ids.shape
    dev = ids.device
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    fill = pad if pad is not None else (eos if eos is not None else 0)
    temp = sampling.temperature if not sampling.greedy else 1.0
    warpers = [] if sampling.greedy else [TemperatureLogitsWarper(sampling.temperature)]
    suppress = suppress_pad and pad is not None and pad != eos

    cache, last = prefill(model, ids, mask)
    decoder = FastDecoder.attach(model, cache, sampling.max_new_tokens) if fast else None
    if decoder is not None:
        cache = None  # copied into the decoder's preallocated keys and values
    forwards, token_forwards, batch_sizes = 1, B * P, [B]
    live = torch.arange(B, device=dev)          # original row of each cache row
    live_mask = mask.clone()                    # [live, P + t] attention mask of the cache rows
    next_pos = mask.sum(1)                      # [B] position of each row's next token
    finished = torch.zeros(B, dtype=torch.bool, device=dev)
    seq = ids
    lp_sampled, lp_full, ent, kept_logits = [], [], [], []
    for t in range(sampling.max_new_tokens):
        raw = last.float()                               # [live, V]
        scores = torch.zeros(B, raw.shape[-1], device=dev)
        scores[live] = raw
        if suppress:
            scores[:, pad] = -float("inf")
        for p in logits_processors:
            scores = p(seq, scores)
        # temperature and top-p work row by row: on the live rows only (a finished row's scores
        # stay as the processors left them); top-p and the draw order only the nucleus' edge
        s_live = scores[live]
        for w in warpers:
            s_live = w(seq[live], s_live)
        if sampling.greedy:
            tok_live = s_live.argmax(-1)
        else:
            s_live, tok_live = top_p_sample(s_live, sampling.top_p)
        scores[live] = s_live
        nxt = torch.full((B,), fill, dtype=torch.long, device=dev)
        nxt[live] = tok_live
        seq = torch.cat([seq, nxt[:, None]], 1)
        # per-token log-probs of the live rows (finished rows: 0, masked downstream)
        scaled = raw / (temp + 1e-7)
        logp_full = torch.log_softmax(scaled, -1)
        row = torch.zeros(B, device=dev)
        row[live] = torch.log_softmax(s_live, -1).gather(1, tok_live[:, None]).squeeze(1)
        lp_sampled.append(row)
        row = torch.zeros(B, device=dev)
        row[live] = logp_full.gather(1, tok_live[:, None]).squeeze(1)
        lp_full.append(row)
        row = torch.zeros(B, device=dev)
        row[live] = -(logp_full.exp() * logp_full).nansum(-1)
        ent.append(row)
        if keep_logits:
            full = torch.zeros(B, raw.shape[-1], device=dev)
            full[live] = scaled
            kept_logits.append(full)
        # stops: eos, then every criterion (a criterion may return one bool or one per row)
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        if eos is not None:
            done[live] = tok_live == eos
        for c in stopping_criteria:
            done |= torch.as_tensor(c(seq, scores), device=dev).expand(B).bool()
        finished |= done
        if bool(finished.all()) or t == sampling.max_new_tokens - 1:
            break
        keep = (~finished[live]).nonzero().squeeze(1)
        if len(keep) < len(live):                   # the stopped rows leave the batch
            (decoder or cache).batch_select_indices(keep)
            live, live_mask = live[keep], live_mask[keep]
        live_mask = torch.cat([live_mask, torch.ones_like(live_mask[:, :1])], 1)
        if decoder is not None:
            last = decoder.step(seq[live, -1:], next_pos[live], live_mask)
        else:
            last = model(input_ids=seq[live, -1:], attention_mask=live_mask,
                         position_ids=next_pos[live][:, None], cache=cache,
                         use_cache=True).logits[:, -1]
        next_pos[live] += 1
        forwards += 1
        token_forwards += len(live)
        batch_sizes.append(len(live))
    return Generated(sequences=seq, prompt_len=P, forwards=forwards,
                     token_forwards=token_forwards, batch_sizes=batch_sizes,
                     sampled_logprobs=torch.stack(lp_sampled, 1),
                     logprobs=torch.stack(lp_full, 1), entropy=torch.stack(ent, 1),
                     logits=torch.stack(kept_logits, 1) if keep_logits else None)


class NativeGenerator(Generator):
    """Our decode loop (`native_generate`): stopped rows leave the batch; log-probs returned."""

    name = "native"
    has_logprobs = True

    def generate(self, model, tokenizer, enc, sampling, *, logits_processors=(),
                 stopping_criteria=(), suppress_pad=True, keep_logits=False) -> Generated:
        return native_generate(model, tokenizer, enc, sampling,
                               logits_processors=logits_processors,
                               stopping_criteria=stopping_criteria, suppress_pad=suppress_pad,
                               keep_logits=keep_logits)
