"""The allowed range of every numeric parameter, one table per config dataclass.

`config.build` checks each numeric value a params file gives against `of(Class)[key]`
before the dataclass is built, so a bad value is one line naming `section.key`, the value and
the range (`ppo.kl_coef = -0.1: allowed >= 0`), never a traceback and never a silent pass.
Every float must be finite (NaN and +-inf are errors whatever the range). A range covers each
value of a mapping (`world.source_mix`) and each element of a tuple (`eval.checkpoints`); a
tuple of ranges covers the columns of a table's rows (`ppo.lambda_eps_table`).

Cross-field rules (a batch that is a multiple of its mini-batch, fractions that leave room for
training) stay in each dataclass's `__post_init__`; this table holds what one value alone must
satisfy, and `__post_init__` checks it with `check_fields`, so a config built in code obeys the
same bounds as one read from a params file and each bound is written once. A numeric field of a
config dataclass that has no entry here fails tests/test_params_ranges.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Range:
    """An interval of the real line: `lo`/`hi` None for unbounded, `*_open` to exclude them."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    why: str = ""  # the reason for a bound, quoted in the error (a seed section)

    def allows(self, x: float) -> bool:
        if not math.isfinite(x):
            return False
        above = self.lo is None or (x > self.lo if self.lo_open else x >= self.lo)
        below = self.hi is None or (x < self.hi if self.hi_open else x <= self.hi)
        return above and below

    def __str__(self) -> str:
        if self.lo is not None and self.hi is not None:
            return (f"in {'(' if self.lo_open else '['}{self.lo:g}, "
                    f"{self.hi:g}{')' if self.hi_open else ']'}")
        if self.lo is not None:
            return f"{'>' if self.lo_open else '>='} {self.lo:g}"
        if self.hi is not None:
            return f"{'<' if self.hi_open else '<='} {self.hi:g}"
        return "any finite number"

    def excluded(self) -> list[float]:
        """Values this range rejects, for the tests: NaN, +-inf and the values just outside."""
        out = [math.nan, math.inf, -math.inf]
        if self.lo is not None:
            out += [self.lo] if self.lo_open else [self.lo - 1]
        if self.hi is not None:
            out += [self.hi] if self.hi_open else [self.hi + 1]
        return out


COUNT = Range(1)                           # a size or count where 0 would mean nothing
NONNEG = Range(0)                          # a count where 0 means "off" / "all", a seed, a weight
POS = Range(0, lo_open=True)               # a rate, a temperature, a step size
PROB = Range(0, 1)                         # a probability or fraction
FRACTION_LT1 = Range(0, 1, hi_open=True)   # a fraction that must leave something over
TOP_P = Range(0, 1, lo_open=True)          # nucleus mass: 0 would keep no token
FINITE = Range()                           # any finite number (a signed bias)

Spec = Range | tuple[Range, ...]

_MODEL_SHAPE = {k: COUNT for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                   "num_attention_heads", "num_key_value_heads",
                                   "max_position_embeddings")}

