"""`rlhf eval`: SFT and every PPO checkpoint on held-out prompts, gold vs proxy (pipeline/eval.py).
The rewards (`--light-rm`, `--strong-rm`) are of `rlhf ppo --reward`'s three kinds.

    rlhf eval --sft artifacts/models/sft --ppo artifacts/ppo \
        --light-rm artifacts/models/rm_light --strong-rm artifacts/models/rm_strong \
        --prompts artifacts/store --out artifacts/eval --metrics artifacts/metrics/eval.json
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rlhf.cli.common import (JUDGE_MODEL, METRICS, PARAMS, REPORT, fail, judge_or_fail,
                             load_config, reward_or_fail, stage_setup, write_metrics)


def eval_cmd(
    sft: Path = typer.Option(..., help="SFT policy (save_pretrained folder + tokenizer, or a hub "
                             "name: its snapshot in the Hugging Face cache): step 0 and the KL "
                             "reference."),
    ppo: Path = typer.Option(..., help="PPO run folder (its checkpoints/step-NNNNNN/)."),
    light_rm: str = typer.Option(
        ..., help="Light reward (the PPO reward): a reward model folder, a function "
                  "python:path/to/file.py:function or a reward server http://host:port/path, "
                  "as `rlhf ppo --reward` takes (docs/ppo.md)."),
    strong_rm: str = typer.Option(..., help="Strong reward, of the same three kinds."),
    prompts: Path = typer.Option(..., help="Store root (held-out eval-split prompts: pool + "
                                 "similar) or a JSONL file of {prompt_id, text}."),
    out: Path = typer.Option(..., help="Output folder: report.md, curves.csv, PNG plots."),
    judge_model: Path | None = JUDGE_MODEL,
    params: Path = PARAMS,
    metrics: Path | None = METRICS,
    report_path: Path | None = REPORT,
) -> None:
    """Evaluate the SFT policy and each PPO checkpoint: gold judge vs proxy RMs against sqrt(KL)."""
    cfg, compute = stage_setup(params, "eval")
    ppo_cfg = load_config(params, "ppo", ("temperature", "top_p"))  # sampled as PPO samples
    judge = judge_or_fail(params, judge_model)
    if not prompts.exists():
        fail(f"--prompts {prompts} does not exist")
    from rlhf.pipeline.models import model_folders as mf

    try:  # each model folder: missing, truncated or the wrong kind is one error naming it
        sft = mf.policy_folder(sft, "--sft")  # a hub name: its snapshot folder
        mf.check_ppo_run(ppo, "--ppo")
    except mf.ModelFolderError as exc:
        fail(str(exc))
    reward_or_fail(light_rm, "--light-rm")
    reward_or_fail(strong_rm, "--strong-rm")
    from rlhf.pipeline.eval import run

    try:
        result = run(cfg, sft, ppo, light_rm, strong_rm, prompts, out,
                     temperature=ppo_cfg.temperature, top_p=ppo_cfg.top_p, judge=judge,
                     compute=compute)
    except (ValueError, FileNotFoundError, KeyError, json.JSONDecodeError) as exc:
        fail(f"{type(exc).__name__}: {exc}")
    except OSError as exc:
        fail(f"cannot write the outputs: {exc}")
    write_metrics("eval", {"eval": result}, metrics, report_path)
    s, f = result["sft"], result["final"]
    typer.echo(f"eval: {result['n_prompts']} prompts, {result['n_policies']} policies; judge "
               f"{result['judge']}: "
               f"SFT {s['gold_mean']} -> step {f['step']} {f['gold_mean']} (win rate "
               f"{f['win_rate']}, sqrt KL {f['sqrt_kl']}); report: {out / 'report.md'}")
