"""The static-shape and library variants of bench/engine.py: the static engine (pipeline/decode/static.py),
model.generate with transformers' static cache (eager, or compiled on CUDA), and transformers'
continuous batching (`generate_batch`, paged attention), each returned as a `Generated`; and
the per-variant step figures (ms per decode step, tokens/s, host syncs per step, shapes,
captures, peak memory).

    RLHF_TORCH_THREADS=1 .venv/bin/python bench/engine.py --variants hf native static hf-static \
        --drafts --batches 16 --repeats 2
"""

from __future__ import annotations

import contextlib
import warnings

import torch
from rlhf.pipeline.decode import Generated, StaticGenerator

STATIC = StaticGenerator()          # one instance: its `last_stats` are read after each run
VARIANTS = ("static", "hf-static", "hf-static-compile", "hf-batch")


def run_variant(variant: str, model, tok, enc, sampling) -> Generated:
    if variant == "static":
        return STATIC.generate(model, tok, enc, sampling)
    if variant in ("hf-static", "hf-static-compile"):
        return _hf_static(model, tok, enc, sampling, variant.endswith("compile"))
    if variant == "hf-batch":
        return _hf_batch(model, tok, enc, sampling)
    raise ValueError(f"unknown variant {variant!r}")


def _hf_static(model, tok, enc, sampling, compiled: bool) -> Generated:
    """model.generate as pipeline/decode/hf.generate calls it, with cache_implementation
    "static" (and its compile config: transformers compiles the decode step, CUDA graphs)."""
    from transformers import CompileConfig

    pad, eos = tok.pad_token_id, tok.eos_token_id
    greedy = sampling.greedy
    extra = {"compile_config": CompileConfig(fullgraph=True, mode="reduce-overhead")} \
        if compiled else {"disable_compile": True}
    out = model.generate(
        **enc, do_sample=not greedy, temperature=None if greedy else sampling.temperature,
        top_p=None if greedy else sampling.top_p, top_k=None if greedy else 0,
        max_new_tokens=sampling.max_new_tokens, pad_token_id=pad, eos_token_id=eos,
        suppress_tokens=[pad] if pad is not None and pad != eos else None,
        cache_implementation="static", return_dict_in_generate=True, **extra)
    seq, P = out.sequences, enc["input_ids"].shape[1]
    steps = seq.shape[1] - P
    return Generated(sequences=seq, prompt_len=P, forwards=steps,
                     token_forwards=seq.shape[0] * (P + max(steps - 1, 0)),
                     batch_sizes=[seq.shape[0]] * steps)


def _hf_batch(model, tok, enc, sampling) -> Generated:
    """transformers' continuous batching over the unpadded prompts: tokens and its per-token
    log-probs (of the sampled distribution), back as a right-padded batch."""
    from transformers import GenerationConfig

    ids, mask = enc["input_ids"], enc["attention_mask"]
    prompts = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    greedy = sampling.greedy
    cfg = GenerationConfig(max_new_tokens=sampling.max_new_tokens, do_sample=not greedy,
                           temperature=None if greedy else sampling.temperature,
                           top_p=None if greedy else sampling.top_p, top_k=None if greedy else 0,
                           eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    done = model.generate_batch(inputs=prompts, generation_config=cfg, progress_bar=False)
    outs = sorted(done.values(), key=lambda o: int(str(o.request_id).rsplit("_", 1)[-1]))
    T = max((len(o.generated_tokens) for o in outs), default=1) or 1
    fill = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    gen = torch.full((len(outs), T), fill, dtype=torch.long)
    for i, o in enumerate(outs):
        gen[i, : len(o.generated_tokens)] = torch.tensor(o.generated_tokens)
    seq = torch.cat([ids, gen.to(ids.device)], 1)
    n = sum(len(o.generated_tokens) for o in outs)
    return Generated(sequences=seq, prompt_len=ids.shape[1], forwards=T,
                     token_forwards=int(mask.sum()) + n, batch_sizes=[len(outs)] * T)


@contextlib.contextmanager
def count_syncs(device):
    """Counts the host syncs inside the block on CUDA (torch's sync debug mode warns at each
    synchronizing call); on a CPU there are none to count (None), except the static engine's
    own reads of device state, which it counts itself."""
    box = {"syncs": None}
    if device.type != "cuda":
        yield box
        return
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield box
        finally:
            torch.cuda.set_sync_debug_mode(0)
    box["syncs"] = sum("synchroniz" in str(w.message) for w in seen)


def step_figures(variant: str, made: Generated, seconds: float, tokens: int, syncs) -> dict:
    """Per run: ms per decode step (the generation's seconds, prefill included, over its decode
    steps), generated tokens/s, host syncs per step, the static engine's shapes and captures."""
    steps = max(made.forwards - 1, 1)
    out = {"ms_per_step": 1000 * seconds / steps, "tokens_per_s": tokens / max(seconds, 1e-9),
           "syncs_per_step": None if syncs is None else syncs / steps,
           "shapes": None, "captures": None}
    if variant == "static" and STATIC.last_stats is not None:
        st = STATIC.last_stats
        out.update(shapes=len(set(st.shapes)), captures=st.captures,
                   max_wait=st.max_wait, dead_slot_steps=st.dead_slot_steps)
        if st.capture_error:
            print(f"static: no CUDA graph ({st.capture_error}); the step ran eager")
        if syncs is None:
            out["syncs_per_step"] = st.host_syncs / max(st.steps, 1)
    return out
