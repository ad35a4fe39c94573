"""Write the docs/generated/ pages from files a command produced, never from hand-typed figures.

    python docs/generate.py            # rewrite docs/generated/*.md and README.md's pipeline picture
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
README.md carries the same picture between its `generated:dag` markers).

`figure_mismatches` is the other half of the rule: a README.md or docs/ number written next to a metric
name (`` `eval.gold_gain` 0.151 ``) must equal that metric, as git holds it, at the precision
written. So `make test` after `make run` on another CPU model (which rewrites the metrics files)
stays green, and a commit of new metrics without the pages and quotes that follow fails it.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import hashlib
import importlib
import importlib.util
import inspect
import io
import json
import re
import subprocess
import sys
import textwrap
import tokenize
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = "docs/generated"
COMMAND = "python docs/generate.py"
DAG_BEGIN, DAG_END = "<!-- generated:dag (python docs/generate.py) -->", "<!-- /generated:dag -->"
# a line that names the commit is informative: the freshness check compares everything else
# (the content hash binds a page to its source), so committing a regenerated page stays fresh
COMMIT_LINE = re.compile(r"^- last commit that changed it: .*$", re.MULTILINE)


# --------------------------------------------------------------------------- sources
# the metrics folders the docs quote, and the prefix a quote names their stages with
METRICS_DIRS = (("artifacts/metrics", ""), ("profiles/realdata/artifacts/metrics", "realdata/"))


def _git(root: Path, *args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def metrics_files(root: Path, under: str = "artifacts/metrics") -> list[tuple[Path, bytes]]:
    """Each metrics file git tracks under `under`, with its content as git's index holds it (every
    *.json there, as it stands, when not in a git tree). The docs quote what is committed, not
    what the last `make run` wrote: on a CPU model other than the lock's, `make run` rewrites
    these files (other float kernels, other figures), and the docs must stay true for the next
    clean clone; `git add` a metrics file to quote its new figures."""
    listed = _git(root, "ls-files", "-s", "--", f"{under}/*.json")
    if not listed:
        return [(p, p.read_bytes()) for p in sorted((root / under).glob("*.json"))]
    blobs = {}
    for line in listed.splitlines():
        meta, rel = line.split("\t", 1)
        _mode, sha, stage = meta.split()
        if stage == "0":  # a merge conflict's sides (stages 1-3) are no figures yet
            blobs[root / rel] = sha
    return [(p, subprocess.run(["git", "cat-file", "blob", sha], cwd=root, capture_output=True,
                               check=True).stdout) for p, sha in sorted(blobs.items())]


def drifted(root: Path) -> list[str]:
    """The metrics files whose working copy differs from git's: what the pages do not quote."""
    return [p.relative_to(root).as_posix() for under, _ in METRICS_DIRS
            for p, data in metrics_files(root, under) if not p.is_file() or p.read_bytes() != data]


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.3e}"
    return json.dumps(v) if not isinstance(v, (int, str)) else str(v)


def _stamp(root: Path, path: Path, data: bytes | None = None) -> list[str]:
    rel = path.relative_to(root).as_posix()
    digest = hashlib.sha256(path.read_bytes() if data is None else data).hexdigest()[:12]
    commit = _git(root, "log", "-1", "--format=%h %cs", "--", rel) or "not committed"
    return [f"- source: `{rel}` (sha256 `{digest}`)",
            f"- last commit that changed it: {commit}"]


# --------------------------------------------------------------------------- pages
def metrics_page(root: Path, under: str, title: str, how: str, prefix: str = "") -> str:
    lines = [f"# {title}", "", f"<!-- written by `{COMMAND}`: rerun it, never edit by hand -->",
             "", how, ""]
    for path, data in metrics_files(root, under):
        stage = prefix + path.stem
        lines += [f"## {stage}", "", *_stamp(root, path, data), "", "| metric | value |",
                  "|---|---|"]
        for k, v in flatten(json.loads(data)).items():
            lines.append(f"| `{stage}:{k}` | {_fmt(v)} |")
        lines.append("")
    return "\n".join(lines)


def _comments(src: str) -> dict[int, str]:
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = tok.string.lstrip("#").strip()
    return out


