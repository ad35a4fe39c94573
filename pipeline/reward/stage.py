"""The `reward` stage: the strong RM ensemble, its calibration, the distilled light RM, the report.

1. Expand the annotators' rankings (`preferences` table) into pairs; train `n_ensemble` RMs
   (seed 001 §5.1: three) with the pairwise trainer (reward/train.py: TRL RewardTrainer's
   objective, a prompt's pairs in one batch), each on its own bootstrap of the training
   prompts and seed. Backbone of the embedded default: all-MiniLM-L6-v2 with a fresh score head
   (`reward.backbone`; `sft` = the SFT policy).
2. References (each member's mean score of the SFT policy's responses) and the confidence
   temperature (fitted on one half of the held-out pairs); save `rm_strong` (scorer folder).
3. Sample rollouts from the SFT policy on pool prompts (with worker processes, pipeline/
   workers.py: in one of them while the members train), label them with the strong ensemble
   and distil the light RM (seed 001 §4.2); save `rm_light`; fit the strong-to-light score map
   on the rollouts and save it with `rm_strong`.
4. Report (reward/report.py): held-out pairwise accuracy (vs the annotators and vs the gold
   judge), accuracy by confidence bin, annotator drift by time window, and (`external_rm`) an
   RM trained and tested on the hh-rlhf pairs (the file's own train/test split).

The figures no later stage reads (each RM vs gold on fresh and on-policy samples, light vs
strong, the speed ratio, the hacked-twin probe) are `make report`'s: reward/figures.py.

    rlhf reward --preferences artifacts/store/preferences --sft artifacts/models/sft \
        --pool artifacts/store/pool --out-strong artifacts/models/rm_strong \
        --out-light artifacts/models/rm_light --metrics artifacts/metrics/reward.json
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rlhf.pipeline.reward.confidence import CONFIDENCE_GATE
from rlhf.pipeline.reward.distill import LightConfig
from rlhf.pipeline.reward.ensemble import save_tokenizer, train_strong
from rlhf.pipeline.reward.keep import checkpoints_of, fingerprint, folder_digest, kept_or_trained

# the report's steps (reward/report.py)
from rlhf.pipeline.reward.report import (
    _accuracy,
    _gold_pairs,
    _jsonable,
    _pair_margins,
    annotator_drift,
    external_accuracy,
)
from rlhf.pipeline.reward.train import RmTrainConfig


@dataclass(frozen=True)
class RewardConfig:
    """params.yaml `reward`."""

    n_ensemble: int = 3  # seed 001 §5.1: an ensemble of three RMs
    aggregation: str = "mean"  # "mean" or "min" (worst case), the scorer's default
    backbone: str = "sft"  # "sft": the SFT policy + a new score head; else a checkpoint / hub name
    bootstrap: bool = True  # each member trains on a bootstrap resample of the training prompts
    confidence_gate: float = CONFIDENCE_GATE  # seed 000 §3.4
    train: RmTrainConfig = field(default_factory=RmTrainConfig)
    light: LightConfig = field(default_factory=LightConfig)
    rollout_prompts: int = 300  # pool prompts (ppo split) sampled for the light RM's distillation
    rollout_k: int = 4  # responses per rollout prompt
    onpolicy_k: int = 6  # SFT samples per ppo-split prompt, at PPO's sampling settings, for the
    # headline on-policy Spearman of each RM vs gold (pipeline/reward/onpolicy.py); 0 = skip
    eval_prompts: int = 100  # unseen (eval-split) prompts for the RM-vs-gold Spearman
    eval_k: int = 2
    eval_demo_candidates: int = 0  # + demonstrations of the topic per eval prompt (needs --demos)
    distill_demo_candidates: int = 0  # + demonstrations per rollout prompt in the light RM's
    # distillation set: the strong RM's labels then span the quality range, not only the policy's
    temperature: float = 1.0  # sampling temperature of the rollouts
    max_new_tokens: int = 48
    batch_size: int = 64  # generation and scoring batch
    # the rollout engine that samples the SFT policy here (distillation rollouts, fresh and on-
    # policy samples; pipeline/decode get_generator): "native" (a stopped row leaves the batch; the
    # same distribution as "hf"), "hf" (model.generate) or "auto" (per device, the fastest exact
    # engine measured on that device kind: native on a CPU, hf on CUDA until the static step's GPU
    # figures exist, ppo.engine says why; recorded as resolved)
    engine: Literal["auto", "hf", "native"] = "native"
    drift_window_days: float = 1.0  # annotator drift report: mean label per window
    adversarial_fraction: float = 0.0  # share of training pairs perturbed and re-scored
    # the preferences rows the RMs train on, by `source`: the annotators' rankings (embedded
    # default) or human labels (realdata profile: hh-rlhf, oasst, queue)
    train_sources: list[str] = field(default_factory=lambda: ["annotator"])
    hack_fraction: float = 0.0  # share of the training rankings' responses given a hacked twin
    # (a sentence repeated, keyword salad, cut short: reward/augment.HACKS), re-scored by the judge
    distill_hacks: int = 0  # hacked twins added to each rollout prompt's group of SFT samples in
    # the light RM's distillation set (labelled by the strong RM like every other sample)
    external_sources: list[str] = field(default_factory=lambda: ["hh-rlhf"])
    external_train_pairs: int = 0  # 0 = every training pair of the external sources
    external_epochs: float = 1.0
    external_max_length: int = 192
    external_rm: bool = True  # train and test the side RM on `external_sources` (the report's
    # `external`); off: skipped (the embedded default: it is thrown away, ~1 min of the stage)
    precision: str = "fp32"  # the RMs' compute: fp32 | bf16 (autocast) | auto (bf16 where the
    # CPU has bf16 instructions; scorer.resolve_precision). Saved in scorer.json: PPO and eval
    # score in the precision the RM was trained and calibrated in
    seed: int = 0

    def __post_init__(self):
        if self.aggregation not in ("mean", "min"):
            raise ValueError("aggregation must be 'mean' or 'min'")
        from rlhf.pipeline import ranges
        from rlhf.pipeline.reward.scorer import PRECISIONS

        ranges.check_fields("reward", self)

        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")


# ---------------------------------------------------------------------------------------------
# small helpers


def _other_prompts(pool_dir, demos_path, exclude: set[str]) -> tuple[list[str], list[str]]:
    """(rollout prompts, eval prompts): the pool's ppo and eval splits, or, without a pool, the
    demonstration prompts not used for preferences, split in two by hash."""

    if pool_dir is not None and Path(pool_dir).is_dir():
        from rlhf.store.io import read_table

        rows = read_table("pool", pool_dir).select(["prompt_id", "text", "split"]).to_pylist()
        rows.sort(key=lambda r: r["prompt_id"])
        return ([r["text"] for r in rows if r["split"] == "ppo"],
                [r["text"] for r in rows if r["split"] == "eval"])
    if demos_path is None:
        raise ValueError("give --pool or --demos for the rollout and evaluation prompts")
    from rlhf.pipeline.preferences import prompts_from_demonstrations

    return ([t for pid, t in prompts_from_demonstrations(demos_path, "ppo") if pid not in exclude],
            [t for pid, t in prompts_from_demonstrations(demos_path, "eval") if pid not in exclude])


def _cap(prompts: list[str], n: int, salt: str) -> list[str]:
    from rlhf.store.hashing import hash_fraction as _fraction

    if n and len(prompts) > n:
        prompts = sorted(prompts, key=lambda t: _fraction(salt + t))[:n]
    return prompts


# ---------------------------------------------------------------------------------------------
# report pieces


def eval_prompts_of(cfg: RewardConfig, pool_dir, demos_path, exclude: set[str]
                    ) -> tuple[list[str], list[str]]:
    """(rollout prompts, eval prompts) capped by `rollout_prompts` / `eval_prompts`."""
    rollout_prompts, eval_prompts = _other_prompts(pool_dir, demos_path, exclude)
    return (_cap(rollout_prompts, cfg.rollout_prompts, "roll:"),
            _cap(eval_prompts, cfg.eval_prompts, "eval:"))


def hack_pairs(cfg: RewardConfig, ann_rows: Sequence[dict], judge) -> list[dict]:
    """Training pairs (response, hacked twin) for `hack_fraction` of the training rankings'
    distinct responses, ordered by the judge (reward/augment.hack_twins)."""
    if not cfg.hack_fraction:
        return []
    from rlhf.pipeline.reward.augment import hack_twins

    seen = sorted({(r["prompt"], r["response"]) for r in ann_rows if r["split"] == "train"})
    out = hack_twins([p for p, _ in seen], [r for _, r in seen], cfg.hack_fraction, judge,
                     seed=cfg.seed + 5)
    for p in out:
        p.update(prompt_id="hack:" + p["prompt"], split="train")
    return out


# ---------------------------------------------------------------------------------------------
# the stage


@dataclass
class TrainingData:
    """What the RMs learn from: the train-source rankings and their pairs."""

    rows: list[dict]  # every row of the preferences table (drift reads them all)
    ann_rows: list[dict]  # the rows of reward.train_sources
    train_pairs: list[dict]  # + adversarial and hacked-twin pairs
    held_pairs: list[dict]
    report: dict[str, Any]


def training_data(cfg: RewardConfig, preferences_dir, judge) -> TrainingData:
    """Step 1: the rankings of `reward.train_sources` as pairs, plus the adversarial pairs and
    the hacked twins (reward/augment.py), each ordered by the judge."""
    from rlhf.pipeline.preferences import expand_pairs
    from rlhf.store.io import read_table

    rows = read_table("preferences", preferences_dir).to_pylist()
    ann_rows = [r for r in rows if r["source"] in cfg.train_sources]
    if not ann_rows:
        raise ValueError(f"no rankings from {cfg.train_sources} (reward.train_sources) in "
                         f"{preferences_dir}")
    pairs = expand_pairs(ann_rows)
    train_pairs = [p for p in pairs if p["split"] == "train"]
    held_pairs = [p for p in pairs if p["split"] == "heldout"]
    if not train_pairs or not held_pairs:
        raise ValueError("need annotator pairs in both the train and the heldout split")
    extra = []
    if cfg.adversarial_fraction > 0:
        from rlhf.pipeline.reward.augment import augment_pairs

        extra = augment_pairs(train_pairs, cfg.adversarial_fraction, judge, seed=cfg.seed)
        for p in extra:
            p.update(prompt_id="adv:" + p["prompt"], split="train")
    hacks = hack_pairs(cfg, ann_rows, judge)
    train_pairs = train_pairs + extra + hacks
    return TrainingData(rows, ann_rows, train_pairs, held_pairs, {
        "n_train_pairs": len(train_pairs), "n_heldout_pairs": len(held_pairs),
        "n_adversarial_pairs": len(extra), "n_hack_pairs": len(hacks)})


def _calibration_halves(held_pairs: list[dict]) -> tuple[list[dict], list[dict]]:
    """The held-out pairs that fit the confidence temperature, and the ones that report on it
    (split by prompt hash; either falls back to all of them when empty)."""
    from rlhf.store.hashing import hash_fraction

    calib = [p for p in held_pairs if hash_fraction("calib:" + p["prompt_id"]) < 0.5]
    report = [p for p in held_pairs if hash_fraction("calib:" + p["prompt_id"]) >= 0.5]
    return calib or held_pairs, report or held_pairs


def calibrate_strong(cfg: RewardConfig, members: list, names: list[str], tok, data: TrainingData,
                     folder: Path, precision: str = "fp32"):
    """Step 3: references (each member's mean score of the train-split responses), the
    confidence temperature; saves the scorer file. Returns (strong scorer, report)."""
    from rlhf.pipeline.reward.confidence import accuracy_by_confidence, fit_temperature
    from rlhf.pipeline.reward.scorer import RMEnsemble, save_scorer

    ref_prompts, ref_resps = _references(data)
    raw = RMEnsemble(members, tok, [0.0] * len(members), 1.0, cfg.aggregation,
                     cfg.train.max_length, cfg.batch_size, cfg.confidence_gate,
                     precision=precision)
    raw.memo = {}  # raw scores: shared with `strong`, which only subtracts the references
    references = raw.member_rewards(ref_prompts, ref_resps).mean(dim=1).tolist()
    strong = RMEnsemble(members, tok, references, 1.0, cfg.aggregation, cfg.train.max_length,
                        cfg.batch_size, cfg.confidence_gate, precision=precision)
    strong.memo = raw.memo  # the report scores the same texts several ways: once each
    held = data.held_pairs
    calib, report_half = _calibration_halves(held)
    strong.temperature = fit_temperature(_pair_margins(strong, calib))
    save_scorer(folder, names, references, strong.temperature, cfg.aggregation,
                cfg.train.max_length, {"kind": "strong", "n_params": strong.n_params}, precision,
                gate=cfg.confidence_gate)
    margins = _pair_margins(strong, held)  # [members, pairs]
    gold_held = _gold_pairs(held)
    gold_margins = _pair_margins(strong, gold_held)
    return strong, {
        "temperature": strong.temperature,
        "references": references,
        "heldout_accuracy_members": [_accuracy(m) for m in margins],
        "heldout_accuracy_mean": _accuracy(margins.mean(0)),
        "heldout_accuracy_min": _accuracy(margins.min(0).values),
        "heldout_accuracy_vs_gold": _accuracy(gold_margins.mean(0)),
        "annotator_heldout_agreement_with_gold": (
            sum(p["gold_chosen"] > p["gold_rejected"] for p in gold_held) / len(gold_held)
            if gold_held else None),
        "accuracy_by_confidence": accuracy_by_confidence(_pair_margins(strong, report_half),
                                                         strong.temperature),
        "accuracy_by_confidence_vs_gold": accuracy_by_confidence(gold_margins,
                                                                 strong.temperature),
    }


def _references(data: TrainingData) -> tuple[list[str], list[str]]:
    """The train-split (prompt, response) texts whose mean score is each RM's zero."""
    rows = [r for r in data.ann_rows if r["split"] == "train"]
    return [r["prompt"] for r in rows], [r["response"] for r in rows]


def distill_light(cfg: RewardConfig, strong, strong_member: Path, light_tok, rollouts,
                  rollout_prompts: Sequence[str], data: TrainingData, sft_dir, demos_path,
                  folder: Path, out_strong: Path, log,
                  checkpoints: Path | None = None, trackers=None, compute=None):
    """Step 4: the SFT `rollouts` of `rollout_prompts` (distill.distill_rollouts; + hacked
    twins) labelled by the strong RM, the light RM distilled on them, its reference and
    temperature; saved to `folder`; the strong-to-light score map fitted on the rollouts
    (score_map.fit_on_rollouts), saved beside the strong members. Returns (light scorer, report).
    With `checkpoints`, the distilled model is kept there (reward/keep.py) and a rerun after a
    kill loads it instead of distilling again."""
    from rlhf.pipeline.config import effective
    from rlhf.pipeline.reward.confidence import fit_temperature
    from rlhf.pipeline.reward.distill import build_light, distill, distill_set
    from rlhf.pipeline.reward.scorer import RMEnsemble, encode_texts, save_scorer

    # the sampling and the strong RM's labels run in every run, a resumed one too: the strong
    # scorer memoises what it scored, and a text scored in another batch can differ in its last
    # bits, so skipping them would change the figures the report scores later
    d_prompts, d_resps, groups, on_policy = distill_set(cfg, None, None, rollout_prompts,
                                                        data.ann_rows, demos_path,
                                                        rollouts=rollouts)
    targets, _ = strong(d_prompts, d_resps)
    ids = encode_texts(light_tok, d_prompts, d_resps, cfg.train.max_length)

    def train():
        log(f"distilling the light RM on {len(ids)} strong-RM labels")
        model, hist = distill(build_light(cfg.light, str(sft_dir), cfg.seed, str(strong_member),
                                          compute),
                              light_tok, ids, targets, groups, cfg.light, seed=cfg.seed,
                              precision=strong.precision)
        if trackers is not None:
            trackers.log_history("reward/light", hist)
        return model, {"distill_final_loss": hist[-1]["loss"] if hist else None}

    # what the light RM is distilled from: this section, the strong member it starts from, the
    # SFT policy (its layers, with init sft), and the labelled samples themselves
    inputs = fingerprint({"reward": effective(cfg), "strong": folder_digest(strong_member),
                          "sft": folder_digest(sft_dir), "ids": ids, "groups": groups,
                          "targets": [float(t) for t in targets]})
    t0 = time.perf_counter()
    light_model, trained, _ = kept_or_trained(checkpoints, "light", inputs, train, log,
                                              "light RM", compute)
    seconds = round(time.perf_counter() - t0, 1)
    ref_prompts, ref_resps = _references(data)
    light_raw = RMEnsemble([light_model], light_tok, [0.0], 1.0, "mean", cfg.train.max_length,
                           cfg.batch_size, cfg.confidence_gate, precision=strong.precision)
    light_ref = float(light_raw.member_rewards(ref_prompts, ref_resps).mean())
    light = RMEnsemble([light_model], light_tok, [light_ref], 1.0, "mean", cfg.train.max_length,
                       cfg.batch_size, cfg.confidence_gate, precision=strong.precision)
    calib, _ = _calibration_halves(data.held_pairs)
    light.temperature = fit_temperature(_pair_margins(light, calib))
    light_model.save_pretrained(folder)
    save_tokenizer(light_tok, folder)
    save_scorer(folder, ["."], [light_ref], light.temperature, "mean", cfg.train.max_length,
                {"kind": "light", "n_params": light.n_params, "distilled_from": str(out_strong)},
                strong.precision, gate=cfg.confidence_gate)
    from rlhf.pipeline.reward.score_map import fit_on_rollouts

    score_map = fit_on_rollouts([float(targets[i]) for i in on_policy], light,
                                [d_prompts[i] for i in on_policy], [d_resps[i] for i in on_policy],
                                strong_member.parent)
    return light, {
        "score_map": score_map,
        "light_train_seconds": seconds,
        "n_distill_samples": len(ids),
        **trained,
        "light_heldout_accuracy": _accuracy(_pair_margins(light, data.held_pairs)[0]),
        "light_heldout_accuracy_vs_gold": _accuracy(
            _pair_margins(light, _gold_pairs(data.held_pairs))[0]),
        "light_temperature": light.temperature,
    }


class _Phases:
    """Wall seconds per named step (the report's `phase_seconds`: where the stage's time goes)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def __call__(self, name: str, fn, *args, **kwargs):
        t = time.perf_counter()
        out = fn(*args, **kwargs)
        self.seconds[name] = round(time.perf_counter() - t, 1)
        return out


def run(cfg: RewardConfig, preferences_dir: str | Path, sft_dir: str | Path,
        out_strong: str | Path, out_light: str | Path, metrics_path: str | Path | None = None,
        pool_dir: str | Path | None = None, demos_path: str | Path | None = None,
        judge: Callable[[str, str], float] | None = None,
        log: Callable[[str], None] = lambda msg: None, ppo_sampling=None,
        tracking=None, compute=None) -> dict[str, Any]:
    """Train, calibrate, distil and report, step by step (the functions above, in order); the
    report's `phase_seconds` times each. `ppo_sampling` (generation.Sampling): how PPO will
    sample (the ppo section's temperature / top_p / max_new_tokens), for the distillation
    rollouts; None: this section's temperature, top-p 1. `tracking` (params.yaml `tracking`; None: no
    tracker): the trackers that get each member's and the light RM's training losses, then the
    report's figures (files in `tracking.logs_dir(out_strong, "reward")`). `compute`: where and
    in what dtype the RMs train and score and the SFT policy samples (pipeline/models/compute.py; None:
    float32 on the CPU)."""
    from rlhf.pipeline import tracking as tr
    import torch
    from rlhf.pipeline.config import effective
    from rlhf.pipeline.models.policy import load_tokenizer, quiet_hf
    from rlhf.pipeline.reward.distill import sft_rollouts
    from rlhf.pipeline.reward.scorer import resolve_precision
    from rlhf.pipeline.reward.train import resolve_backbone
    from rlhf.pipeline.workers import worker_pool
    from rlhf.store.io import staged_folders, write_text_atomic

    quiet_hf()
    t_start = time.perf_counter()
    torch.manual_seed(cfg.seed)
    if judge is None:
        from rlhf.pipeline.world.judge import gold_score as judge
    step = _Phases()
    trackers = tr.start(tracking or tr.TrackingConfig(report_to=()), "reward",
                        tr.logs_dir(out_strong, "reward"), {"reward": effective(cfg)})
    data = step("training_pairs", training_data, cfg, preferences_dir, judge)
    init = resolve_backbone(cfg.backbone, sft_dir)
    tok = load_tokenizer(init)  # the strong RM's (its backbone's) tokenizer
    # the light RM: layers of the SFT policy (the policy's tokenizer) or of the strong RM (its own)
    light_tok = tok if cfg.light.init == "strong" else load_tokenizer(sft_dir)
    precision = resolve_precision(cfg.precision)
    metrics: dict[str, Any] = {**data.report, "backbone": cfg.backbone, "precision": precision,
                               "judge": getattr(judge, "name", "world_gold"),
                               "params": effective(cfg), "confidence_gate": cfg.confidence_gate}

    # Both RM folders are written into hidden staging folders and swapped in together at the end
    # (store.io.staged_folders): a killed or failed run never leaves a half-written RM visible,
    # and the previous RMs stay whole until the new ones are complete.
    out_strong, out_light = Path(out_strong), Path(out_light)
    with staged_folders([out_strong, out_light]) as staged, \
            worker_pool(cfg.n_ensemble + 1) as workers:
        strong_dir, light_dir = staged[out_strong], staged[out_light]
        exclude = {r["prompt_id"] for r in data.ann_rows}
        rollout_prompts, _ = eval_prompts_of(cfg, pool_dir, demos_path, exclude)
        log(f"sampling {len(rollout_prompts)} x {cfg.rollout_k} rollouts for distillation"
            + (" in a worker process" if workers is not None else ""))
        # the rollouts need the SFT policy only (the strong RM labels them later): a worker
        # draws them while the members train (3 members on 2 cores leave one core idle)
        drawing = (workers.submit(sft_rollouts, cfg, sft_dir, rollout_prompts, ppo_sampling,
                                  compute) if workers is not None else None)
        members, names = step("strong_ensemble", train_strong, cfg, init, tok, data.train_pairs,
                              strong_dir, log, precision, checkpoints_of(out_strong),
                              trackers, compute, workers)
        metrics["strong_train_seconds"] = step.seconds["strong_ensemble"]
        strong, report = step("strong_calibration", calibrate_strong, cfg, members, names, tok,
                              data, strong_dir, precision)
        metrics.update(report)
        rollouts = (step("distill_rollouts", drawing.result) if drawing is not None else
                    step("distill_rollouts", sft_rollouts, cfg, sft_dir, rollout_prompts,
                         ppo_sampling, compute))
        _, report = step("light_distillation", distill_light, cfg, strong,
                         strong_dir / names[0], light_tok, rollouts, rollout_prompts, data,
                         sft_dir, demos_path, light_dir, out_strong, log,
                         checkpoints_of(out_strong), trackers, compute)
        metrics.update(report)
        metrics["annotator_drift"] = annotator_drift(data.rows, cfg.drift_window_days)
        metrics["external"] = (
            step("external_rm", external_accuracy, cfg, data.rows, init, tok, strong, log,
                 checkpoints_of(out_strong))
            if cfg.external_rm else {"skipped": "reward.external_rm is off"})
    shutil.rmtree(checkpoints_of(out_strong), ignore_errors=True)  # both RMs are whole
    metrics["phase_seconds"] = step.seconds
    metrics["seconds"] = round(time.perf_counter() - t_start, 1)
    trackers.log({f"reward/{k}": v for k, v in metrics.items()}, trackers.last_step)
    trackers.finish()
    if metrics_path:
        write_text_atomic(metrics_path, json.dumps(_jsonable(metrics), indent=2, sort_keys=True)
                          + "\n")
    return metrics

