"""`rlhf judge`: the judge stage's command, the held-out gold RM trained on the `gold` split of
the labels (pipeline/models/judges.py).

    rlhf judge --preferences artifacts/store/preferences --out artifacts/models/judge
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
    need_dir,
    print_table,
    stage_setup,
    write_metrics,
)


def judge(
    preferences_dir: Path = typer.Option(..., "--preferences", help="`preferences` table folder."),
    out: Path = typer.Option(..., "--out", "-o", help="The held-out gold RM folder."),
    params: Path = PARAMS,
    metrics: Path | None = METRICS,
    report_path: Path | None = REPORT,
) -> None:
    """Train the held-out gold RM (judge.kind heldout_rm) on the `gold` split of the labels."""
    from rlhf.pipeline.models.judges import train_heldout_judge

    cfg, compute = stage_setup(params, "judge")
    need_dir(preferences_dir, "--preferences")
    t0 = time.perf_counter()
    try:
        m = train_heldout_judge(cfg, preferences_dir, out, compute=compute)
    except (OSError, ValueError) as exc:
        fail(f"judge failed: {exc}")
    write_metrics("judge", m, metrics, report_path)
    print_table(f"judge -> {out}  [{time.perf_counter() - t0:.0f}s]", [
        ("backbone", m["backbone"]), ("gold pairs (prompts)",
                                      f"{m['n_gold_pairs']} ({m['n_gold_prompts']})"),
        ("label sources", ", ".join(m["sources"])),
        (f"accuracy on the proxies' {m['n_heldout_pairs']} held-out pairs",
         m.get("heldout_pair_accuracy")),
    ])
