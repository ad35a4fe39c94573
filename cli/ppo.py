"""`rlhf ppo`: train the policy with PPO against a reward model (pipeline/ppo/trainer.py).

    rlhf ppo --policy artifacts/models/sft --reward artifacts/models/rm_light \
        --strong-reward artifacts/models/rm_strong \
        --prompts artifacts/store/pool --out artifacts/ppo --rollouts artifacts/store/rollouts \
        --rm-scores artifacts/store/rm_scores --train-metrics artifacts/store/train_metrics \
        --checkpoint-table artifacts/store/checkpoints --difficulty artifacts/store/difficulty \
        --heldout-store artifacts/store \
        --embeddings artifacts/store/pool_embeddings --schedule artifacts/store/schedule
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from rlhf.cli.common import (METRICS, PARAMS, REPORT, fail, judge_or_fail, load_config,
                             write_metrics)


def ppo(
    policy: Path = typer.Option(..., help="Policy checkpoint (save_pretrained folder + tokenizer)."),
    reward: Path = typer.Option(..., help="Reward model (AutoModelForSequenceClassification)."),
    strong_reward: Path | None = typer.Option(
        None, help="Strong RM folder: re-scores the rollouts a Level-2 trigger picks "
                   "(ppo.escalate_*; seed 001 §4.1), through its score_map.json onto the light "
                   "RM's scale with ppo.escalate_map fitted; labels RM evolution's checks."),
    prompts: Path = typer.Option(..., help="`pool` table folder (split ppo) or a JSONL file."),
    out: Path = typer.Option(..., help="Run folder: checkpoints, logs, final policy."),
    rollouts: Path = typer.Option(..., help="The `rollouts` table folder."),
    rm_scores: Path | None = typer.Option(
        None, help="The `rm_scores` table folder: every RM score PPO uses (rlhf audit rm)."),
    train_metrics: Path | None = typer.Option(
        None, help="The `train_metrics` table folder: the six metrics of every CSV line."),
    checkpoint_table: Path | None = typer.Option(
        None, help="The `checkpoints` table folder: one row per saved checkpoint (lineage audit)."),
    difficulty: Path | None = typer.Option(
        None, help="`difficulty` table folder: stratified batches (bucket x topic cluster)."),
    embeddings: Path | None = typer.Option(
        None, help="`pool_embeddings` table folder (dedup stage): the prompt space of the "
                   "rollout scheduler (ppo.schedule_on; seed 001 §4.3)."),
    schedule: Path | None = typer.Option(
        None, help="The `schedule` table folder: every rollout-scheduler decision "
                   "(rlhf audit schedule)."),
    routes: Path | None = typer.Option(
        None, help="Level 0's `routes` table folder (the route stage): per-prompt token budget "
                   "(ppo.route_budget_on) and high-risk topic (ppo.escalate_high_risk)."),
    human_labels: Path | None = typer.Option(
        None, help="The `human_labels` table folder: the human queue's annotator labels "
                   "(ppo.human_labels_per_step; rlhf audit annotators)."),
    heldout_store: Path | None = typer.Option(
        None, help="Store root (pool + similar): gold-judge SFT vs PPO on the held-out prompts."),
    judge_model: Path | None = typer.Option(
        None, help="The held-out figure's judge RM folder (judge.kind heldout_rm: what `rlhf "
                   "judge` wrote; kind rm: overrides judge.model)."),
    params: Path = PARAMS,
    run_id: str = typer.Option("", help="Run id in the rollout rows (default: the --out name)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last checkpoint."),
    metrics: Path | None = METRICS,
    report_path: Path | None = REPORT,
    deepspeed_config: Path = typer.Option(
        Path("configs/deepspeed_zero3.json"),
        help="DeepSpeed JSON for ppo.sharding: zero3 (\"auto\" fields filled from params)."),
) -> None:
    """Train the policy with PPO; `--resume` continues a killed run exactly."""
    cfg = load_config(params, "ppo")
    for name, path in (("prompts", prompts), ("difficulty", difficulty),
                       ("heldout-store", heldout_store), ("embeddings", embeddings),
                       ("routes", routes)):
        if path is not None and not path.exists():
            fail(f"--{name} {path} does not exist")
    latest = out / "checkpoints" / "latest"
    if resume and not latest.exists():
        fail(f"--resume: no checkpoint in {out / 'checkpoints'}")
    from rlhf.pipeline import model_folders as mf

    try:  # each model folder: missing, truncated or the wrong kind is one error naming it
        mf.check_policy(policy, "--policy")
        mf.check_scorer(reward, "--reward", plain_allowed=True)
        if strong_reward is not None:
            mf.check_scorer(strong_reward, "--strong-reward", plain_allowed=True)
        if resume:
            step = out / "checkpoints" / latest.read_text().strip()
            for name in ("policy.pt", "critic.pt", "optim.pt"):
                mf.check_torch_file(step / name, f"--resume checkpoint {step.name}")
    except mf.ModelFolderError as exc:
        fail(str(exc))
    judge = None
    if heldout_store is not None and cfg.heldout_eval:  # before training: a bad judge fails fast
        judge = judge_or_fail(params, judge_model)
    from rlhf.pipeline.ppo.trainer import annotator_pool, run

    annotators = None
    if cfg.human_labels_per_step:
        from rlhf.pipeline.config import read_params

        keys = ("annotators", "seed", "labels")
        prefs = (load_config(params, "preferences", keys)
                 if "preferences" in read_params(params) else None)
        if prefs is None or prefs.labels != "annotators":
            fail("ppo.human_labels_per_step needs the world's annotator pool "
                 "(preferences.labels: annotators); set it to 0 for your own data")
        annotators = annotator_pool(prefs)
    try:
        last = run(cfg, policy, reward, prompts, out, rollouts, run_id or None, resume,
                   checkpoint_table=checkpoint_table, difficulty=difficulty,
                   strong_reward=strong_reward, rm_scores=rm_scores, train_metrics=train_metrics,
                   deepspeed_config=deepspeed_config, embeddings=embeddings,
                   schedule=schedule, routes=routes, human_labels=human_labels,
                   annotators=annotators)
        from accelerate import PartialState

        if not PartialState().is_main_process:
            return
        from rlhf.pipeline.ppo.heldout_gold import compare, escalated_rollouts, rollouts_used

        from rlhf.pipeline.ppo.records import CSV_COLUMNS

        report = {"ppo": {k: last.get(k) for k in CSV_COLUMNS},
                  "rollouts": rollouts_used(rollouts, run_id or out.name),
                  "escalated_rollouts": escalated_rollouts(rollouts, run_id or out.name)}
        if judge is not None:
            from rlhf.pipeline.ppo.generate import sampling_of

            report["heldout"] = compare(policy, out / "policy", heldout_store, sampling_of(cfg),
                                        cfg.eval_seed, judge)
    except (ValueError, FileNotFoundError) as exc:
        fail(str(exc))
    write_metrics("ppo", report, metrics, report_path)
    typer.echo(json.dumps(report))
