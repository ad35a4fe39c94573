"""The peer arms of bench/economy.py: current TRL's GRPOTrainer and RLOOTrainer on our world.

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

    .venv/bin/python bench/economy.py --arms grpo rloo --seeds 0    # runs through this module
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
    seconds_score: float = 0.0
    saved: list[dict] = field(default_factory=list)  # checkpoints written


def train_peer(kind: str, cfg, policy: Path, reward: Path, prompts: list[tuple[str, str]],
               out: Path, token_budget: int, group: int = 4) -> dict:
    """Train `kind` ("grpo" or "rloo") and save `checkpoints/batch-NNNNNN/policy.pt` every
    `cfg.checkpoint_every` generation batches and at the end; returns the run's totals and
    checkpoints (generation batch, optimiser steps, tokens generated, folder)."""
    import torch
    from datasets import Dataset
    from rlhf.pipeline.policy import quiet_hf, quiet_trainer
    from rlhf.pipeline.ppo.accounting import rm_tokens
    from rlhf.pipeline.ppo.scoring import load_scorer
    from rlhf.pipeline.text import format_prompt, response_of
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
    scorer = load_scorer(reward, name="light_rm")
    ledger = Ledger()

    def light_rm(prompts, completions, completion_ids, raw_prompt, **_):
        t = time.perf_counter()
        resps = [response_of(c) for c in completions]
        scores, _conf = scorer.score(list(raw_prompt), resps)
        ledger.seconds_score += time.perf_counter() - t
        ledger.tokens_generated += sum(len(ids) for ids in completion_ids)
        ledger.rollouts_started += len(completions)
        ledger.light_rm_calls += len(completions)
        ledger.light_rm_tokens += rm_tokens(scorer, list(raw_prompt), resps)
        return [float(s) for s in scores]

    updates_per_batch = cfg.ppo_epochs * cfg.batch_size // cfg.mini_batch_size

    def save(model, state) -> None:
        batches = state.global_step // updates_per_batch
        folder = out / "checkpoints" / f"batch-{batches:06d}"
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), folder / "policy.pt")
        ledger.saved.append({"folder": str(folder), "step": batches,
                             "optimizer_steps": state.global_step,
                             "tokens_generated": ledger.tokens_generated,
                             "rollouts_started": ledger.rollouts_started})

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
    args = Config(
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
    tok = AutoTokenizer.from_pretrained(str(policy))
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(policy), dtype=torch.float32)
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
              "optimizer_steps": trainer.state.global_step, "seconds_train": round(seconds, 2),
              "seconds_score": round(ledger.seconds_score, 2)}
    (out / "summary.json").write_text(json.dumps({"cost": totals, "checkpoints": ledger.saved},
                                                 indent=1))
    return {"cost": totals, "checkpoints": ledger.saved}
