"""The peer arms of the benchmark (bench/economy): current TRL's GRPOTrainer and RLOOTrainer on our world.

Same SFT policy, the same light RM as the one reward function (through `load_scorer`, the scorer
PPO reads), the same ppo-split prompts rendered by `format_prompt`, the same sampling
(temperature, top-p, top-k 0, max new tokens) and learning rate, KL coefficient (`beta`), clip
range and update count per rollout as the PPO arm they stand beside: a generation batch of
`batch_size` completions (`batch_size / group` prompts x `group` samples) feeds
`batch_size / mini_batch_size` optimiser steps, repeated `ppo_epochs` times (`num_iterations`).

A run stops at the token budget or at the PPO arm's rollout count (`max_steps`), whichever comes
first, after the last generation batch has had all its updates; every
completion token TRL generated is counted (EOS included, as our trainer counts). The policy's
weights are saved every `checkpoint_every` generation batches (a PPO step's worth of rollouts),
as the PPO arms save theirs, for the held-out gold evaluation.

    .venv/bin/python -m bench.economy --arms grpo rloo --seeds 0    # runs through this module

Compute is counted as our trainer counts it (pipeline/ppo/accounting.py), from the shapes TRL
pads a generation batch to: generation runs `C` sequential forwards (C = the batch's longest
completion) over `B x (P + C - 1)` token positions (P = its longest prompt; every row stays until
the last ends); the reference pass (beta > 0) and each of the `num_iterations` update passes
push `B x (P + C)` positions; the old-log-prob pass too when TRL computes one (more than one
optimiser step per generation batch).

`filter_groups` (DAPO's dynamic sampling, veRL's `filter_groups`): after a generation batch is
scored, the groups whose rewards do not vary (every advantage 0) are dropped and new prompts are
generated for until the batch is full again (at most `max_gen_batches` generations a batch; then
the last zero-variance groups fill it). Every generated token is counted, the dropped ones too.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Ledger:
    """What the reward function saw: the run's generated tokens, completions, RM calls."""

    tokens_generated: int = 0
    rollouts_started: int = 0
    light_rm_calls: int = 0
    light_rm_tokens: int = 0
    gen_forwards: int = 0
    gen_token_forwards: int = 0
    groups_dropped: int = 0  # filter_groups: zero-variance groups dropped after generation
    gen_batches_extra: int = 0  # filter_groups: refill generations
    seconds_score: float = 0.0
    saved: list[dict] = field(default_factory=list)  # checkpoints written
    passes: list[int] = field(default_factory=list)  # B x (P + C) of each generation batch
    trained: list[int] = field(default_factory=list)  # filter_groups: B x (P + C) trained on

    def counts(self) -> dict:
        return {k: getattr(self, k) for k in COUNTS}


COUNTS = ("tokens_generated", "rollouts_started", "light_rm_calls", "light_rm_tokens",
          "gen_forwards", "gen_token_forwards", "groups_dropped", "gen_batches_extra")


def light_rm_reward(scorer, tok, ledger: Ledger):
    """TRL's reward function: the light RM's scores of a generation batch, whose generation,
    scoring and pass sizes go into `ledger` as our trainer counts them."""
    from rlhf.pipeline.ppo.accounting import rm_tokens
    from rlhf.pipeline.models.text import response_of

    def light_rm(prompts, completions, completion_ids, raw_prompt, **_):
        t = time.perf_counter()
        steps = max((len(ids) for ids in completion_ids), default=0)
        width = max(len(ids) for ids in tok(list(prompts), add_special_tokens=False)["input_ids"])
        ledger.gen_forwards += steps
        ledger.gen_token_forwards += len(completion_ids) * (width + max(steps - 1, 0))
        ledger.passes.append(len(completion_ids) * (width + steps))
        resps = [response_of(c) for c in completions]
        scores, _conf = scorer.score(list(raw_prompt), resps)
        ledger.seconds_score += time.perf_counter() - t
        ledger.tokens_generated += sum(len(ids) for ids in completion_ids)
        ledger.rollouts_started += len(completions)
        ledger.light_rm_calls += len(completions)
        ledger.light_rm_tokens += rm_tokens(scorer, list(raw_prompt), resps)
        return [float(s) for s in scores]

    return light_rm


