"""The distilled light RM (seed 001 §4.2): a smaller model fitted to the strong RM's outputs.

The strong RM (the ensemble) labels many policy rollouts (k responses per prompt); the light RM,
a shallower sequence classifier (`init: strong`, the embedded default: the first 2 of the
strong member's 6 MiniLM layers with its head; `init: sft`: the SFT policy's first layers),
learns to reproduce the strong RM's output distribution:
per prompt, the KL divergence from the strong RM's softmax over the prompt's k responses to the
light RM's (the Plackett-Luce / Bradley-Terry distribution the scores define, so the light RM
gets the strong RM's orderings and their certainty), plus a mean-squared error on the centred
score itself (so the scale, the reference and the confidence carry over to PPO).
The set it learns from (`distill_set`): the SFT policy's own samples (`distill_rollouts`, which
a worker process draws while the strong members train: `sft_rollouts`), their hacked twins and
topic demonstrations, and the training rankings' responses.

    python -c "from rlhf.pipeline.reward.distill import distill_loss; help(distill_loss)"
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlhf.pipeline.reward.stage import RewardConfig


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
        from rlhf.pipeline import ranges

        ranges.check_fields("light", self)


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
        from rlhf.pipeline.reward.train import new_score_head

        with new_score_head():
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


# ---------------------------------------------------------------------------------------------
# the distillation set


def distill_rollouts(cfg: RewardConfig, policy, tokenizer, rollout_prompts: Sequence[str],
                     sampling=None) -> list[list]:
    """The SFT samples of the distillation set (policy.Sample lists, one per rollout prompt):
    `rollout_k` per prompt, drawn as PPO will draw them (`sampling`, generation.Sampling; None:
    this section's temperature, top-p 1), each batch seeded with (seed + 1, batch)."""
    from rlhf.pipeline.models.policy import sample

    temperature, top_p, max_new = ((sampling.temperature, sampling.top_p, sampling.max_new_tokens)
                                   if sampling is not None
                                   else (cfg.temperature, 1.0, cfg.max_new_tokens))
    return sample(policy, tokenizer, list(rollout_prompts), n=cfg.rollout_k,
                  max_new_tokens=max_new, temperature=temperature, top_p=top_p,
                  seed=cfg.seed + 1, batch_size=cfg.batch_size, engine=cfg.engine)


def sft_rollouts(cfg: RewardConfig, sft_dir, rollout_prompts: Sequence[str], sampling=None,
                 compute=None) -> list[list]:
    """`distill_rollouts` of the SFT policy loaded from `sft_dir` here: the job a worker process
    (pipeline/workers.py) runs while the strong members train, the same samples as the stage's
    own process would draw (they need the policy, not the strong RM, which only labels them)."""
    from rlhf.pipeline.models.policy import load_policy

    policy, tok = load_policy(sft_dir, compute)
    return distill_rollouts(cfg, policy, tok, rollout_prompts, sampling)


def distill_set(cfg: RewardConfig, policy, tokenizer, rollout_prompts: Sequence[str],
                ann_rows: Sequence[dict], demos_path, sampling=None, rollouts=None
                ) -> tuple[list[str], list[str], list[list[int]], list[int]]:
    """(prompts, responses, groups, policy) the light RM is distilled on: `rollout_k` SFT
    samples plus `distill_demo_candidates` topic demonstrations per rollout prompt, and every
    training ranking's responses (SFT rollouts too); `policy`: the indices of the SFT samples
    (the ones drawn as PPO draws them, without their hacked twins).

    The SFT samples are drawn as PPO will draw them (`sampling`, generation.Sampling; None: this
    section's temperature, top-p 1), and a prompt's samples form a listwise group of their own,
    apart from its demonstrations: what PPO needs is the order among the policy's own samples,
    which a group dominated by (much better) demonstrations barely teaches (on-policy
    within-prompt Spearman vs gold 0.29 -> 0.61, bench/onpolicy_rm.py). `rollouts`: those SFT
    samples already drawn (distill_rollouts; `policy` and `tokenizer` are then not used)."""
    roll = (rollouts if rollouts is not None
            else distill_rollouts(cfg, policy, tokenizer, rollout_prompts, sampling))
    d_prompts: list[str] = []
    d_resps: list[str] = []
    groups: list[list[int]] = []
    policy_idx: list[int] = []
    if cfg.distill_demo_candidates:
        if demos_path is None:
            raise ValueError("reward.distill_demo_candidates needs --demos")
        from rlhf.pipeline.preferences import demo_candidates

        demos = demo_candidates(list(rollout_prompts), demos_path, cfg.distill_demo_candidates,
                                cfg.seed + 11)
    else:
        demos = [[] for _ in rollout_prompts]
    rng = random.Random(cfg.seed + 17)
    for p, ss, extra_resps in zip(rollout_prompts, roll, demos):
        own = [s.response for s in ss]
        policy_idx += range(len(d_prompts), len(d_prompts) + len(own))
        if cfg.distill_hacks and own:
            from rlhf.pipeline.reward.augment import HACKS

            kinds = sorted(HACKS)  # in turn: repeat, salad, truncate, repeat, ...
            twins = [HACKS[kinds[j % len(kinds)]](rng.choice(own), rng)
                     for j in range(cfg.distill_hacks)]
            own += [t for t in twins if t not in own]
        for resps in (own, extra_resps):
            if resps:
                groups.append(list(range(len(d_prompts), len(d_prompts) + len(resps))))
                d_prompts += [p] * len(resps)
                d_resps += resps
    by_rank: dict[str, list[dict]] = defaultdict(list)
    for r in ann_rows:
        if r["split"] == "train":
            by_rank[r["ranking_id"]].append(r)
    for rid in sorted(by_rank):
        rs = by_rank[rid]
        groups.append(list(range(len(d_prompts), len(d_prompts) + len(rs))))
        d_prompts += [r["prompt"] for r in rs]
        d_resps += [r["response"] for r in rs]
    return d_prompts, d_resps, groups, policy_idx
