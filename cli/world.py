"""`rlhf world generate`: write the embedded default world (sources, truth, demos, tokenizer).

    rlhf world generate --seed 0 --out artifacts/world
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer
from rich.console import Console
from rlhf.cli.common import add_plain_row, data_table, fail

world_app = typer.Typer(help="The embedded default world: a synthetic RLHF task with a gold judge.",
                        no_args_is_help=True)


@world_app.command("generate")
def generate(
    out: Path = typer.Option(..., "--out", "-o", help="Output folder (artifacts/world in DVC)."),
    seed: int | None = typer.Option(None, "--seed", help="Seed; overrides world.seed."),
    n_prompts: int | None = typer.Option(None, "--n-prompts",
                                         help="Source lines; overrides world.n_prompts."),
    params: Path = typer.Option(Path("params.yaml"), "--params", "-p",
                                help="Params file (its world: section; defaults if absent)."),
    metrics: Path | None = typer.Option(None, "--metrics",
                                        help="Also write the report here (DVC metrics)."),
) -> None:
    """Generate the world deterministically from a seed; same seed, byte-identical files."""
    import dataclasses

    from rlhf.pipeline.config import ConfigError, build, read_params
    from rlhf.pipeline.world import WorldConfig, run

    try:
        section = read_params(params).get("world", {}) or {} if params.is_file() else {}
        cfg = build(WorldConfig, section, "world")
        overrides = {k: v for k, v in (("seed", seed), ("n_prompts", n_prompts)) if v is not None}
        cfg = build(WorldConfig, {**section, **overrides}, "world") if overrides else cfg
    except ConfigError as exc:
        fail(str(exc))
    if out.exists() and not out.is_dir():
        fail(f"--out {out} exists and is not a folder")
    t0 = time.perf_counter()
    try:
        report = run(cfg, out)
    except (OSError, ValueError) as exc:
        fail(f"world generation failed: {exc}")
    elapsed = time.perf_counter() - t0
    if metrics is not None:
        from rlhf.store.io import write_text_atomic

        try:
            write_text_atomic(metrics, json.dumps(report, indent=2, sort_keys=True) + "\n")
        except OSError as exc:
            fail(f"cannot write --metrics {metrics}: {exc}")
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
