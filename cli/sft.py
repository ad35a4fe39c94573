"""`rlhf sft`: the sft stage's command, supervised fine-tuning of the starting policy
(pipeline/sft.py).

    rlhf sft --demos artifacts/world/demonstrations.jsonl --tokenizer artifacts/world/tokenizer \
        --model-config artifacts/world/model_config --out artifacts/models/sft
"""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rlhf.cli.common import (
    JUDGE_MODEL,
    METRICS,
    PARAMS,
    REPORT,
    fail,
    judge_or_fail,
    load_config,
    need_model,
    print_table,
    stage_setup,
    tracking_or_fail,
    write_metrics,
)


def sft(
    demos: Path = typer.Option(..., "--demos", help="demonstrations.jsonl (prompt, response)."),
    out: Path = typer.Option(..., "--out", "-o", help="Checkpoint folder (save_pretrained)."),
    tokenizer: Path | None = typer.Option(None, "--tokenizer",
                                          help="Tokenizer folder (embedded default)."),
    model_config: Path | None = typer.Option(None, "--model-config",
                                             help="model_config folder (embedded default)."),
    judge_model: Path | None = JUDGE_MODEL,
    params: Path = PARAMS,
    metrics: Path | None = METRICS,
    report_path: Path | None = REPORT,
) -> None:
    """Supervised fine-tuning of the starting policy (TRL SFTTrainer)."""
    from rlhf.pipeline.sft import run

    cfg, compute = stage_setup(params, "sft")
    load_config(params, "judge")  # read up front: a bad judge section stops before any training
    tracking = tracking_or_fail(params)
    if not demos.is_file():
        fail(f"--demos {demos} is not a file")
    if not cfg.base_model:
        if tokenizer is None or model_config is None:
            fail("the embedded default (sft.base_model empty) needs --tokenizer and --model-config")
        need_model("tokenizer", tokenizer, "--tokenizer")
        need_model("model_config", model_config, "--model-config")
    else:  # a local folder, or a hub name (its snapshot in the Hugging Face cache)
        need_model("hub_policy", cfg.base_model, "sft.base_model")
    t0 = time.perf_counter()
    try:
        m = run(cfg, demos, out, tokenizer, model_config, judge_or_fail(params, judge_model),
                tracking, compute)
    except (OSError, ValueError) as exc:
        fail(f"sft failed: {exc}")
    write_metrics("sft", m, metrics, report_path)
    print_table(f"sft -> {out}  [{time.perf_counter() - t0:.0f}s]", [
        ("parameters", f"{m['n_params']:,}"), ("train demonstrations", m["n_train"]),
        ("held-out demonstrations", m["n_heldout"]), ("train loss", m["train_loss"]),
        ("held-out loss", m["eval_loss"]), ("held-out perplexity", m["eval_perplexity"]),
        (f"judge ({m['judge']}) mean of SFT samples", m["gold_mean"]),
        ("judge mean of the demonstrations", m["gold_mean_demonstrations"]),
    ])
