"""Supervised fine-tuning of the starting policy on the demonstrations (TRL's SFTTrainer).

Embedded default (`sft.base_model: ""`): a Llama-style model built from scratch from the world's
`model_config/` and `tokenizer/`, trained on `demonstrations.jsonl` as prompt/completion pairs
rendered by `rlhf.pipeline.models.text` (loss on the response tokens only; a tokenizer with a chat
template gets the conversation as messages, which TRL renders with that template). Otherwise
`base_model` names any causal LM (hub name or local path) to fine-tune, fully or with LoRA
(`sft.lora: true`, needs `pip install peft`). Output: a `save_pretrained` checkpoint (model +
tokenizer) and metrics: train / held-out loss and the gold judge's mean score of the SFT
policy's samples on held-out demonstration prompts.

    rlhf sft --demos artifacts/world/demonstrations.jsonl --tokenizer artifacts/world/tokenizer \
        --model-config artifacts/world/model_config --out artifacts/models/sft \
        --metrics artifacts/metrics/sft.json
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhf.pipeline import ranges
from rlhf.pipeline.models.compute import own_accelerate_state
from rlhf.pipeline.models.text import RESPONSE_SEPARATOR, clean, format_prompt, messages_of, templated
from rlhf.store.hashing import hashed_split


@dataclass(frozen=True)
class SftConfig:
    """params.yaml `sft`."""

    base_model: str = ""  # "" = embedded default (from scratch); else hub name or local path
    lora: bool = False  # LoRA adapters through peft instead of full fine-tuning
    lora_r: int = 8
    lora_alpha: int = 16
    epochs: float = 3.0
    learning_rate: float = 2e-3
    batch_size: int = 32
    max_length: int = 128  # tokens of prompt + response (longer ones are truncated at the end)
    warmup_ratio: float = 0.05
    weight_decay: float = 0.0
    heldout_fraction: float = 0.1  # of the demonstrations' prompts, by prompt hash
    eval_prompts: int = 64  # held-out prompts the gold judge scores the SFT policy on
    eval_max_new_tokens: int = 48
    eval_temperature: float = 0.7
    seed: int = 0

    def __post_init__(self):
        ranges.check_fields("sft", self)


def read_demonstrations(path: str | Path) -> list[dict[str, Any]]:
    """The demonstrations as {"prompt", "response", ...} dicts; bad lines raise a clear error."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"demonstrations file not found: {path}")
    rows = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not JSON ({exc.msg})") from None
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) \
                    or not isinstance(row.get("response"), str):
                raise ValueError(f"{path}:{n}: needs string fields 'prompt' and 'response'")
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no demonstrations")
    return rows


def split_demonstrations(rows, heldout_fraction: float):
    """(train, heldout) by prompt hash, so a prompt's demonstrations stay on one side."""
    train, held = [], []
    for r in rows:
        side = hashed_split("sft:" + clean(r["prompt"]), (("heldout", heldout_fraction),
                                                          ("train", 1.0 - heldout_fraction)))
        (held if side == "heldout" else train).append(r)
    return train, held


def _to_dataset(rows, tok):
    """TRL prompt/completion rows: plain strings, or, when `tok` renders with its chat template
    (`text.templated`), the conversation as messages, which TRL renders with that template as
    `text.render_prompt` does (its special tokens written once, not added again)."""
    import datasets

    if templated(tok):
        return datasets.Dataset.from_dict({
            "prompt": [messages_of(r["prompt"]) for r in rows],
            "completion": [[{"role": "assistant", "content": clean(r["response"])}]
                           for r in rows],
        })
    return datasets.Dataset.from_dict({
        "prompt": [format_prompt(r["prompt"]) for r in rows],
        "completion": [RESPONSE_SEPARATOR + clean(r["response"]) for r in rows],
    })


