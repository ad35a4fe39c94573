"""Write the docs/generated/ pages from files a command produced, never from hand-typed figures.

    python docs/generate.py            # rewrite docs/generated/*.md and the generated blocks of
                                       # README.md (the pipeline) and docs/gpus.md (GPU stages)
    python docs/generate.py --check    # list what is stale (exit 1), write nothing

Pages: metrics.md and metrics-realdata.md (every headline figure of the git-tracked
artifacts/**/metrics/*.json as git holds them, not as the last `make run` rewrote them, each
stamped with its source file, content hash and the last commit that changed it), config.md
(every params.yaml key from the typed configs: type, default, the shipped value, range where
pipeline/ranges.py declares one, meaning from the field's comment or, a feature's key, its
declared help),
features.md (the PPO feature registry: each rollout-economy switch and whether params.yaml turns
it on), verdicts.md (BENCHMARKS.md's verdict table, what each switch buys), engine-bench.md
(bench/engine.py's JSON in bench/data/, written by docs/engine_bench.py), scale-bench.md (the
dedup, scheduler and store benchmarks' JSON in bench/data/) and pipeline.md (the DVC stage graph as mermaid, derived from dvc.yaml's deps and outs;
README.md carries the same picture between its `generated:dag` markers). docs/gpus.md carries the
realdata stages' GPU figures (stages_*.json in bench/data/gpu/) between its `generated:stages-gpu`
markers.

`figure_mismatches` is the other half of the rule: a README.md or docs/ number written next to a metric
name (`` `eval.gold_gain` 0.151 ``) must equal that metric, as git holds it, at the precision
written. So `make test` after `make run` on another CPU model (which rewrites the metrics files)
stays green, and a commit of new metrics without the pages and quotes that follow fails it.

This module draws the metrics and pipeline pages, checks freshness and quoted figures; the
reference pages are docs/gen_reference.py's, the benchmark pages docs/gen_bench.py's, and
docs/gen_sources.py reads and stamps what they quote.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from gen_bench import engine_bench_page, scale_bench_page, stages_gpu_block, verdicts_page
from gen_reference import config_page, features_page
from gen_sources import COMMAND, METRICS_DIRS, drifted, flatten, fmt, metrics_files, stamp

ROOT = Path(__file__).resolve().parents[1]
OUT = "docs/generated"
DAG_BEGIN, DAG_END = "<!-- generated:dag (python docs/generate.py) -->", "<!-- /generated:dag -->"
STAGES_BEGIN = "<!-- generated:stages-gpu (python docs/generate.py) -->"
STAGES_END = "<!-- /generated:stages-gpu -->"
# a line that names the commit is informative: the freshness check compares everything else
# (the content hash binds a page to its source), so committing a regenerated page stays fresh
COMMIT_LINE = re.compile(r"^- last commit that changed it: .*$", re.MULTILINE)


# --------------------------------------------------------------------------- pages
def metrics_page(root: Path, under: str, title: str, how: str, prefix: str = "") -> str:
    lines = [f"# {title}", "", f"<!-- written by `{COMMAND}`: rerun it, never edit by hand -->",
             "", how, ""]
    for path, data in metrics_files(root, under):
        stage = prefix + path.stem
        lines += [f"## {stage}", "", *stamp(root, path, data), "", "| metric | value |",
                  "|---|---|"]
        for k, v in flatten(json.loads(data)).items():
            lines.append(f"| `{stage}:{k}` | {fmt(v)} |")
        lines.append("")
    return "\n".join(lines)


def dag_edges(root: Path, dvc_yaml: str = "dvc.yaml") -> tuple[list[str], list[tuple[str, str]]]:
    """The stages of a dvc.yaml and (upstream, downstream) for each out a later stage depends on
    (the same path, or one inside the other)."""
    import yaml

    stages = yaml.safe_load((root / dvc_yaml).read_text(encoding="utf-8"))["stages"]

    def paths(items):
        return [next(iter(i)) if isinstance(i, dict) else i for i in items or []]

    outs = {s: paths(d.get("outs")) + paths(d.get("metrics")) for s, d in stages.items()}
    edges = []
    for s, d in stages.items():
        for dep in paths(d.get("deps")):
            for up, ps in outs.items():
                if up != s and any(dep == p or dep.startswith(p + "/") or p.startswith(dep + "/")
                                   for p in ps) and (up, s) not in edges:
                    edges.append((up, s))
    return list(stages), edges


def dag_mermaid(root: Path) -> str:
    names, edges = dag_edges(root)
    body = [f"  {a} --> {b}" for a, b in edges]
    body += [f"  {n}" for n in names if not any(n in e for e in edges)]
    return "```mermaid\nflowchart LR\n" + "\n".join(body) + "\n```"


def pipeline_page(root: Path) -> str:
    return "\n".join([
        "# The pipeline graph", "", f"<!-- written by `{COMMAND}` from dvc.yaml -->", "",
        ("Each arrow: the downstream stage depends on an output of the upstream one "
        "(`dvc dag` draws the same graph). What each stage does: [../stages.md](../stages.md)."),
        "", dag_mermaid(root), ""])


def pages(root: Path) -> dict[str, str]:
    """{path relative to root: content} of every generated page."""
    return {
        f"{OUT}/metrics.md": metrics_page(
            root, "artifacts/metrics", "Headline metrics of the default pipeline",
            "What the last committed `make run` wrote (`dvc metrics show` lists the headline "
            "subset dvc.yaml declares; every stage's details are in artifacts/reports/)."),
        f"{OUT}/metrics-realdata.md": metrics_page(
            root, "profiles/realdata/artifacts/metrics", "Headline metrics of the realdata profile",
            "What the last committed `cd profiles/realdata && dvc repro` wrote (see "
            "[../realdata.md](../realdata.md)).", prefix="realdata/"),
        f"{OUT}/config.md": config_page(root),
        f"{OUT}/features.md": features_page(root),
        f"{OUT}/pipeline.md": pipeline_page(root),
        f"{OUT}/verdicts.md": verdicts_page(root),
        f"{OUT}/engine-bench.md": engine_bench_page(root),
        f"{OUT}/scale-bench.md": scale_bench_page(root),
    }


def blocks(root: Path) -> list[tuple[str, str, str | None]]:
    """(file, block name, the file with its block rewritten; None where it has no markers) of
    each hand-written file that carries a generated block."""
    out = []
    for rel, name, begin, end, body in (
            ("README.md", "dag", DAG_BEGIN, DAG_END, dag_mermaid),
            ("docs/gpus.md", "stages-gpu", STAGES_BEGIN, STAGES_END, stages_gpu_block)):
        path = root / rel
        text = path.read_text(encoding="utf-8") if path.is_file() else ""
        if begin not in text or end not in text:
            out.append((rel, name, None))
            continue
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        out.append((rel, name, f"{head}{begin}\n{body(root)}\n{end}{tail}"))
    return out


def _norm(text: str) -> str:
    return COMMIT_LINE.sub("", text)


def stale(root: Path) -> list[str]:
    """Generated pages (and README.md's picture) that differ from a fresh regeneration."""
    out = []
    for rel, text in pages(root).items():
        path = root / rel
        if not path.is_file() or _norm(path.read_text(encoding="utf-8")) != _norm(text):
            out.append(rel)
    for rel, name, text in blocks(root):
        if text is not None and _norm(text) != _norm((root / rel).read_text(encoding="utf-8")):
            out.append(f"{rel} (the generated:{name} block)")
    return out


def write(root: Path) -> list[str]:
    written = []
    for rel, text in pages(root).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(rel)
    for rel, _, text in blocks(root):
        if text is not None:
            (root / rel).write_text(text, encoding="utf-8")
    return written


# --------------------------------------------------------------------------- quoted figures
NUMBER = r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?"
QUOTE = re.compile(r"`(?:(?P<stage>[\w/-]+):)?(?P<key>[A-Za-z_][\w.]*)`[^`\d\n]{0,12}?(?P<num>"
                   + NUMBER + ")")


def all_metrics(root: Path) -> dict[str, dict[str, Any]]:
    """{stage or `realdata/stage`: flattened metrics} of the tracked metrics files."""
    out = {}
    for under, pre in METRICS_DIRS:
        for p, data in metrics_files(root, under):
            out[pre + p.stem] = flatten(json.loads(data))
    return out


def figure_mismatches(text: str, metrics: dict[str, dict[str, Any]]) -> list[str]:
    """Each `` `stage:key` NUMBER `` (or a `key` only one default-pipeline stage has) whose number
    differs from the metric rounded to the digits written."""
    by_key: dict[str, list[str]] = {}
    for stage, m in metrics.items():
        if "/" not in stage:
            for k in m:
                by_key.setdefault(k, []).append(stage)
    bad = []
    for mt in QUOTE.finditer(text):
        stage, key, num = mt["stage"], mt["key"], mt["num"]
        if stage is None:
            if len(by_key.get(key, [])) != 1:
                continue
            stage = by_key[key][0]
        value = metrics.get(stage, {}).get(key)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        written = float(num.replace(",", ""))
        if "e" in num:  # scientific: equal to the mantissa's digits
            mant = num.split("e")[0]
            ok = abs(written - value) <= 0.5 * 10 ** (int(num.split("e")[1]) - (
                len(mant.split(".")[1]) if "." in mant else 0)) * (1 + 1e-9)
        else:
            digits = len(num.split(".")[1]) if "." in num else 0
            ok = round(float(value), digits) == round(written, digits)
        if not ok:
            bad.append(f"{stage}:{key} quoted as {num}, the metric is {value}")
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="list stale pages, write nothing")
    args = ap.parse_args(argv)
    moved = drifted(ROOT)
    if moved:  # another CPU model's `make run`, or a rerun whose figures are not staged yet
        print(f"note: {len(moved)} metrics file(s) differ from git's copy ({', '.join(moved)}); "
              "the pages quote git's: `git add` them to quote yours", file=sys.stderr)
    if args.check:
        bad = stale(ROOT)
        for rel in bad:
            print(f"stale: {rel} (run {COMMAND})")
        return 1 if bad else 0
    for rel in write(ROOT):
        print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
