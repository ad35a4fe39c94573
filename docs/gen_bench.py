"""docs/generate.py's benchmark pages, rendered from the files the benchmarks wrote: verdicts.md
(BENCHMARKS.md's verdict table), engine-bench.md (bench/engine.py's JSON in bench/data/) and
scale-bench.md (the dedup, scheduler and store benchmarks' JSON in bench/data/).

    python docs/generate.py
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from gen_sources import COMMAND, fmt, stamp


def verdicts_page(root: Path) -> str:
    """BENCHMARKS.md's verdict table (what each rollout-economy switch buys),
    with the report's provenance lines: the page docs/ppo.md points at instead of typing one."""
    src = root / "BENCHMARKS.md"
    lines = ["# Verdicts of the rollout-economy benchmark", "",
             f"<!-- written by `{COMMAND}` from BENCHMARKS.md: rerun it, never edit by hand -->", ""]
    if not src.is_file():
        return "\n".join([*lines, "BENCHMARKS.md is missing: run `make bench`.", ""])
    text = src.read_text(encoding="utf-8")
    prov = [ln for ln in text.splitlines()
            if ln.startswith(("- commit:", "- command (this report):", "- date:"))][:3]
    m = re.search(r"^### Verdicts.*?$(.*?)(?=^#{2,3} )", text, re.MULTILINE | re.DOTALL)
    body = m.group(1).strip() if m else "BENCHMARKS.md has no verdict section: run `make bench`."
    return "\n".join([*lines, *stamp(root, src), *prov, "",
                      ("Each arm at equal generated tokens, three seeds each (bootstrap "
                       "interval), against the arm its columns name (the table's header and "
                       "footnote); how to read it: [../benchmarks.md](../benchmarks.md)."),
                      "", body, ""])


ENGINE_COLUMNS = (("tokens_per_run", "tokens / run"), ("forwards_per_1k", "forwards"),
                  ("row_forwards_per_1k", "row-forwards"),
                  ("token_forwards_per_1k", "token-forwards"),
                  ("draft_forwards_per_1k", "draft forwards"),
                  ("draft_token_forwards_per_1k", "draft token-forwards (policy-equivalent)"),
                  ("oldlp_token_forwards_per_1k", "old-log-prob token-forwards"),
                  ("acceptance", "acceptance"))


def engine_bench_page(root: Path) -> str:
    """bench/engine.py's JSON results (bench/data/engine_*.json): counted compute per 1,000
    generated tokens of each rollout engine and drafter, then the interleaved seconds."""
    lines = ["# Rollout engine benchmark", "",
             (f"<!-- written by `{COMMAND}` from bench/data/engine_*.json and "
              "bench/data/gpu/engine_*.json: rerun it -->"), "",
             ("Counts per 1,000 generated tokens (summed over the repeats): sequential policy "
              "forwards, rows summed over them (what a finished row still costs under `hf`), token "
              "positions pushed through the policy (prefill, decode, verification); the draft "
              "model's sequential forwards and its token positions weighted by its share of the "
              "policy's layers (`native+model`; add them to the policy's for its compute); "
              "acceptance = accepted / drafted tokens. Seconds: the variants interleaved in each round, median "
              "[min, max] over the rounds; the load average at the start says what else ran. "
              "Where recorded, also with the PPO trainer's old-log-prob pass (run after `hf` "
              "only: `native` returns the sampled distribution, which replaces it) and the "
              "median over rounds of each variant's ratio to `hf`'s (the engine goal: ≤ 0.5x), also "
              "per generated token where recorded (each variant draws other samples, of other "
              "lengths). "
              "What the engines are: [../engine.md](../engine.md)."), ""]
    data = root / "bench" / "data"  # the CPU runs, then the GPU runs (bench/gpu_device.sh)
    files = sorted(data.glob("engine_*.json")) + sorted(data.glob("gpu/engine_*.json"))
    if not files:
        return "\n".join([*lines, "No results yet: run bench/engine.py with --json.", ""])
    for path in files:
        r = json.loads(path.read_text(encoding="utf-8"))
        smp = r.get("sampling", {})
        lines += [f"## {path.stem}", "", *stamp(root, path),
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
                      f"{r.get('gpu_peak_gib')}" if r.get("gpu") else "")), ""]
        for batch, rows in r.get("batches", {}).items():
            with_lp = any("seconds_with_oldlp_median" in row for row in rows.values())
            per_tok = any("ratio_vs_hf_with_oldlp_per_token_median" in row
                          for row in rows.values())
            extra = (" | seconds with the old-log-prob pass | ÷ hf's, per round |"
                     + (" ÷ hf's per generated token |" if per_tok else "")
                     if with_lp else " |")
            lines += [f"### batch {batch}", "",
                      "| variant | " + " | ".join(h for _, h in ENGINE_COLUMNS) + " | seconds"
                      + extra, "|---|" + "---|" * (len(ENGINE_COLUMNS) + 1 + 2 * with_lp
                                                   + (with_lp and per_tok))]
            for v, row in rows.items():
                cells = ["–" if row.get(k) is None else fmt(row[k]) for k, _ in ENGINE_COLUMNS]
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
                        line += (" " + ("–" if tok_ratio is None else f"{fmt(tok_ratio)}x")
                                 + " |")
                lines.append(line)
            lines.append("")
    return "\n".join(lines)


