"""The distilled light RM (seed 001 §4.2): a smaller model fitted to the strong RM's outputs.

The strong RM (the ensemble) labels many policy rollouts (k responses per prompt); the light RM,
a shallower sequence classifier (`init: strong`, the embedded default: the first 2 of the
strong member's 6 MiniLM layers with its head; `init: sft`: the SFT policy's first layers),
learns to reproduce the strong RM's output distribution:
per prompt, the KL divergence from the strong RM's softmax over the prompt's k responses to the
light RM's (the Plackett-Luce / Bradley-Terry distribution the scores define, so the light RM
gets the strong RM's orderings and their certainty), plus a mean-squared error on the centred
score itself (so the scale, the reference and the confidence carry over to PPO).

    python -c "from rlhf.pipeline.reward.distill import distill_loss; help(distill_loss)"
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LightConfig:
    """params.yaml `reward.light`: the light RM's shape and its distillation."""

    init: str = "sft"  # "sft": the first `num_layers` layers of the SFT policy; "strong": those
    # of the strong RM's first member (its backbone, tokenizer and head; lr ~1e-4 for MiniLM);
    # "scratch": a small fresh Llama
    num_layers: int = 1
    hidden_size: int = 64  # used with init "scratch" only (sft keeps the policy's width)
    intermediate_size: int = 128  # idem
    num_heads: int = 2  # idem
    epochs: int = 6
    learning_rate: float = 2e-3
    groups_per_batch: int = 16  # prompts per step, each with all its responses
    listwise_weight: float = 1.0  # KL between the per-prompt softmax distributions
    mse_weight: float = 1.0  # squared error on the centred score
    distill_temperature: float = 1.0

    def __post_init__(self):
        if self.init not in ("sft", "strong", "scratch"):
            raise ValueError("light.init must be 'sft', 'strong' or 'scratch'")
        if self.num_layers < 1 or self.epochs < 1 or self.groups_per_batch < 1:
            raise ValueError("num_layers, epochs and groups_per_batch must be >= 1")


def build_light(cfg: LightConfig, sft_path: str, seed: int = 0, strong_member: str | None = None,
                compute=None):
    """A light sequence classifier: a truncated copy of the SFT policy (or of the strong RM's
    member `strong_member`, init "strong"), or a small fresh one; in `compute`'s device, dtype
    and attention (pipeline/models/compute.py; None: float32 on the CPU)."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from rlhf.pipeline.models.compute import for_training, model_kwargs

    torch.manual_seed(seed)
    if cfg.init == "strong":
        if strong_member is None:
            raise ValueError("light.init 'strong' needs the strong RM's member checkpoint")
        sft_path = strong_member
    config = AutoConfig.from_pretrained(sft_path)
    config.num_labels = 1
    if cfg.init in ("sft", "strong"):
        config.num_hidden_layers = min(cfg.num_layers, config.num_hidden_layers)
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[: config.num_hidden_layers]
        from trl.trainer.reward_trainer import suppress_seqcls_warning

        with suppress_seqcls_warning():
            # layers past num_hidden_layers are simply not loaded
            return for_training(AutoModelForSequenceClassification.from_pretrained(
                sft_path, config=config, **model_kwargs(compute)), compute)
    config.num_hidden_layers = cfg.num_layers
    config.hidden_size = cfg.hidden_size
    config.intermediate_size = cfg.intermediate_size
    config.num_attention_heads = cfg.num_heads
    config.num_key_value_heads = cfg.num_heads
    config.head_dim = cfg.hidden_size // cfg.num_heads
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:1] * cfg.num_layers
    return for_training(AutoModelForSequenceClassification.from_config(
        config, **model_kwargs(compute)), compute)


def distill_loss(student, teacher, groups: Sequence[Sequence[int]], listwise_weight: float = 1.0,
                 mse_weight: float = 1.0, temperature: float = 1.0):
    """Listwise KL(teacher || student) per group of indices into the score vectors + MSE.

    `student`, `teacher`: [N] scores; `groups`: lists of indices (one list per prompt); groups of
    one response add only the MSE term.
    """
    import torch

    kl = student.new_zeros(())
    n_lists = 0
    for g in groups:
        if len(g) < 2:
            continue
        idx = torch.as_tensor(list(g))
        t = torch.log_softmax(teacher[idx] / temperature, dim=0)
        s = torch.log_softmax(student[idx] / temperature, dim=0)
        kl = kl + torch.sum(t.exp() * (t - s))
        n_lists += 1
    kl = kl / max(1, n_lists)
    mse = torch.mean((student - teacher) ** 2)
    return listwise_weight * kl + mse_weight * mse, {"kl": kl.item(), "mse": mse.item()}


def distill(student, tokenizer, ids: list[list[int]], targets, groups: list[list[int]],
            cfg: LightConfig, seed: int = 0, progress=None, precision: str = "fp32"):
    """Fit `student` to `targets` [N] (the strong RM's centred rewards of the texts `ids`), in
    `precision` (scorer.autocast: "bf16" keeps the weights and the head float32)."""
    import random

    import torch

    from rlhf.pipeline.reward.scorer import autocast, forward_scores, fp32_head
    from rlhf.pipeline.progress import advance_or_bar

    torch.manual_seed(seed)
    rng = random.Random(seed)
    targets = torch.as_tensor(targets, dtype=torch.float32)
    pad = tokenizer.pad_token_id
    student.config.pad_token_id = pad
    opt = torch.optim.AdamW(student.parameters(), lr=cfg.learning_rate, weight_decay=0.0)
    n_steps = cfg.epochs * max(1, -(-len(groups) // cfg.groups_per_batch))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.learning_rate,
                                                total_steps=n_steps, pct_start=0.1)
    history = []
    if precision == "bf16":
        fp32_head(student)
    student.train()
    with advance_or_bar(progress, "distilling the light RM", n_steps, "steps") as advance:
        for _ in range(cfg.epochs):
            order = list(range(len(groups)))
            rng.shuffle(order)
            for start in range(0, len(order), cfg.groups_per_batch):
                batch_groups = [groups[g] for g in order[start:start + cfg.groups_per_batch]]
                flat = [i for g in batch_groups for i in g]
                local, pos = [], 0
                for g in batch_groups:
                    local.append(list(range(pos, pos + len(g))))
                    pos += len(g)
                with autocast(precision):
                    scores = forward_scores(student, [ids[i] for i in flat], pad)
                    loss, parts = distill_loss(scores, targets[flat], local, cfg.listwise_weight,
                                               cfg.mse_weight, cfg.distill_temperature)
                    opt.zero_grad()
                    loss.backward()
                torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
                opt.step()
                sched.step()
                history.append({"loss": loss.item(), **parts})
                advance(1)
    student.eval()
    return student, history
