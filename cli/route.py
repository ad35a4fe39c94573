"""`rlhf route`: the Level-0 router (pipeline/route.py): complexity bucket, high-risk topic and
token budget per pool prompt, from its embedding.

    rlhf route --pool artifacts/store/pool --embeddings artifacts/store/pool_embeddings \
        --difficulty artifacts/store/difficulty --topics artifacts/world/topics.json \
        --out artifacts/store/routes --model artifacts/models/router
"""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.console import Console
from rlhf.cli.common import (
    METRICS,
    PARAMS,
    REPORT,
    add_plain_row,
    data_table,
    fail,
    load_config,
    write_metrics,
)

console = Console()


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return "-" if v is None else str(v)


def route(
    pool: Path = typer.Option(..., "--pool", help="`pool` table folder (the prompts' texts)."),
    embeddings: Path = typer.Option(..., "--embeddings",
                                    help="`pool_embeddings` table folder (the router's input)."),
    difficulty: Path = typer.Option(..., "--difficulty",
                                    help="`difficulty` table folder (the complexity labels: "
                                         "its bucket column)."),
    out: Path = typer.Option(..., "--out", "-o", help="`routes` table folder to write."),
    model: Path = typer.Option(..., "--model", help="Folder for the router (router.json)."),
    topics: Path | None = typer.Option(
        None, "--topics", help="The world's topics.json: high-risk labels (the world judge's "
                               "topic of each prompt, its high_risk flag). Without it (a user's "
                               "own data) high_risk is False for every prompt."),
    params: Path = PARAMS,
    metrics: Path | None = METRICS,
    report_path: Path | None = REPORT,
) -> None:
    """Level-0 router: fit on a hashed split of the pool, report held-out accuracy and the cost
    per prompt, route every prompt (complexity, high risk, max_new_tokens)."""
    from rlhf.pipeline.route import run

    cfg = load_config(params, "router")
    for path, what in ((pool, "--pool"), (embeddings, "--embeddings"),
                       (difficulty, "--difficulty")):
        if not path.is_dir():
            fail(f"{what} {path} is not a folder")
    if topics is not None and not topics.is_file():
        fail(f"--topics {topics} is not a file")
    t0 = time.perf_counter()
    try:
        m = run(cfg, pool, embeddings, difficulty, out, model, topics)
    except (OSError, ValueError, KeyError) as exc:
        fail(f"route failed: {exc}")
    write_metrics("route", m, metrics, report_path)
    c, h = m["complexity"], m["high_risk"]
    rows = [("prompts (train / held out)", f"{m['n_prompts']} ({m['n_train']} / {m['n_held_out']})"),
            ("method", m["method"]),
            ("complexity accuracy, held out", c["held_out_accuracy"]),
            ("  95 % bootstrap interval", _fmt(c["held_out_accuracy_ci95"])),
            (f"  majority bucket ({c['majority_bucket']}) alone", c["majority_held_out_accuracy"])]
    if h["labels"] == "absent":
        rows.append(("high risk", "no labels: False for every prompt"))
    else:
        rows += [("high-risk accuracy, held out", h["held_out_accuracy"]),
                 ("  precision / recall", (f"{_fmt(h['held_out']['precision'])} / "
                                           f"{_fmt(h['held_out']['recall'])}"))]
    rows += [("µs per prompt (batch predict)", m["us_per_prompt"]),
             *[(f"routed {b}", n) for b, n in m["route_counts"].items()]]
    t = data_table(f"route -> {out}  [{time.perf_counter() - t0:.1f}s]",
                   ["metric", ("value", {"justify": "right"})])
    for k, v in rows:
        add_plain_row(t, k, _fmt(v))
    console.print(t)