def field_meanings(cls: type) -> dict[str, str]:
    """{field: its comment}: the comment on the field's line, else the comment lines just above.
    PPOConfig is built from its `core` class (the loop's keys, commented) and the features'
    declarations (`feature_fields`, each with its help)."""
    declared = {k: c.help for k, c in getattr(cls, "feature_fields", {}).items()}
    src = textwrap.dedent(inspect.getsource(getattr(cls, "core", cls)))
    comments = _comments(src)
    lines = src.splitlines()
    out = {}
    for node in ast.parse(src).body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            n = node.lineno
            text = comments.get(n, "")
            if not text:
                above, i = [], n - 1
                while i >= 1 and lines[i - 1].strip().startswith("#"):
                    above.insert(0, comments.get(i, ""))
                    i -= 1
                text = " ".join(above)
            out[node.target.id] = text
    return {**out, **declared}


def _type_name(t: Any) -> str:
    if isinstance(t, str):
        return t
    s = getattr(t, "__name__", None) if typing.get_origin(t) is None else None
    return s or str(t).replace("typing.", "")


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return "(required)"


def _short(v: Any, n: int = 60) -> str:
    if dataclasses.is_dataclass(v):
        v = dataclasses.asdict(v)
    s = v if isinstance(v, str) else json.dumps(v, default=str, ensure_ascii=False)
    s = s.replace("|", "\\|")
    return s if len(s) <= n else s[: n - 1] + "…"


def _ranges() -> dict | None:
    """pipeline/ranges.py's declared ranges, when that module exists: {(section, key): text}."""
    try:
        mod = importlib.import_module("rlhf.pipeline.ranges")
    except ImportError:
        return None
    table = getattr(mod, "RANGES", None)
    if not isinstance(table, dict):
        return None
    out = {}
    for key, rng in table.items():
        section, _, name = key.partition(".") if isinstance(key, str) else key
        out[(section, name)] = str(rng)
    return out


