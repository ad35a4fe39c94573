"""The engine-bench page (docs/generated/engine-bench.md), one of docs/generate.py's pages: what
bench/engine.py wrote as JSON, the CPU runs (bench/data/engine_*.json) and the GPU runs
(bench/data/gpu/engine_*.json, bench/gpu_device.sh's), each stamped with its source file, its
content hash and the last commit that changed it. Until a GPU run of the static step is
committed, the page says that the GPU figures are pending and names the command that makes them.

    python docs/generate.py            # writes this page with the others
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

COUNT_COLUMNS = (("tokens_per_run", "tokens / run"), ("forwards_per_1k", "forwards"),
                 ("row_forwards_per_1k", "row-forwards"),
                 ("token_forwards_per_1k", "token-forwards"),
                 ("draft_forwards_per_1k", "draft forwards"),
                 ("draft_token_forwards_per_1k", "draft token-forwards (policy-equivalent)"),
                 ("oldlp_token_forwards_per_1k", "old-log-prob token-forwards"),
                 ("acceptance", "acceptance"))
# bench/engine.py's per-step figures (a variant's `step`: medians over the rounds)
STEP_COLUMNS = (("ms_per_step", "ms / decode step"), ("tokens_per_s", "generated tokens / s"),
                ("syncs_per_step", "host syncs / step"), ("shapes", "shapes"),
                ("captures", "CUDA graphs"), ("peak_gib", "peak GPU GiB"))
GPU_COMMAND = "GPU_DEVICE_STEPS=engine bash bench/gpu_device.sh"

INTRO = ("Counts per 1,000 generated tokens (summed over the repeats): sequential policy "
         "forwards, rows summed over them (what a finished row still costs under `hf`), token "
         "positions pushed through the policy (prefill, decode, verification); the draft "
         "model's sequential forwards and its token positions weighted by its share of the "
         "policy's layers (`native+model`; add them to the policy's for its compute); "
         "acceptance = accepted / drafted tokens. Seconds: the variants interleaved in each "
         "round, median [min, max] over the rounds; the load average at the start says what "
         "else ran. Where recorded, also with the PPO trainer's old-log-prob pass (run after "
         "`hf` only: `native` returns the sampled distribution, which replaces it) and the "
         "median over rounds of each variant's ratio to `hf`'s (the engine goal: ≤ 0.5x), also "
         "per generated token where recorded (each variant draws other samples, of other "
         "lengths). Where recorded, a second table per batch: the decode step's medians over the "
         "rounds (ms a step, generated tokens a second, host syncs a step, distinct shapes and "
         "CUDA graphs of the static step, peak GPU memory) and the median over rounds of the "
         "tokens a second against `hf`'s. What the engines are: [../engine.md](../engine.md).")


def _gpu_status(files: list[Path]) -> list[str]:
    """One line: the static step's GPU figures, or that they are pending."""
    static = [p for p in files if p.parent.name == "gpu" and any(
        "static" in rows for rows in json.loads(p.read_text(encoding="utf-8"))
        .get("batches", {}).values())]
    names = ", ".join(f"`{p.stem}`" for p in static)
    if static:
        return [f"GPU figures of the static step: {names} below.", ""]
    how = (f"`{GPU_COMMAND}` on a device writes them (engine_gpu.json, engine_gpu_b256.json); "
           "commit them under bench/data/gpu/.")
    if any(p.parent.name == "gpu" for p in files):
        return [(f"**GPU figures pending** for the static step: no bench/data/gpu/engine_*.json "
                 f"with a `static` variant yet. {how} The GPU runs below are older ones (`hf` "
                 "against `native` only)."), ""]
    return [f"**GPU figures pending**: no GPU run committed; {how}", ""]


def _header(r: dict, path: Path, root: Path, stamp: Callable[[Path, Path], list[str]]):
    smp = r.get("sampling", {})
    return [f"## {path.stem}", "", *stamp(root, path),
            f"- command: `{r.get('command')}`",
            f"- policy: `{r.get('policy')}`; prompts: `{r.get('prompts')}`",
            (f"- sampling: temperature {smp.get('temperature')}, top-p {smp.get('top_p')}, "
             f"{smp.get('max_new_tokens')} new tokens; draft_k {r.get('draft_k')}"
             + (f", draft_layers {r['draft_layers']}" if "draft_layers" in r else "") + "; "
             f"{r.get('repeats')} repeats"),
            (f"- machine: {r.get('machine')}, {r.get('cpus')} CPUs, torch {r.get('torch')}, "
             f"{r.get('threads')} thread(s), load average {r.get('load_1min_at_start')} at "
             "the start"
             + (f"; {r['gpu']}, {r.get('dtype')}, peak GPU memory per batch (GiB) "
                f"{r.get('gpu_peak_gib')}" if r.get("gpu") else "")),
            *([f"- note: {r['note']}"] if r.get("note") else []), ""]


