"""`rlhf world generate`: write the embedded default world (sources, truth, demos, tokenizer).

    rlhf world generate --seed 0 --out artifacts/world
"""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.console import Console
from rlhf.cli.common import (METRICS, PARAMS, REPORT, add_plain_row, data_table, fail,
                              load_config, write_metrics)

world_app = typer.Typer(help="The embedded default world: a synthetic RLHF task with a gold judge.",
                        no_args_is_help=True)


@world_app.command("generate")
def generate(
    out: Path = typer.Option(..., "--out", "-o", help="Output folder (artifacts/world in DVC)."),
    seed: int | None = typer.Option(None, "--seed", help="Seed; overrides world.seed."),
    n_prompts: int | None = typer.Option(None, "--n-prompts",
                                         help="Source lines; overrides world.n_prompts."),
    params: Path = PARAMS,
    metrics: Path | None = METRICS,
    report_path: Path | None = REPORT,
) -> None:
    """Generate the world deterministically from a seed; same seed, byte-identical files."""
    import dataclasses

    from rlhf.pipeline.world import run

    cfg = load_config(params, "world")
    overrides = {k: v for k, v in (("seed", seed), ("n_prompts", n_prompts)) if v is not None}
    if overrides:
        try:
            cfg = dataclasses.replace(cfg, **overrides)
        except ValueError as exc:
            fail(f"world: {exc}")
    if out.exists() and not out.is_dir():
        fail(f"--out {out} exists and is not a folder")
    t0 = time.perf_counter()
    try:
        report = run(cfg, out)
    except (OSError, ValueError) as exc:
        fail(f"world generation failed: {exc}")
    elapsed = time.perf_counter() - t0
    write_metrics("world", report, metrics, report_path)
    _print(report, out, elapsed, dataclasses.asdict(cfg))


def _print(report: dict, out: Path, elapsed: float, cfg: dict) -> None:
    console = Console()
    src = report["sources"]
    t = data_table(f"world (seed {report['seed']}) -> {out}  [{elapsed:.1f}s]",
                   ["what", ("rows", {"justify": "right"})])
    for f, n in src["lines_per_file"].items():
        add_plain_row(t, f, str(n))
    for s, n in src["clean_per_source_type"].items():
        add_plain_row(t, f"clean: {s}", str(n))
    add_plain_row(t, "clean unique questions", str(src["unique_questions"]))
    add_plain_row(t, "exact duplicates", str(src["duplicates"]["exact"]))
    add_plain_row(t, "paraphrase duplicates", str(src["duplicates"]["paraphrase"]))
    for code, n in src["defect_rows_per_code"].items():
        add_plain_row(t, f"defect: {code}", str(n))
    add_plain_row(t, "defect rows (multi-code)", f"{src['defect_rows']} ({src['multi_code_rows']})")
    demos = report["demonstrations"]
    for q, v in demos["by_quality"].items():
        add_plain_row(t, f"demos: {q} (gold mean {v['gold_mean']:.2f})", str(v["n"]))
    add_plain_row(t, "tokenizer vocab", str(report["tokenizer"]["vocab_size"]))
    add_plain_row(t, "model parameters", f"{report['model']['n_params']:,}")
    console.print(t)
