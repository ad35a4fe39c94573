"""`rlhf demos`: the demos stage's command (realdata profile), demonstrations from human labels
for SFT (pipeline/demos.py).

    rlhf demos --store artifacts/store --out artifacts/demos
"""

from __future__ import annotations

from pathlib import Path

import typer
from rlhf.cli.common import (
    METRICS,
    PARAMS,
    REPORT,
    fail,
    load_config,
    need_dir,
    print_table,
    write_metrics,
)


def demos(
    store: Path = typer.Option(..., "--store", help="Store root (prompts, external_pairs, pool)."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder: demonstrations.jsonl, tokenizer/, "
                             "model_config/."),
    params: Path = PARAMS,
    metrics: Path | None = METRICS,
    report_path: Path | None = REPORT,
) -> None:
    """Demonstrations from human labels (+ a tiny tokenizer and model config) for SFT."""
    from rlhf.pipeline.demos import run

    cfg = load_config(params, "demos")
    need_dir(store, "--store")
    try:
        m = run(cfg, store, out)
    except (OSError, ValueError) as exc:
        fail(f"demos failed: {exc}")
    write_metrics("demos", m, metrics, report_path)
    print_table(f"demos -> {out}", [("demonstrations", m["n_demonstrations"]),
                               *[(f"  from {k}", v) for k, v in m["by_source"].items()],
                               ("tokenizer vocabulary", m["tokenizer_vocab"])])