SCALE_BENCHES = (("dedup.json", "Dedup: the index path at 20k and 1M planted prompts"),
                 ("dedup_real.json", "Dedup: the index path on real prompts (MiniLM)"),
                 ("dedup_ray.json", "Dedup on Ray: 2 local workers against the default path"),
                 ("scheduler.json", "The prompt scheduler over a 1M pool"),
                 ("query.json", "The rollout store at 10M rows: bytes and audits"))


def _table(rows: list[dict]) -> list[str]:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    out = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        out.append("| " + " | ".join("–" if r.get(k) is None else fmt(r[k]).replace("|", "/")
                                     for k in keys) + " |")
    return out


def scale_bench_page(root: Path) -> str:
    """The scale benchmarks' JSON results (bench/data/{dedup,dedup_real,dedup_ray,scheduler,
    query}.json),
    each with the command, commit, machine and load that produced it."""
    lines = ["# Scale benchmarks", "",
             f"<!-- written by `{COMMAND}` from bench/data/*.json: rerun it -->", "",
             ("What bench/bench_dedup.py, bench/bench_dedup_ray.py, bench/bench_scheduler.py and "
              "bench/bench_query.py last wrote. The machine is shared: seconds are upper bounds "
              "when the load average at the start was high (other jobs on the same cores); the "
              "pair counts, agreements, bytes and peak memory do not depend on it. What they "
              "measure: [../scale-out.md](../scale-out.md), [../store.md](../store.md)."), ""]
    for name, title in SCALE_BENCHES:
        path = root / "bench" / "data" / name
        if not path.is_file():
            continue
        r = json.loads(path.read_text(encoding="utf-8"))
        lines += [f"## {title}", "", *stamp(root, path), f"- command: `{r.get('command')}`",
                  f"- code at commit `{r.get('commit')}`",
                  (f"- machine: {r.get('machine')}, {r.get('cpus')} CPUs, load average "
                   f"{r.get('load_1min_at_start')} at the start"
                   + (f", {r['load_at_end']} (1, 5, 15 min) at the end" if r.get("load_at_end")
                      else ""))]
        lines += [f"- {k}: {fmt(v)}" for k, v in r.items() if k not in
                  ("command", "commit", "machine", "cpus", "load_1min_at_start", "load_at_end",
                   "rows")]
        wide = [x for x in r.get("rows", []) if any("." in k for k in x)]
        rest = [x for x in r.get("rows", []) if x not in wide]
        lines.append("")
        for x in wide:
            lines += ["| field | value |", "|---|---|",
                      *(f"| {k} | {fmt(v)} |" for k, v in x.items()), ""]
        if rest:
            lines += [*_table(rest), ""]
    return "\n".join(lines)
