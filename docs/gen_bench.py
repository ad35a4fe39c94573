"""docs/generate.py's benchmark pages, rendered from the files the benchmarks wrote: verdicts.md
(BENCHMARKS.md's verdict table), engine-bench.md (bench/engine.py's JSON in bench/data/),
scale-bench.md (the dedup, scheduler and store benchmarks' JSON in bench/data/) and docs/gpus.md's
stages block (bench/stages_gpu.py's JSON in bench/data/gpu/).

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


def engine_bench_page(root: Path) -> str:
    """bench/engine.py's JSON results: docs/engine_bench.py writes the page."""
    import engine_bench  # docs/ is on the path, as for every sibling of generate.py

    return engine_bench.page(root, COMMAND, stamp, fmt)


def stages_gpu_block(root: Path) -> str:
    """bench/stages_gpu.py's JSON results (stages_*.json in bench/data/gpu/): docs/stages_bench.py
    writes the block docs/gpus.md carries between its `generated:stages-gpu` markers."""
    import stages_bench  # docs/ is on the path, as for every sibling of generate.py

    return stages_bench.block(root, stamp, fmt)


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
