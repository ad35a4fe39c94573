"""`rlhf ppo`: train the policy with PPO against a reward model, a reward function or a reward
server (pipeline/ppo/trainer.py; the three `--reward` kinds: pipeline/models/code_rewards.py).

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

from rlhf.cli.common import (JUDGE_MODEL, METRICS, PARAMS, REPORT, fail, judge_or_fail,
                             load_config, reward_or_fail, stage_setup, tracking_or_fail,
                             write_metrics)


def ppo(policy: Path = typer.Option(
            ..., help="Policy: a save_pretrained folder with its tokenizer, or a hub name "
                      "(org/name: its snapshot in the Hugging Face cache)."),
        reward: str = typer.Option(
            ..., help="Reward: a reward model folder (AutoModelForSequenceClassification), a "
                      "function python:path/to/file.py:function (or python:package.module:"
                      "function), or a reward server http://host:port/path (docs/ppo.md)."),
        prompts: Path = typer.Option(..., help="`pool` table folder (split ppo) or a JSONL file."),
        out: Path = typer.Option(..., help="Run folder: checkpoints, logs, final policy."),
        rollouts: Path = typer.Option(..., help="The `rollouts` table folder."),
        rm_scores: Path | None = typer.Option(
            None, help="The `rm_scores` table folder: every RM score PPO uses (rlhf audit rm)."),
        train_metrics: Path | None = typer.Option(
            None, help="The `train_metrics` table folder: the six metrics of every CSV line."),
        checkpoint_table: Path | None = typer.Option(
            None, help="The `checkpoints` table folder: one row per saved checkpoint (lineage "
                       "audit)."),
        difficulty: Path | None = typer.Option(
            None, help="`difficulty` table folder: stratified batches (bucket x topic cluster)."),
        heldout_store: Path | None = typer.Option(
            None, help="Store root (pool + similar): gold-judge SFT vs PPO on the held-out "
                       "prompts."),
        judge_model: Path | None = JUDGE_MODEL,  # the held-out figure's judge
        params: Path = PARAMS,
        run_id: str = typer.Option("", help="Run id in the rollout rows (default: the --out "
                                            "name)."),
        resume: bool = typer.Option(False, "--resume", help="Continue from the last checkpoint."),
        metrics: Path | None = METRICS,
        report_path: Path | None = REPORT,
        deepspeed_config: Path = typer.Option(
            Path("configs/deepspeed_zero3.json"),
            help="DeepSpeed JSON for ppo.sharding: zero3 (\"auto\" fields filled from params)."),
        **features: Path | None) -> None:
    """Train the policy with PPO; `--resume` continues a killed run exactly. The options after
    --deepspeed-config are the rollout-economy features' inputs and tables (one per registered
    input and table: pipeline/ppo/features)."""
    cfg, compute = stage_setup(params, "ppo")
    tracking = tracking_or_fail(params)
    # the sections a switch makes it read, read up front (a bad one stops before any training)
    if cfg.heldout_eval and heldout_store is not None:  # the held-out figure's judge
        load_config(params, "judge")
    if cfg.human_labels_per_step:  # the human queue's annotator pool (features/inputs.py)
        load_config(params, "preferences", ("annotators", "seed", "labels"))
    from rlhf.pipeline.ppo.features import INPUTS, registry

    inputs = {k: features.get(k) for k in INPUTS if not INPUTS[k].from_params}
    tables = {t: features.get(t) for t in registry.tables()}
    for name, path in (("prompts", prompts), ("difficulty", difficulty),
                       ("heldout-store", heldout_store), *inputs.items()):
        if path is not None and not path.exists():
            fail(f"--{name.replace('_', '-')} {path} does not exist")
    latest = out / "checkpoints" / "latest"
    if resume and not latest.exists():
        fail(f"--resume: no checkpoint in {out / 'checkpoints'}")
    from rlhf.pipeline.models import model_folders as mf
    from rlhf.pipeline.ppo.scoring import check_features

    try:  # a reward that is code or a server, with a feature that reads an RM's insides
        check_features(cfg, reward)
    except ValueError as exc:
        fail(str(exc))
    reward_or_fail(reward, "--reward")  # one error line now, not after the models load
    try:  # each model folder: missing, truncated or the wrong kind is one error naming it
        policy = mf.policy_folder(policy, "--policy")  # a hub name: its snapshot folder
        if inputs.get("strong_reward") is not None:
            mf.check_scorer(inputs["strong_reward"], "--strong-reward", plain_allowed=True)
        if resume:
            step = out / "checkpoints" / latest.read_text().strip()
            from rlhf.pipeline.ppo.advantages import estimator

            critic = ("critic.pt",) if estimator(cfg.advantage_estimator).needs_critic else ()
            for name in ("policy.pt", *critic, "optim.pt"):  # a group estimator has no critic
                mf.check_torch_file(step / name, f"--resume checkpoint {step.name}")
    except mf.ModelFolderError as exc:
        fail(str(exc))
    judge = None
    if heldout_store is not None and cfg.heldout_eval:  # before training: a bad judge fails fast
        judge = judge_or_fail(params, judge_model)
    from rlhf.pipeline.ppo.heldout_gold import run_report
    from rlhf.pipeline.ppo.trainer import run

    try:
        last = run(cfg, policy, reward, prompts, out, rollouts, run_id or None, resume,
                   checkpoint_table=checkpoint_table, difficulty=difficulty, rm_scores=rm_scores,
                   train_metrics=train_metrics, deepspeed_config=deepspeed_config,
                   inputs=inputs, tables=tables, params=params, tracking=tracking, compute=compute)
        from accelerate import PartialState

        if not PartialState().is_main_process:
            return
        report = run_report(cfg, last, policy, out, rollouts, run_id or out.name,
                            heldout_store, judge)
    except (ValueError, FileNotFoundError) as exc:
        fail(str(exc))
    write_metrics("ppo", report, metrics, report_path)
    typer.echo(json.dumps(report))


def _with_feature_options(func):
    """`func`'s signature plus one keyword option per registered feature input (a path) and
    table (a folder), so a new feature's options come from its registry entry alone."""
    import inspect

    from rlhf.pipeline.ppo.features import INPUTS, registry

    sig = inspect.signature(func, eval_str=True)
    own = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
    extra = [(i.key, i.option, f"{i.help[0].upper()}{i.help[1:]}.") for i in INPUTS.values()
             if not i.from_params]
    extra += [(t.name, t.option, f"The `{t.name}` table folder: {t.help}.")
              for t in registry.tables().values()]
    for key, option, text in extra:
        own.append(inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, annotation=Path | None,
                                     default=typer.Option(None, option, help=text)))

    def command(**kw):
        return func(**kw)

    command.__name__, command.__doc__ = func.__name__, func.__doc__
    command.__signature__ = sig.replace(parameters=own)
    command.__annotations__ = {p.name: p.annotation for p in own}
    return command


ppo = _with_feature_options(ppo)

