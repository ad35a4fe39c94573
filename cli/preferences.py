"""`rlhf preferences`: the preferences stage's command, ranked samples of the SFT policy (or
human labels) as the `preferences` table (pipeline/preferences/).

    rlhf preferences --pool artifacts/store/pool --policy artifacts/models/sft \
        --out artifacts/store/preferences
"""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rlhf.cli.common import (
    METRICS,
    PARAMS,
    REPORT,
    console,
    fail,
    fmt,
    need_dir,
    need_model,
    plain,
    print_table,
    stage_setup,
    write_metrics,
)


def preferences(
    policy: Path | None = typer.Option(
        None, "--policy", help="SFT policy checkpoint (labels: annotators), or a hub name "
                               "(org/name: its snapshot in the Hugging Face cache)."),
    out: Path = typer.Option(..., "--out", "-o", help="`preferences` table folder."),
    labels_from: Path | None = typer.Option(
        None, "--labels-from", help="labels: human: the store root (prompts, external_pairs, "
                                    "pool, similar) the human labels are read from."),
    queue: list[Path] = typer.Option(
        [], "--queue", help="labels: human: annotation-queue JSONL file(s) (format: docs/realdata.md)"
                            "; absent files are skipped with a note."),
    rejected_out: Path | None = typer.Option(
        None, "--rejected-out", help="labels: human: the `rejected_labels` table folder."),
    pool: Path | None = typer.Option(None, "--pool", help="`pool` table folder (reward split)."),
    demos: Path | None = typer.Option(None, "--demos",
                                      help="Without a pool: use the demonstrations' prompts."),
    realdata: Path | None = typer.Option(None, "--realdata",
                                         help="Real-data folder (hh-rlhf, OpenAssistant); an "
                                              "error when absent (omit it: none read)."),
    params: Path = PARAMS,
    metrics: Path | None = METRICS,
    report_path: Path | None = REPORT,
) -> None:
    """Sample k responses per reward-split prompt; the annotator pool ranks them (or, with
    preferences.labels: human, read the human labels and the annotation queue)."""
    from rlhf.pipeline.preferences import run

    # human labels: no model runs, so no compute section is read
    cfg, compute = stage_setup(params, "preferences", lambda c: c.labels != "human")
    if cfg.labels == "human":
        return _human_preferences(cfg, labels_from, queue, out, rejected_out, metrics,
                                  report_path)
    if policy is None:
        fail("--policy is needed (preferences.labels: annotators)")
    policy = need_model("hub_policy", policy, "--policy")
    if pool is None and demos is None:
        fail("give --pool or --demos")
    if pool is not None and not pool.is_dir() and demos is None:
        fail(f"--pool {pool} is not a folder (give --demos to use the demonstrations' prompts)")
    if realdata is not None:  # declared in dvc.yaml: absent is an error, not other bytes
        from rlhf.pipeline.preferences.external import missing_files

        if missing := missing_files(realdata, cfg):
            fail(f"--realdata {realdata}: {missing[0].name} not found there (the hh-rlhf and "
                 "OpenAssistant rankings this stage reads: docs/stages.md); omit --realdata to "
                 "build the table without them")
    t0 = time.perf_counter()
    try:
        m = run(cfg, policy, out, pool, demos, realdata, compute=compute)
    except (OSError, ValueError) as exc:
        fail(f"preferences failed: {exc}")
    write_metrics("preferences", m, metrics, report_path)
    print_table(f"preferences -> {out}  [{time.perf_counter() - t0:.0f}s]", [
        ("prompts (" + m["prompt_source"] + ")", m["n_prompts"]),
        ("policy responses + demonstrations per prompt", f"{m['k']} + {m['demo_candidates']}"),
        ("gold mean: policy / demonstration responses",
         f"{fmt(m['mean_gold_policy'])} / {fmt(m['mean_gold_demonstration'])}"),
        ("distinct response share", m["distinct_response_share"]),
        ("rankings", m["n_rankings"]), ("pairs", m["n_pairs"]),
        ("held-out pairs", m["n_pairs_heldout"]), ("annotators", m["n_annotators"]),
        ("annotator order = gold order", m["annotator_gold_agreement"]),
        *[(f"external: {k}", v) for k, v in sorted(m["external"].items())],
        ("external pairs", m["n_external_pairs"]),
    ])


def _human_preferences(cfg, labels_from: Path | None, queue: list[Path], out: Path,
                       rejected_out: Path | None, metrics: Path | None,
                       report_path: Path | None) -> None:
    from rlhf.pipeline.preferences import run_human

    if labels_from is None or rejected_out is None:
        fail("preferences.labels: human needs --labels-from (the store root) and --rejected-out")
    need_dir(labels_from, "--labels-from")
    present = []
    for q in queue:
        if q.is_file():
            present.append(q)
        else:
            console.print(plain(f"annotation queue {q} absent: skipped", "yellow"))
    t0 = time.perf_counter()
    try:
        m = run_human(cfg, labels_from, out, rejected_out, present)
    except (OSError, ValueError) as exc:
        fail(f"preferences failed: {exc}")
    write_metrics("preferences", m, metrics, report_path)
    print_table(f"preferences (human labels) -> {out}  [{time.perf_counter() - t0:.0f}s]", [
        ("labelled prompts", m["n_prompts"]), ("rankings", m["n_rankings"]),
        ("pairs train / heldout / gold",
         f"{m['n_pairs_train']} / {m['n_pairs_heldout']} / {m['n_pairs_gold']}"),
        *[(f"{src}: input = kept + rejected", f"{c['input']} = {c['kept']} + {c['rejected']}")
          for src, c in m["labels_by_source"].items()],
        *[(f"rejected: {code}", n) for code, n in m["rejected_by_reason"].items()],
    ])