def config_page(root: Path) -> str:
    import yaml
    from rlhf.pipeline.config import SECTIONS, config_class

    params = yaml.safe_load((root / "params.yaml").read_text(encoding="utf-8")) or {}
    ranges = _ranges()
    head = "| key | type | default | params.yaml | " + ("range | " if ranges is not None else "") \
        + "meaning |"
    lines = ["# Configuration reference", "",
             f"<!-- written by `{COMMAND}` from the typed configs and params.yaml -->", "",
             ("Every key of params.yaml, section by section: the typed dataclass that checks it "
             "(`rlhf params check`), its type and built-in default, the value params.yaml ships, "
             "and its meaning (the field's comment in the code). The stages read every key from "
             "params.yaml; the built-in default is what a test or a library call gets."), ""]
    for section in SECTIONS:
        cls = config_class(section)
        shipped = params.get(section) or {}
        meanings = field_meanings(cls)
        hints = typing.get_type_hints(cls)
        lines += [f"## `{section}`", "", f"`{cls.__module__}.{cls.__qualname__}`", "", head,
                  "|" + "---|" * head.count(" | ") + "---|"]
        rows = [(f.name, _type_name(hints.get(f.name, f.type)), _default(f),
                 meanings.get(f.name, "")) for f in dataclasses.fields(cls)
                if not f.name.startswith("_") and f.name != "extra"]
        if section == "ppo":
            from rlhf.pipeline.ppo.features.registry import declared_fields
            rows += [(c.name, _type_name(c.type), c.default, c.help)
                     for c in declared_fields().values() if c.name not in hints]
        for name, tname, default, meaning in rows:
            value = _short(shipped[name]) if name in shipped else "–"
            rng = [(ranges or {}).get((section, name), "")] if ranges is not None else []
            cells = [f"`{name}`", f"`{tname}`".replace("|", "\\|"), _short(default), value,
                     *rng, meaning.replace("|", "\\|")]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def features_page(root: Path) -> str:
    from rlhf.pipeline.config import load_section
    from rlhf.pipeline.ppo.features.registry import ordered

    cfg = load_section(root / "params.yaml", "ppo")
    lines = ["# PPO features (the rollout-economy switches)", "",
             f"<!-- written by `{COMMAND}` from pipeline/ppo/features/ and params.yaml -->", "",
             ("Every registered feature: its switch(es), whether params.yaml's `ppo:` section "
             "(what `make run` trains with) turns it on, and what it does. Plain PPO is every "
             "switch at its off value. Measured verdicts: [BENCHMARKS.md](../../BENCHMARKS.md) "
             "and [../ppo.md](../ppo.md)."), "",
             "| feature | switches (off value) | on in params.yaml | what it does |",
             "|---|---|---|---|"]
    for f in ordered():
        sw = ", ".join(f"`{k}` ({_short(v)})" for k, v in f.switches.items())
        lines.append(f"| `{f.name}` | {sw} | {'**on**' if f.on(cfg) else 'off'} | "
                     f"{f.help.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


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
    return "\n".join([*lines, *_stamp(root, src), *prov, "",
                      ("Each arm at equal generated tokens, three seeds each (bootstrap "
                       "interval), against the arm its columns name (the table's header and "
                       "footnote); how to read it: [../benchmarks.md](../benchmarks.md)."),
                      "", body, ""])


def engine_bench_page(root: Path) -> str:
    """bench/engine.py's JSON results: docs/engine_bench.py writes the page."""
    path = Path(__file__).resolve().with_name("engine_bench.py")
    spec = importlib.util.spec_from_file_location("docs_engine_bench", path)
    module = importlib.util.module_from_spec(spec)  # docs/ is no package: loaded by its path
    spec.loader.exec_module(module)
    return module.page(root, COMMAND, _stamp, _fmt)


SCALE_BENCHES = (("dedup.json", "Dedup: the index path at 20k and 1M planted prompts"),
                 ("dedup_real.json", "Dedup: the index path on real prompts (MiniLM)"),
                 ("dedup_ray.json", "Dedup on Ray: 2 local workers against the default path"),
                 ("scheduler.json", "The prompt scheduler over a 1M pool"),
                 ("query.json", "The rollout store at 10M rows: bytes and audits"))


def _table(rows: list[dict]) -> list[str]:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    out = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        out.append("| " + " | ".join("–" if r.get(k) is None else _fmt(r[k]).replace("|", "/")
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
        lines += [f"## {title}", "", *_stamp(root, path), f"- command: `{r.get('command')}`",
                  f"- code at commit `{r.get('commit')}`",
                  (f"- machine: {r.get('machine')}, {r.get('cpus')} CPUs, load average "
                   f"{r.get('load_1min_at_start')} at the start"
                   + (f", {r['load_at_end']} (1, 5, 15 min) at the end" if r.get("load_at_end")
                      else ""))]
        lines += [f"- {k}: {_fmt(v)}" for k, v in r.items() if k not in
                  ("command", "commit", "machine", "cpus", "load_1min_at_start", "load_at_end",
                   "rows")]
        wide = [x for x in r.get("rows", []) if any("." in k for k in x)]
        rest = [x for x in r.get("rows", []) if x not in wide]
        lines.append("")
        for x in wide:
            lines += ["| field | value |", "|---|---|",
                      *(f"| {k} | {_fmt(v)} |" for k, v in x.items()), ""]
        if rest:
            lines += [*_table(rest), ""]
    return "\n".join(lines)


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


def readme_with_dag(root: Path) -> str | None:
    readme = root / "README.md"
    text = readme.read_text(encoding="utf-8") if readme.is_file() else ""
    if DAG_BEGIN not in text or DAG_END not in text:
        return None
    head, rest = text.split(DAG_BEGIN, 1)
    _, tail = rest.split(DAG_END, 1)
    return f"{head}{DAG_BEGIN}\n{dag_mermaid(root)}\n{DAG_END}{tail}"


def _norm(text: str) -> str:
    return COMMIT_LINE.sub("", text)


def stale(root: Path) -> list[str]:
    """Generated pages (and README.md's picture) that differ from a fresh regeneration."""
    out = []
    for rel, text in pages(root).items():
        path = root / rel
        if not path.is_file() or _norm(path.read_text(encoding="utf-8")) != _norm(text):
            out.append(rel)
    readme = readme_with_dag(root)
    if readme is not None and readme != (root / "README.md").read_text(encoding="utf-8"):
        out.append("README.md (the generated:dag block)")
    return out


def write(root: Path) -> list[str]:
    written = []
    for rel, text in pages(root).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(rel)
    readme = readme_with_dag(root)
    if readme is not None:
        (root / "README.md").write_text(readme, encoding="utf-8")
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
