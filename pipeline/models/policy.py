"""Load a causal-LM policy and sample responses from it, with their token log-probabilities.

Sampling itself is pipeline/decode/ (prompt rendering, left padding, the cut at eos),
shared with the PPO trainer and `eval`. Used by the stages that need fresh policy samples: `preferences` (k responses per prompt for
the annotators), `reward` (rollouts for the light RM's distillation and the RM-vs-gold check)
and `difficulty` (one response per pool prompt, with the spread of its token log-probs).
Sampling is reproducible: each generation batch reseeds torch with (seed, batch index).

    python -c "from rlhf.pipeline.models.policy import load_policy, sample; \
m, t = load_policy('artifacts/models/sft'); print(sample(m, t, ['Name a fruit.'], n=2)[0])"
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rlhf.pipeline.models.text import response_of


@dataclass(frozen=True)
class Sample:
    """One sampled response to prompt number `prompt_index`."""

    prompt_index: int
    response: str
    n_tokens: int  # generated tokens, EOS included when the policy stopped by itself
    # the log-prob of each generated token under the distribution it was sampled at: the
    # full-vocabulary softmax of logits / temperature (before top-p; greedy: temperature 1),
    # the PPO trainer's old-log-prob definition (decode/logprobs.py)
    logprobs: tuple[float, ...]

    @property
    def logprob_std(self) -> float:
        n = len(self.logprobs)
        if n < 2:
            return 0.0
        mean = sum(self.logprobs) / n
        return math.sqrt(sum((x - mean) ** 2 for x in self.logprobs) / (n - 1))


def set_threads() -> int:
    """Torch intra-op threads for a stage: $RLHF_TORCH_THREADS, default 0 = torch's own (all
    cores).

    `dvc repro` runs one stage at a time, so a stage has the cores to itself: on this machine's
    idle 2 cores two threads train a MiniLM RM 2.1x (a step of 64 texts 7.75 -> 3.67 s), score
    with it 2.0x, train the SFT policy 1.6x and sample it 1.3x faster than one
    (bench/threads.py). Where processes share the cores (bench/economy/'s parallel jobs,
    the test suite), two OpenMP threads that wait for each other are several times slower than
    one (a tiny-Llama training step took 9.3 s with 2 threads and 1.15 s with 1 while other
    processes kept both cores busy): those set RLHF_TORCH_THREADS=1.
    """
    import os

    import torch

    n = int(os.environ.get("RLHF_TORCH_THREADS", "0") or 0)
    if n > 0:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def quiet_hf() -> None:
    """Silence the libraries' own progress bars and load reports (the stages print their own);
    also sets the torch thread count (`set_threads`)."""
    import datasets
    import transformers

    set_threads()
    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()


def quiet_trainer(trainer, description: str = "") -> None:
    """Drop the callback that prints every log dict when tqdm is disabled, and tqdm's bar; with
    `description`, show the optimiser steps as our own bar (pipeline/progress.py) instead."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    if description:
        from rlhf.pipeline.progress import trainer_callback

        trainer.add_callback(trainer_callback(description))