RANGES: dict[str, dict[str, Spec]] = {
    "WorldConfig": {
        "seed": NONNEG, "n_prompts": COUNT, "source_mix": NONNEG, "defect_rate": FRACTION_LT1,
        "exact_dup_rate": FRACTION_LT1, "paraphrase_rate": FRACTION_LT1,
        "long_prompt_words": Range(300), "n_demos": COUNT, "demo_mix": NONNEG,
        "tokenizer_vocab": Range(300, 50000),
    },
    "ModelShape": _MODEL_SHAPE,
    "IngestConfig": {
        "min_preference": PROB, "adapter_preference_score": PROB,
        "phone_min_digits": COUNT, "phone_intl_min_digits": COUNT, "phone_max_digits": COUNT,
        "indented_code_min_lines": COUNT, "max_tokens": COUNT, "max_chars": COUNT,
        "max_line_bytes": COUNT, "batch_rows": COUNT, "rows_per_shard": COUNT,
        "raw_max_chars": COUNT,
    },
    "DedupConfig": {
        "batch_size": COUNT,
        "distance_threshold": Range(0, 2, lo_open=True, hi_open=True, why="a cosine distance"),
        "exact_max_size": Range(2), "partition_size": Range(2), "merge_partitions": NONNEG,
        "topic_clusters": COUNT, "split_fractions": PROB, "seed": NONNEG,
        "rows_per_shard": COUNT,
        # the index path (close-pair graph): rows per list, lists probed, PCA dimensions (0: all),
        # cosine slack before the float re-check, exact-linkage cap
        "ann_list_size": COUNT, "ann_probe": COUNT, "ann_dim": NONNEG,
        "ann_margin": Range(0, 2, hi_open=True), "component_max_size": Range(2),
    },
    # PPOConfig (pipeline/ppo/config.py): the loop's own fields; each feature declares the range
    # of its keys next to its code (pipeline/ppo/features/*.py ConfigField), and `of` joins them
    "PPOConfig": {
        "seed": NONNEG, "total_steps": COUNT, "total_tokens": NONNEG, "batch_size": COUNT,
        "mini_batch_size": COUNT, "ppo_epochs": COUNT,
        "temperature": Range(0.3, lo_open=True, why="seed 001 §5.1: lower sampling temperatures "
                             "make rollouts repeat themselves"),
        "top_p": Range(0, 0.95, lo_open=True, why="seed 001 §5.1"),
        "max_new_tokens": COUNT, "max_prompt_tokens": COUNT, "generation_timeout_s": POS,
        "learning_rate": POS, "critic_learning_rate": POS, "max_grad_norm": POS,
        "gamma": PROB, "gae_lambda": PROB, "clip_range": POS, "clip_range_value": POS,
        "kl_coef": NONNEG, "group_size": COUNT,
        "gradnorm_reference_steps": COUNT, "gradnorm_shift_decades": FINITE,
        "gradnorm_bimodal_separation": POS, "critic_huber_delta": POS, "critic_kl_reg_coef": NONNEG,
        "checkpoint_every": COUNT, "csv_every": COUNT, "eval_seed": NONNEG,
        "gradient_accumulation_steps": COUNT,
    },
    "SftConfig": {
        "lora_r": COUNT, "lora_alpha": COUNT, "epochs": POS, "learning_rate": POS,
        "batch_size": COUNT, "max_length": COUNT, "warmup_ratio": FRACTION_LT1,
        "weight_decay": NONNEG, "heldout_fraction": FRACTION_LT1, "eval_prompts": NONNEG,
        "eval_max_new_tokens": COUNT, "eval_temperature": POS, "seed": NONNEG,
    },
    "PreferencesConfig": {
        "gold_fraction": FRACTION_LT1, "demo_candidates": NONNEG,
        "k": Range(3, why="seed 000 §3.4: at least 3 responses per prompt"),
        "max_prompts": NONNEG, "temperature": POS, "top_p": TOP_P, "max_new_tokens": COUNT,
        "batch_size": COUNT, "heldout_fraction": FRACTION_LT1, "seed": NONNEG,
        "hh_heldout_fraction": FRACTION_LT1, "hh_max_pairs": NONNEG,
    },
    "AnnotatorConfig": {
        "n_annotators": COUNT, "noise_std": NONNEG, "bias": FINITE, "drift_per_day": NONNEG,
        "labels_per_day": COUNT,
    },
    "RewardConfig": {
        "n_ensemble": COUNT, "confidence_gate": PROB, "rollout_prompts": NONNEG,
        "rollout_k": COUNT, "onpolicy_k": COUNT, "eval_prompts": NONNEG, "eval_k": COUNT,
        "eval_demo_candidates": NONNEG, "distill_demo_candidates": NONNEG, "temperature": POS,
        "max_new_tokens": COUNT, "batch_size": COUNT, "drift_window_days": POS,
        "adversarial_fraction": PROB, "hack_fraction": PROB, "distill_hacks": NONNEG,
        "external_train_pairs": NONNEG, "external_epochs": POS, "external_max_length": COUNT,
        "seed": NONNEG,
    },
    "LoraConfig": {"r": COUNT, "alpha": POS, "dropout": FRACTION_LT1},
    "RmTrainConfig": {
        "epochs": POS, "learning_rate": POS, "batch_size": COUNT, "max_length": COUNT,
        "warmup_ratio": FRACTION_LT1, "weight_decay": NONNEG,
        "center_rewards_coefficient": NONNEG,
    },
    "LightConfig": {
        "num_layers": COUNT, "hidden_size": COUNT, "intermediate_size": COUNT,
        "num_heads": COUNT, "epochs": COUNT, "learning_rate": POS, "groups_per_batch": COUNT,
        "listwise_weight": NONNEG, "mse_weight": NONNEG, "distill_temperature": POS,
    },
    "DifficultyConfig": {
        "w_length": NONNEG, "w_logprob_std": NONNEG, "w_rm": NONNEG,
        "clip_quantile": Range(0, 0.5, hi_open=True), "max_new_tokens": COUNT,
        "temperature": POS, "top_p": TOP_P, "batch_size": COUNT, "seed": NONNEG,
        "sampler_batch_size": COUNT,
    },
    "RouterConfig": {
        "l2": POS, "steps": COUNT, "held_out_fraction": Range(0, 1, lo_open=True, hi_open=True),
        "split_repeats": NONNEG, "bootstrap": NONNEG, "timing_repeats": COUNT, "seed": NONNEG,
        "max_new_tokens": COUNT,
    },
    "EvalConfig": {
        "seed": NONNEG, "max_new_tokens": COUNT, "max_prompt_tokens": COUNT,
        "n_prompts": NONNEG, "checkpoints": NONNEG, "batch_size": COUNT,
        "repetition_ngram": COUNT,
    },
    "JudgeConfig": {"batch_size": COUNT, "max_length": COUNT, "seed": NONNEG},
    "DemosConfig": {"max_demos": NONNEG, "tokenizer_vocab": Range(300, 50000)},
}


