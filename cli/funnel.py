"""`rlhf ingest` and `rlhf dedup`: the prompt funnel of seed 000 §4.2, one stage per command.

    rlhf ingest --sources artifacts/world/sources --out-store artifacts/store
    rlhf dedup --store artifacts/store --cache artifacts/cache/embeddings
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.text import Text
from rlhf.cli.common import (METRICS, PARAMS, REPORT, add_plain_row, data_table, fail,
                              load_config, plain, write_metrics)
from rlhf.pipeline.progress import bar

console = Console()


def ingest(
    sources: list[Path] = typer.Option(..., "--sources", "-s",
                                       help="Source files or folders (.jsonl, .jsonl.gz, .parquet, "
                                       "saved `datasets` folders); repeat the flag for several."),
    out_store: Path = typer.Option(..., "--out-store", help="Store root; writes its prompts, "
                                   "rejected and external_pairs folders."),
    tokenizer: Path | None = typer.Option(None, "--tokenizer", help="Tokenizer folder for the "
                                          "max_tokens rule (default: regex word/punct count)."),
    params: Path = PARAMS,
    metrics: Path | None = METRICS,
    report_path: Path | None = REPORT,
) -> None:
    """Source trust + PII/format filters; rejected rows go to the quarantine with reason codes."""
    from rlhf.pipeline.ingest import IngestError, run_ingest
    from rlhf.store.schemas import REASON_CODES

    cfg = load_config(params, "ingest")
    try:
        with bar("ingesting", unit="rows") as advance:
            result = run_ingest(sources, out_store, cfg, tokenizer, on_progress=advance)
    except IngestError as exc:
        fail(str(exc))
    except OSError as exc:  # the store or metrics path cannot be written (a file in the way, ...)
        fail(f"I/O error: {exc}")
    write_metrics("ingest", result.metrics(), metrics, report_path)
    # file names and paths are the user's: shown verbatim (`plain`), never read as rich markup
    table = data_table(f"ingest -> {out_store}",
                       ["reason code", ("rows", {"justify": "right"}), "meaning"])
    for code, meaning in REASON_CODES.items():
        if result.by_reason.get(code):
            add_plain_row(table, code, f"{result.by_reason[code]:,}", meaning)
    console.print(table)
    for name, c in result.by_file.items():
        blank = f", skipped {c['skipped']:,} blank line(s)" if c["skipped"] else ""
        console.print(plain(f"  {name}: {c['input']:,} rows, kept {c['kept']:,}, rejected "
                            f"{c['rejected']:,}{blank}"), highlight=False)
    if result.skipped_files:
        console.print(plain(f"  skipped (unknown format): {', '.join(result.skipped_files)}"),
                      highlight=False)
    ok = result.adds_up
    console.print(Text.assemble(
        plain(f"input {result.input_rows:,} = kept {result.kept:,} + rejected {result.rejected:,}"
              f" + skipped (blank lines) {result.skipped:,} "),
        ("ok" if ok else "BROKEN", "green" if ok else "red"),
        plain(f"; external pairs {result.external_pairs:,} ({result.external_pairs_skipped:,} "
              f"unaligned skipped); tokens: {result.tokenizer}")), highlight=False)


def dedup(
    store: Path = typer.Option(..., "--store", help="Store root: reads prompts, writes pool and "
                               "similar."),
    cache: Path | None = typer.Option(None, "--cache", help="Embedding cache folder (reused "
                                      "across runs; only new prompts are embedded)."),
    params: Path = PARAMS,
    metrics: Path | None = METRICS,
    report_path: Path | None = REPORT,
    pool_embeddings_only: bool = typer.Option(
        False, "--pool-embeddings-only", help="Only (re)write pool_embeddings for the existing "
        "pool (the PPO rollout scheduler's input), through the same cache; no re-clustering."),
    engine: str = typer.Option("local", "--engine", help="local (one process) or ray (embedding "
                               "and range search on Ray workers; needs the `scale` extra)."),
    address: str | None = typer.Option(None, "--address", help="Ray cluster address (HOST:PORT "
                                       "or 'auto'); default: a local cluster for this run."),
    workers: int = typer.Option(2, "--workers", help="Ray engine: embedding actors and search "
                                "tasks in flight."),
) -> None:
    """MiniLM embeddings + agglomerative dedup at cosine 0.35, similar library, topic clusters."""
    from contextlib import nullcontext

    from rlhf.pipeline.dedup import DedupError, run_dedup, write_pool_embeddings

    cfg = load_config(params, "dedup")
    if pool_embeddings_only:
        try:
            n = write_pool_embeddings(store, cfg, cache)
        except DedupError as exc:
            fail(str(exc))
        console.print(plain(f"pool_embeddings: {n:,} pool prompts ({cfg.model})"),
                      highlight=False)
        return
    if engine not in ("local", "ray"):
        fail(f"--engine must be local or ray, not {engine!r}")
    if workers < 1:
        fail("--workers must be >= 1")
    scale = nullcontext(None)
    if engine == "ray":
        from rlhf.pipeline.dedup_ray import RayEngine, RayMissing, _ray

        try:
            _ray()
        except RayMissing as exc:
            fail(str(exc))
        scale = RayEngine(address=address, workers=workers)
    try:
        with scale as eng, bar("embedding new prompts", unit="prompts") as embed, \
                bar("clustering", unit="prompts") as cluster:
            result = run_dedup(store, cfg, cache, on_embed=embed, on_cluster=cluster, engine=eng)
    except DedupError as exc:
        fail(str(exc))
    except ConnectionError as exc:
        fail(f"cannot reach the Ray cluster at {address}: {exc}")
    except OSError as exc:
        fail(f"I/O error: {exc}")
    m = result.metrics(cfg)
    if engine == "ray":
        m["ray"] = scale.stats
    write_metrics("dedup", m, metrics, report_path)
    console.print(plain(
        f"prompts {m['input_prompts']:,} ({m['unique_texts']:,} distinct) -> pool {m['kept']:,} + "
        f"similar {m['similar']:,}; {m['multi_member_clusters']:,} clusters with near-duplicates "
        f"(largest {m['largest_cluster']}), dedup ratio {m['dedup_ratio']:.3f}"), highlight=False)
    console.print(plain(
        f"{m['path']} {cfg.linkage} linkage at {cfg.distance_threshold}, partitions "
        f"{m['partitions']}, boundary merges {m['merges']}; embedded {m['embedded_new']:,} new, "
        f"{m['embedded_cached']:,} from cache ({m['model_id']}); {m['topic_clusters']} topic "
        f"clusters; splits {m['splits']}"), highlight=False)