def build_model(cfg: SftConfig, tokenizer_path: str | Path | None,
                model_config_path: str | Path | None, compute=None):
    """(model, tokenizer): from scratch for the embedded default, else from `base_model`; its
    weights in `compute`'s dtype (pipeline/models/compute.py; None: float32)."""
    import torch
    from rlhf.pipeline.models.compute import model_kwargs, note_cast
    from rlhf.pipeline.models.model_folders import policy_folder
    from rlhf.pipeline.models.policy import load_tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = model_kwargs(compute)["dtype"]
    if cfg.base_model:
        base = policy_folder(cfg.base_model, "sft.base_model")  # a hub name: its cached snapshot
        tok = load_tokenizer(base)
        if compute is not None:
            note_cast(base, compute, "sft.base_model")
        model = AutoModelForCausalLM.from_pretrained(str(base), dtype=dtype)
        return model, tok
    if tokenizer_path is None or model_config_path is None:
        raise ValueError("the embedded default needs --tokenizer and --model-config")
    tok = load_tokenizer(tokenizer_path)
    config = AutoConfig.from_pretrained(str(model_config_path))
    if config.vocab_size < len(tok):
        raise ValueError(f"model_config vocab_size {config.vocab_size} < tokenizer size {len(tok)}")
    torch.manual_seed(cfg.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model, tok


def _trainer_class():
    """TRL's SFTTrainer with the loss of the model's own causal-LM head on the collator's labels
    (the prompt and the padding at -100: the same completion-only mean). TRL computes it through
    its fused LM head, which also works out per-token entropy and top-1 accuracy for its logs:
    on the embedded default that is 0.62 s a step against 0.28 for the same loss (6.9374 vs
    6.9372 after 13 steps; docs/README.md)."""
    from trl import SFTTrainer

    class LabelsLossSFTTrainer(SFTTrainer):
        last_loss = None  # the last training batch's loss, for the trackers (TrackStep)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            kwargs = {} if num_items_in_batch is None else {"num_items_in_batch": num_items_in_batch}
            out = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                        labels=inputs["labels"], use_cache=False, **kwargs)
            if model.training:
                self.last_loss = out.loss.detach()
            return (out.loss, out) if return_outputs else out.loss

    return LabelsLossSFTTrainer


CHECKPOINT_MARK = ".complete"  # written into a checkpoint once the trainer has saved all of it
FINGERPRINT = "inputs.json"  # what the checkpoints were trained from


def checkpoints_dir(out_dir: str | Path) -> Path:
    """The hidden sibling of the policy folder that holds the epoch checkpoints of a run."""
    out_dir = Path(out_dir)
    return out_dir.parent / f".{out_dir.name}.checkpoints"


def _fingerprint(cfg: SftConfig, demos: list[dict], tokenizer_path, model_config_path,
                 compute) -> str:
    import dataclasses
    import hashlib

    from rlhf.pipeline.config import effective

    h = hashlib.sha256(json.dumps(demos, sort_keys=True, ensure_ascii=False).encode())
    return json.dumps({"params": effective(cfg), "demonstrations_sha256": h.hexdigest(),
                       "tokenizer": str(tokenizer_path), "model_config": str(model_config_path),
                       "compute": {k: v for k, v in dataclasses.asdict(compute).items()
                                   if k != "why"}}, sort_keys=True)


def last_checkpoint(folder: Path, fingerprint: str) -> str | None:
    """The newest complete checkpoint in `folder` made from the same inputs, or None; a folder of
    other inputs is emptied and stamped with these (its checkpoints could not be resumed)."""
    stamp = folder / FINGERPRINT
    if not stamp.is_file() or stamp.read_text() != fingerprint:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True, exist_ok=True)
        stamp.write_text(fingerprint)
        return None
    done = [d for d in folder.glob("checkpoint-*") if (d / CHECKPOINT_MARK).is_file()]
    for d in folder.glob("checkpoint-*"):  # cut short by the kill: useless
        if d not in done:
            shutil.rmtree(d, ignore_errors=True)
    if not done:
        return None
    return str(max(done, key=lambda d: int(d.name.rpartition("-")[2])))