def peer_args(Config, cfg, out: Path, group: int, updates_per_batch: int):
    """The TRL trainer's config (GRPOConfig or RLOOConfig) from the PPO arm's `cfg`: the same
    sampling, learning rate, KL coefficient, clip range and updates per rollout."""
    import torch

    return Config(
        output_dir=str(out / "trl"), seed=cfg.seed, report_to="none", save_strategy="no",
        logging_steps=10**6, disable_tqdm=True, use_cpu=not torch.cuda.is_available(),
        bf16=False, gradient_checkpointing=False, dataloader_num_workers=0,
        learning_rate=cfg.learning_rate, lr_scheduler_type="linear",
        max_grad_norm=cfg.max_grad_norm, beta=cfg.kl_coef, epsilon=cfg.clip_range,
        num_iterations=cfg.ppo_epochs, num_generations=group,
        per_device_train_batch_size=cfg.mini_batch_size,
        steps_per_generation=cfg.batch_size // cfg.mini_batch_size,
        max_steps=cfg.total_steps * updates_per_batch,
        temperature=cfg.temperature, top_p=cfg.top_p, top_k=0,
        max_completion_length=cfg.max_new_tokens, disable_dropout=True,
        remove_unused_columns=False)


def train_peer(kind: str, cfg, policy: Path, reward: Path, prompts: list[tuple[str, str]],
               out: Path, token_budget: int, group: int = 4, filter_groups: bool = False,
               max_gen_batches: int = 4) -> dict:
    """Train `kind` ("grpo" or "rloo") and save `checkpoints/batch-NNNNNN/policy.pt` every
    `cfg.checkpoint_every` generation batches and at the end; returns the run's totals and
    checkpoints (generation batch, optimiser steps, tokens generated, folder)."""
    import torch
    from datasets import Dataset
    from rlhf.pipeline.models.policy import quiet_hf, quiet_trainer
    from rlhf.pipeline.models.scoring import load_scorer
    from rlhf.pipeline.models.text import format_prompt
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    quiet_hf()
    if kind == "grpo":
        from trl import GRPOConfig as Config
        from trl import GRPOTrainer as Trainer
    elif kind == "rloo":
        from trl import RLOOConfig as Config
        from trl import RLOOTrainer as Trainer
    else:
        raise ValueError(f"unknown peer {kind!r}")
    if cfg.batch_size % group or cfg.batch_size % cfg.mini_batch_size:
        raise ValueError(f"batch_size {cfg.batch_size} must be a multiple of the group ({group}) "
                         f"and of mini_batch_size {cfg.mini_batch_size}")
    out.mkdir(parents=True, exist_ok=True)
    if filter_groups and kind != "grpo":
        raise ValueError("filter_groups is DAPO's dynamic sampling on GRPO (kind grpo)")
    scorer = load_scorer(reward, name="light_rm")
    ledger = Ledger()
    tok = AutoTokenizer.from_pretrained(str(policy))
    tok.padding_side = "left"
    light_rm = light_rm_reward(scorer, tok, ledger)
    updates_per_batch = cfg.ppo_epochs * cfg.batch_size // cfg.mini_batch_size

    def save(model, state) -> None:
        batches = state.global_step // updates_per_batch
        folder = out / "checkpoints" / f"batch-{batches:06d}"
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), folder / "policy.pt")
        ledger.saved.append({"folder": str(folder), "step": batches,
                             "optimizer_steps": state.global_step,
                             "tokens_generated": ledger.tokens_generated,
                             "rollouts_started": ledger.rollouts_started,
                             "cost": {**ledger.counts(), **pass_counts()}})

    def pass_counts() -> dict:
        """The reference, old-log-prob and update passes over the batches trained so far."""
        scored = sum(ledger.passes)  # TRL's reference and old-log-prob passes: every batch
        trained = sum(ledger.trained) if filter_groups else scored
        old_logprobs = cfg.ppo_epochs > 1 or cfg.batch_size > cfg.mini_batch_size
        return {"ref_token_forwards": scored if cfg.kl_coef > 0 else 0,
                "logprob_token_forwards": scored if old_logprobs else 0,
                "update_token_forwards": cfg.ppo_epochs * trained}

    class Budget(TrainerCallback):
        """Saves the weights every `checkpoint_every` generation batches (as PPO checkpoints
        every `checkpoint_every` steps) and stops at the token budget, each only after a
        generation batch has had all its updates."""

        def on_step_end(self, args, state, control, model=None, **kw):
            if state.global_step % updates_per_batch:
                return control
            if (state.global_step // updates_per_batch) % cfg.checkpoint_every == 0:
                save(model, state)
            if ledger.tokens_generated >= token_budget:
                control.should_training_stop = True
            return control

    data = Dataset.from_list([{"prompt": format_prompt(t), "raw_prompt": t, "prompt_id": pid}
                              for pid, t in prompts])
    args = peer_args(Config, cfg, out, group, updates_per_batch)
    model = AutoModelForCausalLM.from_pretrained(str(policy), dtype=torch.float32)
    if filter_groups:
        Trainer = dynamic_sampling(Trainer, data, group, cfg.seed, max_gen_batches, ledger)
    trainer = Trainer(model=model, reward_funcs=light_rm, args=args, train_dataset=data,
                      processing_class=tok, callbacks=[Budget()])
    quiet_trainer(trainer)
    t = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - t
    if not ledger.saved or ledger.saved[-1]["optimizer_steps"] < trainer.state.global_step:
        save(trainer.model, trainer.state)  # the final weights are always a point
    totals = {"tokens_generated": ledger.tokens_generated,
              "rollouts_started": ledger.rollouts_started,
              "rollouts_trained": ledger.rollouts_started,
              "tokens_trained": ledger.tokens_generated,
              "light_rm_calls": ledger.light_rm_calls, "light_rm_tokens": ledger.light_rm_tokens,
              "strong_rm_calls": 0, "strong_rm_tokens": 0,
              **ledger.counts(), **pass_counts(),
              "optimizer_steps": trainer.state.global_step, "seconds_train": round(seconds, 2),
              "seconds_score": round(ledger.seconds_score, 2)}
    (out / "summary.json").write_text(json.dumps({"cost": totals, "checkpoints": ledger.saved},
                                                 indent=1))
    return {"cost": totals, "checkpoints": ledger.saved}


def dynamic_sampling(base, data, group: int, seed: int, max_gen_batches: int, ledger: Ledger):
    """`base` (TRL's GRPOTrainer) with DAPO's dynamic sampling: a scored generation batch keeps
    its groups whose advantages are not all 0 (rewards that vary) and is refilled with groups
    of new prompts (drawn in a seeded order from `data`) until it has as many rows as before."""
    import random

    import torch

    order = random.Random(seed + 7919)
    rows = list(range(len(data)))

    def draw(n_prompts: int) -> list[dict]:
        picked = (order.sample(rows, n_prompts) if n_prompts <= len(rows)
                  else [order.choice(rows) for _ in range(n_prompts)])
        return [dict(data[i]) for i in picked for _ in range(group)]

    class DynamicSampling(base):
        def _generate_and_score_completions(self, inputs):
            if not self.model.training:
                return super()._generate_and_score_completions(inputs)
            want = len(inputs)
            kept: list[dict] = []
            spare: list[dict] = []
            batch = inputs
            for i in range(max_gen_batches):
                out = super()._generate_and_score_completions(batch)
                if i:
                    ledger.gen_batches_extra += 1
                for g in range(len(batch) // group):
                    part = _rows(out, slice(g * group, (g + 1) * group))
                    zero = bool(torch.all(part["advantages"] == 0))
                    (spare if zero else kept).append(part)
                    ledger.groups_dropped += int(zero)
                if len(kept) * group >= want:
                    break
                batch = draw(want // group - len(kept))
            parts = (kept + spare)[:want // group]  # full after max_gen_batches: spare fills it
            out = _concat(parts, self.processing_class.pad_token_id)
            ledger.trained.append(out["prompt_ids"].shape[0] * (
                out["prompt_ids"].shape[1] + out["completion_ids"].shape[1]))
            return out

    return DynamicSampling


_PROMPT = ("prompt_ids", "prompt_mask")  # left-padded
_PER_TOKEN = ("completion_ids", "completion_mask", "old_per_token_logps",
              "ref_per_token_logps", "sampling_per_token_logps")  # right-padded


def _rows(out: dict, idx: slice) -> dict:
    import torch

    return {k: (v[idx] if isinstance(v, torch.Tensor) and v.dim() > 0 else v)
            for k, v in out.items()}


def _concat(parts: list[dict], pad_id: int) -> dict:
    """One generation batch from groups of several: prompts left-padded, completions and their
    per-token values right-padded to the widest; `num_items_in_batch` recounted."""
    import torch
    import torch.nn.functional as F

    out: dict = {}
    for k in parts[0]:
        vals = [p[k] for p in parts]
        if k in _PROMPT or k in _PER_TOKEN:
            width = max(v.shape[1] for v in vals)
            fill = pad_id if k in ("prompt_ids", "completion_ids") else 0
            left = k in _PROMPT
            vals = [F.pad(v, (width - v.shape[1], 0) if left else (0, width - v.shape[1]),
                          value=fill) for v in vals]
            out[k] = torch.cat(vals)
        elif isinstance(vals[0], torch.Tensor) and vals[0].dim() > 0:
            out[k] = torch.cat(vals)
        else:
            out[k] = vals[0]
    out["num_items_in_batch"] = out["completion_mask"].sum()
    return out