def of(cls: type) -> dict[str, Spec]:
    """The ranges of config class `cls`'s fields: its table above, joined with those its fields
    declare themselves (`cls.declared_ranges()`: PPOConfig's feature keys)."""
    declared = getattr(cls, "declared_ranges", None)
    return {**RANGES.get(cls.__name__, {}), **(declared() if declared else {})}


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def check(where: str, key: str, value: Any, spec: Spec) -> str | None:
    """The one-line error for `value` of `where.key` outside `spec`, or None when it is inside.
    Types are checked before this: a mapping or tuple here holds numbers."""
    def bad(path: str, x: Any, rng: Range) -> str | None:
        if _number(x) and not rng.allows(x):
            return f"{path} = {x!r}: allowed {rng}" + (f" ({rng.why})" if rng.why else "")
        return None

    path = f"{where}.{key}"
    if isinstance(value, dict):
        for k, v in value.items():
            if (msg := bad(f"{path}.{k}", v, spec if isinstance(spec, Range) else FINITE)):
                return msg
        return None
    if isinstance(value, (list, tuple)):
        for i, row in enumerate(value):
            if isinstance(spec, tuple) and isinstance(row, (list, tuple)):
                for rng, x in zip(spec, row):
                    if (msg := bad(f"{path}[{i}]", x, rng)):
                        return msg
            elif isinstance(spec, Range) and (msg := bad(f"{path}[{i}]", row, spec)):
                return msg
        return None
    return bad(path, value, spec if isinstance(spec, Range) else FINITE)


def check_fields(where: str, cfg: Any, error: type[Exception] = ValueError) -> None:
    """Raise `error` (one line, as `check` words it) for the first field of config dataclass
    `cfg` outside its range (`of(type(cfg))`); `where` is its params section. Each config's
    `__post_init__` calls it before its cross-field rules."""
    for name, spec in of(type(cfg)).items():
        if (msg := check(where, name, getattr(cfg, name), spec)):
            raise error(msg)