def _counts_table(rows: dict, fmt: Callable[[Any], str]) -> list[str]:
    with_lp = any("seconds_with_oldlp_median" in row for row in rows.values())
    per_tok = any("ratio_vs_hf_with_oldlp_per_token_median" in row for row in rows.values())
    extra = (" | seconds with the old-log-prob pass | ÷ hf's, per round |"
             + (" ÷ hf's per generated token |" if per_tok else "") if with_lp else " |")
    out = ["| variant | " + " | ".join(h for _, h in COUNT_COLUMNS) + " | seconds" + extra,
           "|---|" + "---|" * (len(COUNT_COLUMNS) + 1 + 2 * with_lp + (with_lp and per_tok))]
    for v, row in rows.items():
        if "seconds_median" not in row:  # `failed`: the variants an install lacked
            continue
        cells = ["–" if row.get(k) is None else fmt(row[k]) for k, _ in COUNT_COLUMNS]
        line = (f"| {v} | " + " | ".join(cells) + f" | {fmt(row['seconds_median'])} "
                f"[{fmt(row['seconds_min'])}, {fmt(row['seconds_max'])}] |")
        if with_lp:
            ratio = row.get("ratio_vs_hf_with_oldlp_median")
            line += (f" {fmt(row['seconds_with_oldlp_median'])} "
                     f"[{fmt(row['seconds_with_oldlp_min'])}, "
                     f"{fmt(row['seconds_with_oldlp_max'])}] | "
                     + ("–" if ratio is None else f"{fmt(ratio)}x") + " |")
            if per_tok:
                tok_ratio = row.get("ratio_vs_hf_with_oldlp_per_token_median")
                line += " " + ("–" if tok_ratio is None else f"{fmt(tok_ratio)}x") + " |"
        out.append(line)
    return out


def _step_table(rows: dict, fmt: Callable[[Any], str]) -> list[str]:
    steps = {v: row["step"] for v, row in rows.items() if isinstance(row.get("step"), dict)}
    if not steps:
        return []
    out = ["", "| variant | " + " | ".join(h for _, h in STEP_COLUMNS)
           + " | tokens / s ÷ hf's, per round |", "|---|" + "---|" * (len(STEP_COLUMNS) + 1)]
    for v, st in steps.items():
        ratios = sorted(st.get("tokens_per_s_vs_hf") or [])
        mid = ratios[len(ratios) // 2] if len(ratios) % 2 else (
            (ratios[len(ratios) // 2 - 1] + ratios[len(ratios) // 2]) / 2 if ratios else None)
        out.append(f"| {v} | " + " | ".join("–" if st.get(k) is None else fmt(st[k])
                                           for k, _ in STEP_COLUMNS)
                   + " | " + ("–" if mid is None else f"{fmt(float(mid))}x") + " |")
    return out


def page(root: Path, command: str, stamp: Callable[[Path, Path], list[str]],
         fmt: Callable[[Any], str]) -> str:
    """The page's text; `command` rewrites it, `stamp(root, path)` and `fmt(value)` are
    generate.py's source stamp and number format, shared by every page."""
    lines = ["# Rollout engine benchmark", "",
             (f"<!-- written by `{command}` from bench/data/engine_*.json and "
              "bench/data/gpu/engine_*.json: rerun it -->"), "", INTRO, ""]
    data = root / "bench" / "data"  # the CPU runs, then the GPU runs (bench/gpu_device.sh)
    files = sorted(data.glob("engine_*.json")) + sorted(data.glob("gpu/engine_*.json"))
    lines += _gpu_status(files)
    if not files:
        return "\n".join([*lines, "No results yet: run bench/engine.py with --json.", ""])
    for path in files:
        r = json.loads(path.read_text(encoding="utf-8"))
        lines += _header(r, path, root, stamp)
        for batch, rows in r.get("batches", {}).items():
            lines += [f"### batch {batch}", "", *_counts_table(rows, fmt),
                      *_step_table(rows, fmt), ""]
    return "\n".join(lines)
