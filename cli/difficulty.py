"""`rlhf difficulty`: the difficulty stage's command, a difficulty score and bucket per pool
prompt (pipeline/difficulty.py).

    rlhf difficulty --pool artifacts/store/pool --policy artifacts/models/sft \
        --reward-model artifacts/models/rm_strong --out artifacts/store/difficulty
"""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rlhf.cli.common import (
    METRICS,
    PARAMS,
    REPORT,
    fail,
    need_model,
    pool_or_demos,
    print_table,
    stage_setup,
    write_metrics,
)


def difficulty(
    policy: Path = typer.Option(..., "--policy", help="Baseline (SFT) policy checkpoint, or a "
                                "hub name (org/name: its snapshot in the Hugging Face cache)."),
    reward_model: Path = typer.Option(..., "--reward-model", help="RM scorer folder."),
    out: Path = typer.Option(..., "--out", "-o", help="`difficulty` table folder."),
    pool: Path | None = typer.Option(None, "--pool", help="`pool` table folder."),
    demos: Path | None = typer.Option(None, "--demos", help="Without a pool: demonstrations."),
    params: Path = PARAMS,
    metrics: Path | None = METRICS,
    report_path: Path | None = REPORT,
) -> None:
    """Difficulty 0-10 and bucket per pool prompt; checks the stratified sampler's coverage."""
    from rlhf.pipeline.difficulty import run

    cfg, compute = stage_setup(params, "difficulty")
    policy = need_model("hub_policy", policy, "--policy")
    need_model("scorer", reward_model, "--reward-model")
    pool = pool_or_demos(pool, demos)
    if pool is None and demos is None:
        fail("give --pool or --demos")
    t0 = time.perf_counter()
    try:
        m = run(cfg, policy, reward_model, out, pool, demos, compute=compute)
    except (OSError, ValueError) as exc:
        fail(f"difficulty failed: {exc}")
    write_metrics("difficulty", m, metrics, report_path)
    print_table(f"difficulty -> {out}  [{time.perf_counter() - t0:.0f}s]", [
        ("prompts (" + m["prompt_source"] + ")", m["n_prompts"]),
        *[(f"bucket {b}", n) for b, n in m["bucket_counts"].items()],
        ("topic clusters", m["n_topic_clusters"]), ("mean score", m["mean_score"]),
        ("corr(score, length)", m["corr_score_length"]),
        ("corr(score, logprob std)", m["corr_score_logprob_std"]),
        ("corr(score, RM score)", m["corr_score_rm"]),
        (f"batches of {m['sampler_batch_size']} covering every bucket and cluster",
         m["sampler_full_coverage_share"]),
    ])
