"""PPOConfig: the typed mirror of the `ppo:` section of params.yaml, checked at load.

The loop's own keys are `PPOCore`'s fields below; every feature declares its keys next to its code
(`ConfigField` in pipeline/ppo/features/*.py: type, default, range, help) and `PPOConfig` is
built from both on first use (`PPOConfig(...)`, `cfg.key` and the flat `ppo:` section work the
same for either kind). Each range is written once, in that declaration (the loop's in
pipeline/ranges.py): the params check and `__post_init__` read the same one; a rule across keys
is a small `check` next to its feature. Every switch defaults to off, so a `ppo:` section that
sets none of them is plain PPO (the baseline the benchmarks compare against); params.yaml turns
the features on. `PLAIN_PPO`, `plain` and `features_on` derive from the feature registry
(features/registry.py). A feature registered after PPOConfig was built (a test's) keeps its keys
in `extra`; they read like any other field (`cfg.my_switch`); `with_values` sets either kind.

    rlhf params check
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any, Literal

from rlhf.pipeline import ranges
from rlhf.pipeline.config import ConfigError
from rlhf.pipeline.models.lora import LoraConfig


class PPOCore:
    """The loop's own `ppo:` keys and the checks of every key; `PPOConfig` is this class with the
    features' keys added, as a frozen dataclass."""

    seed: int = 0
    total_steps: int = 40
    # a budget of generated tokens (every token the policy sampled, accounting.py): the run
    # stops after the step that reaches it (0 = none; `total_steps` still bounds the run), so
    # arms that spend fewer tokens a step can be compared at an equal budget (bench/economy/)
    total_tokens: int = 0
    batch_size: int = 8  # prompts per step (per process)
    mini_batch_size: int = 4  # rollouts per optimiser step
    ppo_epochs: int = 2
    # sampling (seed 001 §5.1: temperature > 0.3 and top_p <= 0.95, else repeated responses)
    temperature: float = 0.8
    top_p: float = 0.95
    max_new_tokens: int = 24
    max_prompt_tokens: int = 64
    generation_timeout_s: float = 15.0  # seed 000 §4.3: a stuck rollout falls back
    # optimisation
    learning_rate: float = 1e-4
    critic_learning_rate: float = 3e-4
    max_grad_norm: float = 1.0
    gamma: float = 1.0
    gae_lambda: float = 0.95
    # the advantage estimator (advantages.py): "gae" with the critic (PPO), or a group estimator
    # over `group_size` samples of each prompt with no critic: "rloo" (leave-one-out baseline),
    # "grpo" (the group's mean and std); with group_size k a step draws batch_size / k prompts
    advantage_estimator: Literal["gae", "rloo", "grpo"] = "gae"
    group_size: int = 1
    clip_range: float = 0.2
    clip_range_value: float = 0.2
    whiten_advantages: bool = True
    kl_coef: float = 0.05
    # "full" = exact KL over the whole vocabulary; k1/k2/k3 = Schulman's estimators on sampled
    # tokens (all from full-vocabulary log-probs, never truncated: seed 000 §5.4)
    kl_estimator: Literal["full", "k1", "k2", "k3"] = "full"
    # seed 000 §3.3: gradient-norm histogram diagnostics
    gradnorm_diagnostics_on: bool = True
    gradnorm_reference_steps: int = 10
    gradnorm_shift_decades: float = 1.0
    gradnorm_bimodal_separation: float = 2.0
    critic_huber_delta: float = 1.0
    critic_kl_reg_coef: float = 0.01
    # records
    checkpoint_every: int = 10
    csv_every: int = 10  # seed 000 §4.4: one CSV line every 10 steps
    debug_rollouts: bool = False  # seed 001 §5.2: full text only in debug rollout mode
    # held-out gold evaluation of the SFT and the PPO policy after training (`rlhf ppo
    # --heldout-store`, pipeline/ppo/heldout_gold.py): both sampled as PPO samples (temperature,
    # top_p, max_new_tokens above), the same as the eval stage and bench/economy/
    heldout_eval: bool = True
    eval_seed: int = 0
    # scale-out (pipeline/ppo/sharding.py): "none" = one process, or plain data parallel (DDP)
    # under torchrun / accelerate launch; "zero3" = the policy and the critic each their own
    # DeepSpeed ZeRO-3 engine, the reference an inference engine, settings from `rlhf ppo
    # --deepspeed-config` (configs/deepspeed_zero3.json: optimizer state offloaded to the CPU,
    # parameters not, fp16 communication; seed 000 §4.1, §5.5). Needs `pip install deepspeed`.
    sharding: Literal["none", "zero3"] = "none"
    # minibatches whose gradients add up to one optimiser step: a divisor of the minibatches per
    # PPO step (ppo_epochs x batch_size / mini_batch_size); with zero3 a multiple of the number
    # of processes (seed 000 §5.5)
    gradient_accumulation_steps: int = 1
    # LoRA (pipeline/ppo/lora.py): the policy trains as peft adapters, the reference is its base
    # with them switched off (no second copy), the critic per `critic` (docs/ppo.md)
    lora: LoraConfig = LoraConfig()
    # the keys of a feature registered after PPOConfig was built (a test's): (key, value) pairs
    extra: tuple[tuple[str, Any], ...] = ()

    def __getattr__(self, name: str):  # only reached when `name` is not a declared field
        if name.startswith("_"):
            raise AttributeError(name)
        from rlhf.pipeline.ppo.features.registry import declared_fields

        try:
            given = dict(object.__getattribute__(self, "extra"))
        except AttributeError:
            raise AttributeError(name) from None
        if name in given:
            return given[name]
        ext = declared_fields()
        if name in ext:
            return ext[name].default
        raise AttributeError(f"PPOConfig has no field {name!r}")

    @classmethod
    def split(cls, data: dict) -> dict:
        """`data` with the keys of features registered after PPOConfig was built moved into
        `extra` (types checked here, ranges in `__post_init__`)."""
        from rlhf.pipeline.config import _type_ok
        from rlhf.pipeline.ppo.features.registry import declared_fields

        ext, own = declared_fields(), {f.name for f in fields(cls)}
        moved = {k: v for k, v in data.items() if k not in own and k in ext}
        if not moved:
            return data
        for k, v in moved.items():
            if not _type_ok(v, ext[k].type):
                raise ConfigError(f"ppo.{k} must be {getattr(ext[k].type, '__name__', ext[k].type)}"
                                  f", got {v!r}")
        rest = {k: v for k, v in data.items() if k not in moved}
        return {**rest, "extra": tuple(sorted({**dict(rest.get("extra", ())), **moved}.items()))}

    @classmethod
    def declared_ranges(cls) -> dict[str, ranges.Spec]:
        """The ranges the features declare for their keys (ranges.of adds the loop's)."""
        from rlhf.pipeline.ppo.features.registry import declared_fields

        return {k: c.range for k, c in declared_fields().items() if c.range is not None}

    def __post_init__(self) -> None:
        for f in fields(self):  # YAML gives lists: keep tables hashable and immutable like the rest
            if isinstance(value := getattr(self, f.name), (list, tuple)):
                object.__setattr__(self, f.name, _tuples(value))
            elif isinstance(value, dict) and is_dataclass(f.default):  # a block from JSON (asdict)
                object.__setattr__(self, f.name, type(f.default)(**value))
        ranges.check_fields("ppo", self, ConfigError)
        self._check_batches()
        if self.lora.enabled and self.sharding != "none":
            raise ConfigError("ppo.lora with ppo.sharding zero3 is not supported: use sharding "
                              "none (one process or data parallel)")
        from rlhf.pipeline.ppo.features.registry import ordered

        for feature in ordered():
            if feature.check is not None:
                feature.check(self)

    def _check_batches(self) -> None:
        """How the batch divides: mini-batches, accumulation, groups (seed 000 §5.5)."""
        if self.batch_size % self.mini_batch_size:
            raise ConfigError(f"ppo.batch_size ({self.batch_size}) must be a multiple of "
                              f"ppo.mini_batch_size ({self.mini_batch_size})")
        if self.mini_batch_size < 2 and self.whiten_advantages:
            raise ConfigError("ppo.mini_batch_size must be >= 2 to whiten advantages")
        minibatches = self.ppo_epochs * (self.batch_size // self.mini_batch_size)
        if minibatches % self.gradient_accumulation_steps:
            raise ConfigError(f"ppo.gradient_accumulation_steps "
                              f"({self.gradient_accumulation_steps}) must divide the minibatches "
                              f"per PPO step (ppo_epochs x batch_size / mini_batch_size = "
                              f"{minibatches})")
        if self.batch_size % self.group_size:
            raise ConfigError(f"ppo.group_size ({self.group_size}) must be >= 1 and divide "
                              f"ppo.batch_size ({self.batch_size})")
        if self.advantage_estimator != "gae" and self.group_size < 2:
            raise ConfigError(f"ppo.advantage_estimator {self.advantage_estimator} needs "
                              f"ppo.group_size >= 2 samples of each prompt")


# the fields of the loop itself, owned by no feature (a test checks every field is one or the
# other, so a feature cannot add a field without declaring it)
CORE_FIELDS = tuple(PPOCore.__annotations__)


def _tuples(value):
    return tuple(_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


def _layout(features) -> list[tuple[str, Any]]:
    """(key, its ConfigField or None for a loop key) in PPOConfig's field order: the loop's keys,
    each followed by the keys of the features that follow it (`Feature.follows`, registration
    order), the other features' keys, then `extra`."""
    after: dict[str | None, list] = {}
    for f in features:
        if f.fields:
            after.setdefault(f.follows, []).append(f)
    out: list[tuple[str, Any]] = []

    def place(key: str, declared) -> None:
        out.append((key, declared))
        for f in after.pop(key, []):
            for c in f.fields:
                place(c.name, c)

    for key in CORE_FIELDS[:-1]:
        place(key, None)
    for f in after.pop(None, []):
        for c in f.fields:
            place(c.name, c)
    place(CORE_FIELDS[-1], None)
    if after:
        raise ValueError(f"feature(s) {', '.join(f.name for fs in after.values() for f in fs)} "
                         f"follow unknown ppo key(s) {', '.join(map(str, after))}")
    return out


def _build() -> type:
    """PPOConfig: PPOCore's fields with every registered feature's, a frozen dataclass."""
    from rlhf.pipeline.ppo.features import FEATURES  # imports (registers) every feature

    ns: dict[str, Any] = {"__module__": __name__, "__qualname__": "PPOConfig",
                          "__doc__": __doc__.split("\n")[0], "__annotations__": {}}
    declared = {}
    for key, c in _layout(FEATURES.values()):
        ns["__annotations__"][key] = PPOCore.__annotations__[key] if c is None else c.type
        ns[key] = getattr(PPOCore, key) if c is None else c.default
        if c is not None:
            declared[key] = c
    cls = dataclass(frozen=True)(type("PPOConfig", (PPOCore,), ns))
    cls.core, cls.feature_fields = PPOCore, declared  # the config reference reads both
    return cls


def with_values(cfg, **values):
    """`dataclasses.replace` that also sets late-registered features' keys (`PPOConfig.extra`)."""
    return replace(cfg, **type(cfg).split({**values, "extra": cfg.extra}))


def __getattr__(name: str):
    if name == "PPOConfig":  # built on first use: the features' modules import torch
        globals()[name] = _build()
        return globals()[name]
    if name == "PLAIN_PPO":  # the switches that make a run something other than plain PPO
        from rlhf.pipeline.ppo.features.registry import plain_values

        return plain_values()
    raise AttributeError(name)


def plain(cfg):
    """`cfg` with every feature switch at its plain-PPO value (budget, sampling, learning rates
    and the rest unchanged): the baseline every rollout-economy claim is a ratio against.
    Diagnostics that never change an update (gradnorm_diagnostics_on, debug_rollouts) are not
    switches."""
    from rlhf.pipeline.ppo.features.registry import plain_values

    return with_values(cfg, **plain_values())


def features_on(cfg) -> dict[str, object]:
    """{switch: value} of the switches where `cfg` differs from plain PPO."""
    from rlhf.pipeline.ppo.features.registry import plain_values

    return {k: getattr(cfg, k) for k, v in plain_values().items() if getattr(cfg, k) != v}


def check_gradient_accumulation(steps: int, world_size: int) -> None:
    """ConfigError unless gradient accumulation is a multiple of the world size (seed 000 §5.5:
    otherwise ZeRO-3's all-gathers do not line up with the update cadence)."""
    if steps < 1 or steps % world_size:
        raise ConfigError(f"gradient_accumulation_steps ({steps}) must be a positive multiple of "
                          f"the number of processes ({world_size}) (seed 000 §5.5)")
