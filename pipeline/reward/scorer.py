"""The reward stage's RM ensemble (`RMEnsemble`), what PPO's scorer (models/scoring.py) wraps:
`load_ensemble(path)(prompts, responses) -> (rewards, confidence)`.

A scorer folder holds `scorer.json` and one or more sequence-classification checkpoints
(`save_pretrained`, each with its tokenizer):

    artifacts/models/rm_strong/scorer.json   {"members": ["member_0", "member_1", "member_2"],
                                              "references": [...], "temperature": T,
                                              "aggregation": "mean", "max_length": L, ...}
    artifacts/models/rm_light/scorer.json    {"members": ["."], ...}

    scorer = load_ensemble("artifacts/models/rm_strong")
    rewards, confidence = scorer(prompts, responses)   # torch.float32 [B] and [B]

- rewards: each member's score minus its reference (the member's mean score of SFT-policy
  responses), so 0 is "as good as the baseline policy"; aggregated over members by
  `aggregation`: "mean" or "min" (worst case, seed 001 §5.1). `scorer(..., aggregation="min")`
  overrides it per call.
- confidence in [0, 1] (seed 000 §3.4): 1 - H2(mean_i sigmoid(reward_i / T)), see
  `rlhf.pipeline.reward.confidence`; `scorer.gate` (0.6, saved in scorer.json as
  `confidence_gate`; 0 = no gate) is the confidence below which PPO marks the score `queued` in
  the `rm_scores` table: the sample belongs in the RM's fine-tune queue. With
  `ppo.rm_gate_mask_on` PPO also keeps the sample out of the update (as the seed asks); with it
  off (the default) PPO still trains on it. Level-2 escalation has its own threshold,
  `ppo.escalate_below` (0 = off by default).
- `scorer.member_rewards(prompts, responses)` [members, B] for diagnostics; `scorer.n_params`.

Texts are rendered with `rlhf.pipeline.models.text.render_sample` (plus EOS in the plain format; a chat
template closes the assistant's turn itself), truncated from the left to
`max_length` tokens (the response end is what matters), exactly as in training (`encode_pairs`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from rlhf.pipeline.reward.confidence import CONFIDENCE_GATE, confidence_from_margins
from rlhf.pipeline.models.text import encode_kwargs, render_sample, templated
from rlhf.pipeline.workers import worker_count

SCORER_FILE = "scorer.json"
AGGREGATIONS = ("mean", "min")
PRECISIONS = ("auto", "fp32", "bf16")
BAR_TEXTS = 1024  # a scoring call of at least this many (text, member) forwards shows a bar
HEAD_MODULES = ("pooler", "classifier", "score")  # kept in float32 under bf16 autocast


def resolve_precision(precision: str, cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """"fp32" or "bf16" for params.yaml `reward.precision`. "auto": bf16 where the CPU has bf16
    instructions (`avx512_bf16` / `amx_bf16` in /proc/cpuinfo; oneDNN then runs bf16 matmuls
    natively: a MiniLM RM training step 1.8x and its scoring 1.8x faster on this machine's
    Sapphire Rapids cores, bench/threads.py), else fp32 (emulated bf16 would be slower)."""
    if precision not in PRECISIONS:
        raise ValueError(f"reward.precision must be one of {PRECISIONS}, got {precision!r}")
    if precision != "auto":
        return precision
    try:
        flags = set(Path(cpuinfo).read_text().split())
    except OSError:  # not Linux: no way to tell cheaply, stay exact
        return "fp32"
    return "bf16" if flags & {"avx512_bf16", "amx_bf16"} else "fp32"


def autocast(precision: str):
    """The context an RM trains and scores in: bf16 autocast on the CPU for "bf16" (weights stay
    float32), nothing for "fp32"."""
    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")


def fp32_head(model):
    """Run the RM's score head (and an encoder's pooler) in float32 even under bf16 autocast, so
    a score keeps float32 resolution (bf16 has 8 bits of mantissa: 0.03 steps near 5, which
    would tie samples the ranking figures must order). Idempotent; returns `model`."""
    import torch

    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] not in HEAD_MODULES or getattr(module, "_rlhf_fp32", False):
            continue
        forward = module.forward

        def fp32_forward(*args, _forward=forward, **kwargs):
            args = [a.float() if torch.is_tensor(a) and a.is_floating_point() else a
                    for a in args]
            with torch.autocast("cpu", enabled=False):
                return _forward(*args, **kwargs)

        module.forward = fp32_forward
        module._rlhf_fp32 = True
    return model


def encode_texts(tokenizer, prompts: Sequence[str], responses: Sequence[str],
                 max_length: int) -> list[list[int]]:
    """Token ids of `render_sample(p, r, tokenizer)` (+ eos in the plain format), left-truncated
    to `max_length`.

    Any tokenizer: a causal LM's gets its EOS appended (the score is read at the last token); an
    encoder's (MiniLM/BERT: no EOS) adds its own [CLS] ... [SEP]. Truncation keeps the leading
    special token (BOS / [CLS], where an encoder's pooler reads) and the end of the response."""
    eos = "" if templated(tokenizer) else tokenizer.eos_token or ""
    texts = [render_sample(p, r, tokenizer) + eos for p, r in zip(prompts, responses)]
    ids = tokenizer(texts, **{"add_special_tokens": True, **encode_kwargs(tokenizer)})["input_ids"]
    special = set(tokenizer.all_special_ids)
    return [[x[k] for k in kept_positions(x, max_length, special)] for x in ids]


def kept_positions(ids: Sequence[int], max_length: int, special: set[int]) -> list[int]:
    """Positions of `ids` that left-truncation to `max_length` keeps: the leading special token
    (BOS / [CLS]) if there is one, then the last tokens."""
    if len(ids) <= max_length:
        return list(range(len(ids)))
    head = 1 if ids[0] in special else 0
    return list(range(head)) + list(range(len(ids) - (max_length - head), len(ids)))


def encode_pairs(tokenizer, pairs: Sequence[dict[str, str]], max_length: int) -> dict[str, list]:
    """{"chosen_ids", "rejected_ids"} in TRL RewardTrainer's format (already tokenized, so it adds
    nothing and filters nothing)."""
    prompts = [p["prompt"] for p in pairs]
    return {
        "chosen_ids": encode_texts(tokenizer, prompts, [p["chosen"] for p in pairs], max_length),
        "rejected_ids": encode_texts(tokenizer, prompts, [p["rejected"] for p in pairs],
                                     max_length),
    }


def pad_rows(rows: Sequence[Sequence[int]], pad: int):
    """([B, W] right-padded token ids, [B, W] attention mask) of `rows`, W the longest."""
    import torch

    width = max(len(r) for r in rows)
    x = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(x)
    for row, r in enumerate(rows):
        x[row, :len(r)] = torch.as_tensor(r)
        mask[row, :len(r)] = 1
    return x, mask


def forward_scores(model, ids: Sequence[Sequence[int]], pad: int, chunk: int = 16,
                   progress=None):
    """Scores [N] of the texts `ids` in their order (with gradients when enabled): the texts go
    through the model in length-sorted chunks of `chunk` (`length_chunks`), each padded to its own
    longest, not the whole batch to its longest (the texts do not interact, so only the padding
    changes). A training batch of 117 texts of 20-128 tokens pads to about 1.1x its tokens this
    way, not 1.8x. `progress(k)` after each chunk of k."""
    chunks = length_chunks(ids, chunk)
    parts = []
    for idx in chunks:
        parts.append(chunk_scores(model, ids, idx, pad))
        if progress is not None:
            progress(len(idx))
    return in_text_order(parts, chunks)


def length_chunks(ids: Sequence[Sequence[int]], chunk: int) -> list[list[int]]:
    """The positions of `ids`, sorted by length, in chunks of `chunk`: what `forward_scores`
    pads and runs together."""
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    return [order[start:start + chunk] for start in range(0, len(order), chunk)]


def chunk_scores(model, ids: Sequence[Sequence[int]], idx: list[int], pad: int):
    """Scores [len(idx)] of the texts `ids[i]`, i in `idx`, padded to their longest: one forward
    of `model` on its device (params.yaml `compute`: the RM's GPU, else the CPU)."""
    x, mask = pad_rows([ids[i] for i in idx], pad)
    if model.device.type != "cpu":
        x, mask = x.to(model.device), mask.to(model.device)
    return model(input_ids=x, attention_mask=mask).logits[:, 0].float()


def in_text_order(parts: list, chunks: list[list[int]]):
    """[N]: the chunks' scores `parts` put back at their texts' positions."""
    import torch

    where = torch.as_tensor([i for idx in chunks for i in idx])
    inverse = torch.empty(len(where), dtype=torch.long)
    inverse[where] = torch.arange(len(where))
    return torch.cat(parts)[inverse]


def batch_scores(model, tokenizer, ids: list[list[int]], batch_size: int = 64,
                 precision: str = "fp32", progress=None):
    """Raw scalar scores [N] of pre-tokenized texts, no gradients, in length-sorted batches of
    `batch_size` (`forward_scores`), in `precision` ("fp32" or "bf16": see `autocast`);
    `progress(k)` after each batch of k."""
    import torch

    if not ids:
        return torch.empty(0)
    if precision == "bf16":
        fp32_head(model)
    with torch.no_grad(), autocast(precision):
        scores = forward_scores(model, ids, tokenizer.pad_token_id, batch_size, progress)
    return scores if scores.device.type == "cpu" else scores.cpu()


def member_threads(models: Sequence) -> int:
    """Threads that score an ensemble's members at once (`RMEnsemble`: a (member, chunk)
    forward per job): `worker_count(len(models))` (pipeline/workers.py: one per core under
    `make run`; 1 in the test suite and inside a stage's job processes, whose cores the other
    jobs hold) where torch runs one intra-op thread on the CPU, else 1. At one intra-op thread an
    op runs on the thread that calls it and its kernels release the GIL, so the forwards share
    the cores with no model copy, each the same op on the same chunk as inline: the same bits
    (tests/test_reward_ensemble.py). With more torch threads each op already takes the cores;
    on a GPU the members queue on one stream anyway."""
    import torch

    if len(models) < 2 or torch.get_num_threads() != 1 or models[0].device.type != "cpu":
        return 1
    return worker_count(len(models))


class RMEnsemble:
    """An ensemble (or a single) of sequence-classification RMs with references and calibration
    (models/scoring.py's `Scorer` protocol is what PPO reads rewards from; this is the reward
    stage's model behind it)."""

    def __init__(self, models: list, tokenizer, references: Sequence[float], temperature: float,
                 aggregation: str = "mean", max_length: int = 256, batch_size: int = 64,
                 gate: float = CONFIDENCE_GATE, meta: dict[str, Any] | None = None,
                 precision: str = "fp32"):
        if precision not in ("fp32", "bf16"):
            raise ValueError(f"a scorer's precision is 'fp32' or 'bf16', got {precision!r}")
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
        if len(models) != len(references):
            raise ValueError("one reference score per member")
        self.models = models
        self.tokenizer = tokenizer
        self.references = [float(r) for r in references]
        self.temperature = float(temperature)
        self.aggregation = aggregation
        self.max_length = max_length
        self.batch_size = batch_size
        self.gate = gate
        self.meta = meta or {}
        self.precision = precision  # the one the RM trained and was calibrated in (scorer.json)
        # {(prompt, response): raw member scores [members]} when set to a dict: a stage that scores
        # the same texts several times (reports, calibration) runs each model once per text
        self.memo: dict[tuple[str, str], Any] | None = None

    @property
    def n_params(self) -> int:
        return int(sum(p.numel() for m in self.models for p in m.parameters()))

    def member_rewards(self, prompts: Sequence[str], responses: Sequence[str]):
        """[members, B]: each member's score minus its reference."""
        import torch

        if len(prompts) != len(responses):
            raise ValueError("prompts and responses must have the same length")
        if not prompts:
            return torch.zeros((len(self.models), 0))
        refs = torch.tensor(self.references, dtype=torch.float32)[:, None]
        if self.memo is None:
            return self._raw(prompts, responses) - refs
        keys = list(zip(prompts, responses))
        todo = sorted(set(keys) - self.memo.keys())
        if todo:
            raw = self._raw([k[0] for k in todo], [k[1] for k in todo])
            self.memo.update(zip(todo, raw.T))
        return torch.stack([self.memo[k] for k in keys], dim=1) - refs

    def _raw(self, prompts: Sequence[str], responses: Sequence[str]):
        import torch

        from rlhf.pipeline.progress import bar

        ids = encode_texts(self.tokenizer, prompts, responses, self.max_length)
        n = len(ids) * len(self.models)
        label = f"scoring {len(ids):,} texts x {len(self.models)} RM" + "s" * (len(self.models) > 1)
        with bar(label, n, "texts") if n >= BAR_TEXTS else nullcontext(None) as advance:
            threads = member_threads(self.models)
            if threads > 1:
                return self._raw_in_threads(ids, threads, advance)
            return torch.stack([batch_scores(m, self.tokenizer, ids, self.batch_size,
                                             self.precision, advance) for m in self.models])

    def _raw_in_threads(self, ids: list[list[int]], threads: int, advance=None):
        """[members, N]: `_raw`'s inline scores, each (member, chunk) forward a job for
        `threads` threads (`member_threads`): the same chunks (`length_chunks`), the same ops,
        in any order; (member, chunk) jobs, not members, so 3 members keep 2 cores busy to the
        end."""
        import torch

        chunks = length_chunks(ids, self.batch_size)
        if self.precision == "bf16":  # patched once, before the threads share the models
            for model in self.models:
                fp32_head(model)
        lock = threading.Lock()  # the bar's count is no atomic update

        def job(model, idx: list[int]):
            # grad mode and autocast are per thread: each job sets its own
            with torch.no_grad(), autocast(self.precision):
                scores = chunk_scores(model, ids, idx, self.tokenizer.pad_token_id)
            if advance is not None:
                with lock:
                    advance(len(idx))
            return scores

        pool = ThreadPoolExecutor(threads, thread_name_prefix="rm-score")
        try:
            jobs = [[pool.submit(job, m, idx) for idx in chunks] for m in self.models]
            return torch.stack([in_text_order([j.result() for j in member], chunks)
                                for member in jobs])
        finally:  # a failed job (or Ctrl-C) drops the jobs not yet started
            pool.shutdown(wait=True, cancel_futures=True)

    def aggregate(self, member_rewards, aggregation: str | None = None):
        """(rewards [B], confidence [B]) from member rewards [members, B]."""
        how = aggregation or self.aggregation
        if how not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {how!r}")
        rewards = member_rewards.mean(0) if how == "mean" else member_rewards.min(0).values
        return rewards, confidence_from_margins(member_rewards, self.temperature)

    def __call__(self, prompts: Sequence[str], responses: Sequence[str],
                 aggregation: str | None = None):
        return self.aggregate(self.member_rewards(prompts, responses), aggregation)


def save_scorer(path: str | Path, members: Sequence[str], references: Sequence[float],
                temperature: float, aggregation: str, max_length: int,
                extra: dict[str, Any] | None = None, precision: str = "fp32",
                gate: float = CONFIDENCE_GATE) -> Path:
    """Write `scorer.json` next to the member checkpoints (paths relative to `path`); `gate`:
    the confidence below which PPO queues a score (the reward stage's `confidence_gate`)."""
    path = Path(path)
    meta = {"members": list(members), "references": [float(r) for r in references],
            "temperature": float(temperature), "aggregation": aggregation,
            "max_length": int(max_length), "confidence_gate": float(gate),
            "precision": precision, **(extra or {})}
    (path / SCORER_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return path / SCORER_FILE


def load_rm(path: str | Path, compute=None):
    """A sequence-classification RM checkpoint, in eval mode, in `compute`'s device, dtype and
    attention (pipeline/models/compute.py; None: float32 on the CPU)."""
    from transformers import AutoModelForSequenceClassification

    from rlhf.pipeline.models.compute import load_pretrained

    model = load_pretrained(AutoModelForSequenceClassification, path, compute, "reward model")
    model.eval()
    return model


def load_ensemble(path: str | Path, aggregation: str | None = None,
                  batch_size: int = 64, compute=None) -> RMEnsemble:
    """The scorer saved in folder `path` (see the module docstring); its members loaded in
    `compute` (`load_rm`)."""
    from rlhf.pipeline.models.policy import load_tokenizer

    from rlhf.pipeline.models.model_folders import check_scorer

    path = check_scorer(path)  # missing, truncated or wrong kind: a ModelFolderError naming it
    meta = json.loads((path / SCORER_FILE).read_text())
    models = [load_rm(path / m, compute) for m in meta["members"]]
    tokenizer = load_tokenizer(path / meta["members"][0])
    return RMEnsemble(models, tokenizer, meta["references"], meta["temperature"],
                      aggregation or meta["aggregation"], meta["max_length"], batch_size,
                      meta.get("confidence_gate", CONFIDENCE_GATE), meta,
                      meta.get("precision", "fp32"))
