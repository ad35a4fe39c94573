"""LoRA adapters through peft for the stages that train with them: PPO's policy and critic
(`ppo.lora`, pipeline/ppo/lora.py) and the reward models (`reward.train.lora`,
pipeline/reward/train.py). `LoraConfig` is the typed `lora:` block of those sections; it is off by
default, and nothing imports peft until a block is on (`pip install 'rlhf[lora]'`).

    python -m pytest -q tests/test_ppo_lora.py tests/test_lora.py
"""

from __future__ import annotations

from dataclasses import dataclass

from rlhf.pipeline import ranges
from rlhf.pipeline.config import ConfigError


@dataclass(frozen=True)
class LoraConfig:
    """A `lora:` block: adapters of rank `r` (scaled by alpha / r) on `target_modules` (module
    names, or peft's "all-linear": every linear layer of the blocks, not the output head)."""

    enabled: bool = False
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("all-linear",)

    def __post_init__(self) -> None:
        if isinstance(self.target_modules, list):  # YAML gives lists
            object.__setattr__(self, "target_modules", tuple(self.target_modules))
        ranges.check_fields("lora", self)
        if not self.target_modules:
            raise ValueError("lora.target_modules must name at least one module (or all-linear)")


def peft_config(cfg: LoraConfig, task_type: str | None):
    """peft's LoraConfig for `cfg` (task_type CAUSAL_LM, SEQ_CLS, or None for a bare backbone)."""
    from peft import LoraConfig as PeftLoraConfig

    targets = cfg.target_modules
    return PeftLoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                          target_modules=targets[0] if targets == ("all-linear",) else list(targets),
                          task_type=task_type)


def wrap(model, cfg: LoraConfig, task_type: str | None, where: str):
    """`model` as a peft model: its weights frozen, adapters (and a SEQ_CLS head) trainable.
    `where` names the params block in the one-line errors."""
    try:
        from peft import get_peft_model
    except ImportError:
        raise ConfigError(f"{where}.enabled needs peft: pip install 'rlhf[lora]'") from None
    try:
        return get_peft_model(model, peft_config(cfg, task_type))
    except ValueError as exc:  # a target module the model lacks
        raise ConfigError(f"{where}.target_modules: {str(exc).splitlines()[0]}") from None


def trainable_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def base_state_dict(model) -> dict:
    """The weights of a peft model's base body under the base's own names (adapters left out):
    what a copy of the base's layers loads (critic.PolicyTrunkCritic.copy_from_policy)."""
    inner = model.get_base_model()
    body = getattr(inner, inner.base_model_prefix, inner)
    return {k.replace(".base_layer", ""): v for k, v in body.state_dict().items()
            if "lora_" not in k}