def _MarkComplete():
    """A trainer callback that marks each checkpoint complete once the trainer has saved it."""
    from transformers import TrainerCallback

    class MarkComplete(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if path.is_dir():
                (path / CHECKPOINT_MARK).write_text("")

    return MarkComplete()


def _TrackStep(trainer, trackers):
    """A trainer callback that gives the trackers each step's loss and learning rate. The
    trainer's own logging stays off (`logging_strategy="no"`): it would sum the reported
    `train_loss` in other pieces, and so change its last bits."""
    from transformers import TrainerCallback

    class TrackStep(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if trainer.last_loss is not None:
                trackers.log({"sft/loss": float(trainer.last_loss), "sft/epoch": state.epoch,
                              "sft/learning_rate": trainer.lr_scheduler.get_last_lr()[0]},
                             state.global_step)

    return TrackStep()


@own_accelerate_state()  # the Trainer's bf16 and device stay its own (compute.py)
def train_sft(cfg: SftConfig, demos: list[dict], out_dir: str | Path,
              tokenizer_path: str | Path | None = None,
              model_config_path: str | Path | None = None, trackers=None,
              compute=None) -> dict[str, Any]:
    """Train with TRL's SFTTrainer and save the model + tokenizer to `out_dir`; returns metrics.
    `compute` (pipeline/models/compute.py; None: what `auto` gives here): the device, the weights'
    dtype (recorded in the saved config.json's `dtype`), the attention while training (the
    saved model loads with the library's default) and gradient checkpointing.

    A checkpoint is saved after every epoch into `checkpoints_dir(out_dir)`; a rerun after a kill
    resumes from the last complete one made from the same inputs (config, demonstrations,
    tokenizer, model shape), else starts over. The folder is removed once the policy is saved.
    `trackers` (tracking.Trackers) get every step's loss and learning rate."""
    import torch
    from rlhf.pipeline.models.compute import resolve
    from rlhf.pipeline.models.policy import quiet_hf, quiet_trainer
    from transformers import set_seed
    from trl import SFTConfig

    compute = compute or resolve(stage="sft")
    quiet_hf()
    set_seed(cfg.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    train_rows, held_rows = split_demonstrations(demos, cfg.heldout_fraction)
    if not train_rows:
        raise ValueError("no training demonstrations left after the held-out split")
    model, tok = build_model(cfg, tokenizer_path, model_config_path, compute)
    if compute.attn_implementation is not None:  # not saved: loading picks its own
        model.set_attn_implementation(compute.attn_implementation)
    if not compute.on_cpu:  # the Trainer places the model on the current GPU
        torch.cuda.set_device(compute.torch_device)
    peft_config = None
    if cfg.lora:
        try:
            from peft import LoraConfig
        except ImportError:
            raise ValueError("sft.lora needs peft: pip install 'peft>=0.18'") from None
        peft_config = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, task_type="CAUSAL_LM",
                                 target_modules="all-linear")
    ckpt = checkpoints_dir(out_dir)
    resume = last_checkpoint(ckpt, _fingerprint(cfg, demos, tokenizer_path, model_config_path,
                                                compute))
    args = SFTConfig(
        output_dir=str(ckpt), num_train_epochs=cfg.epochs, learning_rate=cfg.learning_rate,
        per_device_train_batch_size=cfg.batch_size, per_device_eval_batch_size=cfg.batch_size,
        warmup_steps=cfg.warmup_ratio, weight_decay=cfg.weight_decay,
        lr_scheduler_type="cosine", max_length=cfg.max_length, completion_only_loss=True,
        train_sampling_strategy="group_by_length",
        seed=cfg.seed, data_seed=cfg.seed, report_to="none", use_cpu=compute.on_cpu,
        bf16=compute.dtype == "bfloat16", fp16=False,
        # transformers 5's name of gradient checkpointing (TRL's SFTConfig turns it on unless told)
        activation_checkpointing=compute.gradient_checkpointing, save_strategy="epoch",
        save_total_limit=1,
        eval_strategy="no",
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0, push_to_hub=False,
    )
    trainer = _trainer_class()(model=model, args=args, train_dataset=_to_dataset(train_rows, tok),
                               eval_dataset=_to_dataset(held_rows, tok) if held_rows else None,
                               processing_class=tok, peft_config=peft_config)
    quiet_trainer(trainer, "SFT training")
    t0 = time.perf_counter()
    trainer.add_callback(_MarkComplete())
    if trackers is not None:
        trainer.add_callback(_TrackStep(trainer, trackers))
    result = trainer.train(resume_from_checkpoint=resume)
    train_seconds = time.perf_counter() - t0
    eval_loss = float(trainer.evaluate()["eval_loss"]) if held_rows else float("nan")
    model = trainer.model
    if cfg.lora:
        model = model.merge_and_unload()
    from rlhf.store.io import staged_folders

    out_dir = Path(out_dir)
    model.generation_config.pad_token_id = tok.pad_token_id
    # a hidden staging sibling swapped in whole: a kill while saving leaves the previous policy
    # (or none), never a half-written folder a rerun would load
    with staged_folders([out_dir]) as staged:
        model.save_pretrained(staged[out_dir])
        tok.save_pretrained(staged[out_dir])
    shutil.rmtree(ckpt, ignore_errors=True)  # the policy is whole: nothing left to resume
    return {
        "train_loss": float(result.training_loss),
        "eval_loss": eval_loss,
        "eval_perplexity": math.exp(eval_loss) if eval_loss == eval_loss else float("nan"),
        "n_train": len(train_rows),
        "n_heldout": len(held_rows),
        "n_params": int(sum(p.numel() for p in model.parameters())),
        "train_seconds": round(train_seconds, 1),
        # the optimiser step a kill left the last complete checkpoint at (0: a fresh start)
        "resumed_from_step": int(resume.rpartition("-")[2]) if resume else 0,
    }


def judge_policy(model, tok, prompts: list[str], judge: Callable[[str, str], float],
                 cfg: SftConfig) -> dict[str, float]:
    """The gold judge's mean score (0-5) of one sampled response per held-out prompt."""
    from rlhf.pipeline.models.policy import sample

    if not prompts:
        return {"gold_mean": float("nan"), "n_judged": 0}
    outs = sample(model, tok, prompts, n=1, max_new_tokens=cfg.eval_max_new_tokens,
                  temperature=cfg.eval_temperature, seed=cfg.seed)
    scores = [judge(p, o[0].response) for p, o in zip(prompts, outs)]
    return {"gold_mean": sum(scores) / len(scores), "n_judged": len(scores),
            "mean_response_tokens": sum(o[0].n_tokens for o in outs) / len(outs)}


def default_judge() -> Callable[[str, str], float]:
    from rlhf.pipeline.world.judge import gold_score

    return gold_score


def run(cfg: SftConfig, demos_path: str | Path, out_dir: str | Path,
        tokenizer_path: str | Path | None = None, model_config_path: str | Path | None = None,
        judge: Callable[[str, str], float] | None = None, tracking=None,
        compute=None) -> dict[str, Any]:
    """The `sft` stage: train, save, judge held-out prompts; returns the report (with `params`,
    the values of the section it ran with). `tracking` (params.yaml `tracking`; None: no
    tracker): the trackers that get each step's loss and, at the last step, the report's
    figures; their files go to `tracking.logs_dir(out_dir, "sft")`. `compute`: where and in
    what dtype it trains and samples (pipeline/models/compute.py; None: what `auto` gives here)."""
    from rlhf.pipeline import tracking as tr
    from rlhf.pipeline.config import effective

    demos = read_demonstrations(demos_path)
    trackers = tr.start(tracking or tr.TrackingConfig(report_to=()), "sft",
                        tr.logs_dir(out_dir, "sft"), {"sft": effective(cfg)})
    try:
        metrics = _judged(cfg, demos, out_dir, tokenizer_path, model_config_path, judge,
                          trackers, compute)
        trackers.log({f"sft/{k}": v for k, v in metrics.items()}, trackers.last_step)
    finally:
        trackers.finish()
    return metrics


def _judged(cfg: SftConfig, demos: list[dict], out_dir, tokenizer_path, model_config_path,
            judge, trackers, compute=None) -> dict[str, Any]:
    """Train and save the policy, then judge its samples of the held-out prompts."""
    from rlhf.pipeline.models.compute import resolve
    from rlhf.pipeline.config import effective

    compute = compute or resolve(stage="sft")
    from rlhf.pipeline.models.policy import load_policy

    metrics = train_sft(cfg, demos, out_dir, tokenizer_path, model_config_path, trackers,
                        compute)
    _, held = split_demonstrations(demos, cfg.heldout_fraction)
    prompts = sorted({clean(r["prompt"]) for r in held})[: cfg.eval_prompts]
    model, tok = load_policy(out_dir, compute)
    judge = judge or default_judge()
    metrics["judge"] = getattr(judge, "name", "world_gold")
    metrics["params"] = effective(cfg)
    metrics.update(judge_policy(model, tok, prompts, judge, cfg))
    # the demonstrations themselves, judged the same way: the ceiling SFT can imitate
    metrics["gold_mean_demonstrations"] = (
        sum(judge(r["prompt"], r["response"]) for r in held) / len(held) if held else float("nan"))
    return metrics