def load_tokenizer(path: str | Path):
    """A tokenizer for left-padded generation (pad falls back to EOS when it has none)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_policy(path: str | Path, compute=None):
    """(model in eval mode, tokenizer) from a `save_pretrained` folder, in the device, dtype and
    attention of `compute` (a resolved params.yaml `compute`, pipeline/models/compute.py; None: float32
    on the CPU); a folder that is missing, truncated or not a causal LM is a `ModelFolderError`
    naming it."""
    from transformers import AutoModelForCausalLM

    from rlhf.pipeline.models.compute import load_pretrained
    from rlhf.pipeline.models.model_folders import check_policy

    path = check_policy(path)
    model = load_pretrained(AutoModelForCausalLM, path, compute, "policy")
    model.eval()
    return model, load_tokenizer(path)


def engine_on(engine: str, model) -> str:
    """`engine` as params.yaml names it (`auto` included) resolved for the device `model` is on
    (decode.resolve_engine): the engine a stage samples with, and records."""
    from rlhf.pipeline.decode import resolve_engine

    return resolve_engine(engine, next(model.parameters()).device)


def sample(model, tokenizer, prompts: Sequence[str], n: int = 1, max_new_tokens: int = 48,
           temperature: float = 1.0, top_p: float = 1.0, seed: int = 0, batch_size: int = 64,
           progress=None, engine: str = "hf", cost: dict | None = None,
           batches: Sequence[int] | None = None) -> list[list[Sample]]:
    """`n` sampled responses per prompt (temperature 0: greedy), as a list per prompt.

    Prompts are rendered with `format_prompt`; `progress(k)` is called after each batch of k
    prompts (for a progress bar). `engine` (decode.get_generator; "auto": `engine_on`) samples
    them; `n` > 1 repeats each prompt's row n times (what model.generate's
    num_return_sequences does), and greedy decodes once and copies. `cost`: when given, the
    engine's counted `forwards` and `token_forwards` of every batch are added to it.
    `batches`: draw only these batches (of `batch_size // n` prompts, in order; the others'
    prompts get []): a process's share of one sampling run (pipeline/workers.py), each batch
    seeded by its index as in the whole run, so the shares together are its samples.
    """
    import torch

    from rlhf.pipeline.decode import Sampling, cut_at_eos, encode_prompts, get_generator
    from rlhf.pipeline.progress import advance_or_bar

    out: list[list[Sample]] = [[] for _ in prompts]
    if not prompts:
        return out
    gen_engine = get_generator(engine_on(engine, model))
    pad_side = tokenizer.padding_side
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id
    settings = Sampling(temperature, top_p, max_new_tokens)
    reps = 1 if settings.greedy else n
    per_batch = max(1, batch_size // max(1, n))
    starts = range(0, len(prompts), per_batch)
    drawn = range(len(starts)) if batches is None else sorted(set(batches))
    try:
        with advance_or_bar(progress, f"sampling {n} per prompt",
                            sum(len(prompts[starts[b]:starts[b] + per_batch]) for b in drawn),
                            "prompts") as advance:
            for b in drawn:
                start = starts[b]
                chunk = list(prompts[start:start + per_batch])
                enc = encode_prompts(tokenizer, chunk)
                enc = {k: v.repeat_interleave(reps, 0) for k, v in enc.items()}
                if model.device.type != "cpu":  # params.yaml `compute`: the model's GPU
                    enc = {k: v.to(model.device) for k, v in enc.items()}
                torch.manual_seed(seed * 1_000_003 + b)
                with torch.no_grad():
                    made = gen_engine.generate(model, tokenizer, enc, settings,
                                               keep_logits=not gen_engine.has_logprobs)
                if cost is not None:
                    cost["forwards"] = cost.get("forwards", 0) + made.forwards
                    cost["token_forwards"] = cost.get("token_forwards", 0) + made.token_forwards
                new = made.tokens  # [rows, T_new]
                logp = made.logprobs  # [rows, T_new] log-probs under logits / temperature
                if logp is None:
                    logp = torch.log_softmax(made.logits, -1).gather(
                        -1, new.unsqueeze(-1)).squeeze(-1)
                for row in range(new.shape[0]):
                    ids = cut_at_eos(new[row].tolist(), eos, pad)
                    text = tokenizer.decode(ids, skip_special_tokens=True)
                    s = Sample(prompt_index=start + row // reps, response=response_of(text),
                               n_tokens=len(ids),
                               logprobs=tuple(float(x) for x in logp[row, :len(ids)]))
                    out[s.prompt_index].append(s)
                if settings.greedy and n > 1:  # greedy decoding is deterministic: n equal copies
                    for i in range(start, start + len(chunk)):
                        out[i] = out[i] * n
                advance(len(chunk))
    finally:
        tokenizer.padding_side = pad_side
    return out
