"""The preferences stage's settings (params.yaml `preferences`) and its hashed splits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rlhf.pipeline import ranges
from rlhf.store.hashing import hashed_split


@dataclass(frozen=True)
class AnnotatorConfig:
    """The simulated annotator pool (the world's `AnnotatorPool` arguments)."""

    n_annotators: int = 5
    noise_std: float = 0.4  # per-label noise on the 0-5 scale
    bias: dict[str, float] = field(default_factory=dict)  # annotator id -> constant offset
    drift_per_day: float = 0.02  # systematic drift of the labels per day (seed 001 §3.1)
    start: str = "2026-01-05"  # first labelling day (UTC)
    labels_per_day: int = 100  # rankings per day: how fast the campaign's clock advances

    def __post_init__(self):
        ranges.check_fields("annotators", self)


@dataclass(frozen=True)
class PreferencesConfig:
    """params.yaml `preferences`."""

    labels: str = "annotators"  # annotators: the world's pool ranks SFT samples; human: human
    # labels only (ingest's external_pairs + annotation queue files), no policy sampling
    gold_fraction: float = 0.0  # human labels: share of prompts whose labels train only the
    # held-out gold RM (split "gold", Gao et al. 2022); 0 = none
    k: int = 4  # policy responses per prompt (seed 000 §3.4: at least 3)
    demo_candidates: int = 0  # + this many demonstration responses of the prompt's topic
    max_prompts: int = 0  # 0 = every reward-split prompt
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 48
    batch_size: int = 64
    # the rollout engine that samples (pipeline/decode get_generator): "native" (a stopped row
    # leaves the batch; the same distribution as "hf"), "hf" (model.generate) or "auto" (per device,
    # the fastest exact engine measured on that device kind: native on a CPU, hf on CUDA until the
    # static step's GPU figures exist, ppo.engine says why; recorded as resolved)
    engine: Literal["auto", "hf", "native"] = "native"
    heldout_fraction: float = 0.15  # prompts whose rankings are kept for RM evaluation
    seed: int = 0
    annotators: AnnotatorConfig = field(default_factory=AnnotatorConfig)
    hh_heldout_fraction: float = 0.2  # the hh-rlhf file's own train/test split, by pair hash
    hh_max_pairs: int = 0  # 0 = all pairs of the file
    include_oasst: bool = True

    def __post_init__(self):
        ranges.check_fields("preferences", self)
        if self.labels not in ("annotators", "human"):
            raise ValueError("labels must be 'annotators' or 'human'")
        if self.gold_fraction + self.heldout_fraction >= 1:
            raise ValueError("gold_fraction must leave room for training "
                             "(gold_fraction + heldout_fraction < 1)")


def heldout_or_train(key: str, fraction: float) -> str:
    """'heldout' for a stable `fraction` of keys, else 'train'."""
    return hashed_split(key, (("heldout", fraction), ("train", 1.0 - fraction)))


def split_of(prompt_id: str, fraction: float) -> str:
    """'heldout' for a stable `fraction` of prompt ids, else 'train'."""
    return heldout_or_train("pref:" + prompt_id, fraction)
