"""The docs stay true: README is short, every internal link resolves, the generated pages equal a
fresh regeneration from the files they quote, and a number written next to a metric equals it
(the metrics as git holds them: another CPU model's `make run` rewrites the files, not the
committed figures)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("docs_generate", REPO / "docs" / "generate.py")
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def doc_files(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def broken_links(root: Path) -> list[str]:
    """Each relative link in README.md and docs/ whose file (or #anchor's file) is missing."""
    bad = []
    for md in doc_files(root):
        text = re.sub(r"```.*?```", "", md.read_text(encoding="utf-8"), flags=re.DOTALL)
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = target.split("#", 1)[0]
            if not (md.parent / path).exists():
                bad.append(f"{md.relative_to(root)}: {target}")
    return bad


def test_readme_is_short_and_indexes_docs(repo):
    text = (repo / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    assert "docs/README.md" in text and "make run" in text and "make test" in text


def test_every_internal_link_resolves(repo):
    assert broken_links(repo) == []


def test_broken_link_is_caught(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("[ok](docs/a.md) [gone](docs/missing.md#x)\n")
    (tmp_path / "docs" / "a.md").write_text("[up](../README.md)\n")
    assert broken_links(tmp_path) == ["README.md: docs/missing.md#x"]


def test_generated_pages_are_fresh(repo):
    assert gen.stale(repo) == [], "run: python docs/generate.py"


def _copy_tree(root: Path) -> Path:
    """The files the docs checks read, copied from this checkout into `root`: the docs as they
    stand, the metrics as git holds them (what the docs quote)."""
    for rel in ("README.md", "BENCHMARKS.md", "bench/data", "params.yaml", "dvc.yaml", "docs"):
        src, dst = REPO / rel, root / rel
        if src.is_dir():
            shutil.copytree(src, dst, dirs_exist_ok=True)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dst)
    for under, _ in gen.METRICS_DIRS:
        for path, data in gen.metrics_files(REPO, under):
            (root / under).mkdir(parents=True, exist_ok=True)
            (root / under / path.name).write_bytes(data)
    return root


def test_a_changed_metric_makes_its_page_stale(tmp_path):
    root = _copy_tree(tmp_path / "repo")  # not a git tree: every metrics file there is a source
    assert gen.stale(root) == []
    path = root / "artifacts" / "metrics" / "eval.json"
    data = json.loads(path.read_text())
    data["eval"]["gold_gain"] = data["eval"]["gold_gain"] + 0.5
    path.write_text(json.dumps(data))
    assert gen.stale(root) == ["docs/generated/metrics.md"]
    gen.write(root)
    assert gen.stale(root) == []
    assert f"| `eval:eval.gold_gain` | {gen.fmt(data['eval']['gold_gain'])} |" in (
        root / "docs/generated/metrics.md").read_text()


def test_a_changed_dag_makes_the_readme_stale(tmp_path):
    root = _copy_tree(tmp_path / "repo")
    dvc = root / "dvc.yaml"
    dvc.write_text(dvc.read_text().replace("      - artifacts/store/routes  #", "      - x  #", 1))
    assert "README.md (the generated:dag block)" in gen.stale(root)


def quote_mismatches(root: Path, metrics: dict | None = None) -> list[str]:
    """Each figure README.md or docs/ quotes that `metrics` (the committed ones) does not hold."""
    metrics = gen.all_metrics(root) if metrics is None else metrics
    return [f"{md.relative_to(root)}: {m}" for md in doc_files(root)
            for m in gen.figure_mismatches(md.read_text(encoding="utf-8"), metrics)]


def test_quoted_figures_match_their_metrics(repo):
    assert quote_mismatches(repo) == []


# --------------------------------------------------------------------------- the README's order
def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=docs", "-c", "user.email=docs@localhost",
                           "-c", "commit.gpgsign=false", *args],
                          cwd=cwd, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def clean_clone(tmp_path) -> Path:
    """A `git clone` of this repository at HEAD with this checkout's docs (and git's copy of its
    metrics) committed on top: a newcomer's clone of the commit being made."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: nothing to clone")
    clone = tmp_path / "clone"
    _git(tmp_path, "clone", "-q", "--no-checkout", str(REPO), str(clone))
    _git(clone, "checkout", "-q", _git(REPO, "rev-parse", "HEAD").strip())
    _copy_tree(clone)
    _git(clone, "add", "-A")
    _git(clone, "commit", "-q", "--allow-empty", "-m", "this checkout's docs")
    return clone


def _rewrite_as_another_cpu(root: Path) -> dict[str, dict]:
    """Rewrite artifacts/metrics/*.json and dvc.lock as `make run` on another CPU model does
    (other float kernels: other figures and other output hashes from `dedup` on), here every
    float in its third significant digit, every count by one and every output's md5; return the
    rewritten figures. DVC leaves the rewritten lock unstaged (test_dvc_does_not_stage_the_lock)."""
    lock = yaml.safe_load((root / "dvc.lock").read_text(encoding="utf-8"))
    for stage in lock["stages"].values():
        for out in stage.get("outs", []):
            folder = out["md5"].endswith(".dir")
            out["md5"] = hashlib.md5(out["md5"].encode()).hexdigest() + (".dir" if folder else "")
    (root / "dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False), encoding="utf-8")

    def moved(v):
        if isinstance(v, dict):
            return {k: moved(x) for k, x in v.items()}
        if isinstance(v, float):
            return float(f"{v * 1.01 + 1e-4:.6g}")
        return v + 1 if isinstance(v, int) and not isinstance(v, bool) else v

    out = {}
    for path in sorted((root / "artifacts" / "metrics").glob("*.json")):
        data = moved(json.loads(path.read_text(encoding="utf-8")))
        path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        out[path.stem] = gen.flatten(data)
    return out


def test_make_test_after_make_run_on_another_cpu_stays_green(clean_clone):
    """The README's order, `make run` then `make test`, on a CPU model other than the lock's."""
    from bench.economy.freshness import stale_inputs

    rewritten = _rewrite_as_another_cpu(clean_clone)
    names = [f"artifacts/metrics/{stage}.json" for stage in rewritten]
    assert _git(clean_clone, "status", "--porcelain").split() == [
        x for n in [*names, "dvc.lock"] for x in ("M", n)]
    assert quote_mismatches(clean_clone, rewritten) != []  # the rewrite moves quoted figures
    assert gen.stale(clean_clone) == []
    assert quote_mismatches(clean_clone) == []
    assert gen.drifted(clean_clone) == names  # what `python docs/generate.py` notes
    locks = clean_clone / "bench" / "dvc.lock", clean_clone / "dvc.lock"
    assert stale_inputs(*locks) == []  # BENCHMARKS.md still read the committed lock's inputs
    _git(clean_clone, "add", "dvc.lock")  # staged: a relock the next commit makes
    assert any(s.startswith("artifacts/models/sft: bench read ") for s in stale_inputs(*locks))


def test_dvc_does_not_stage_the_lock(tmp_path):
    """`dvc repro` with this repository's DVC config writes dvc.lock and leaves it to the user to
    stage (no core.autostage): a rerun on another CPU model leaves git's index, which the docs and
    benchmark checks read, as committed."""
    if shutil.which("git") is None:
        pytest.skip("no git")
    dvc = str(Path(sys.executable).parent / "dvc")
    _git(tmp_path, "init", "-q")
    subprocess.run([dvc, "init", "-q"], cwd=tmp_path, check=True)
    shutil.copy(REPO / ".dvc" / "config", tmp_path / ".dvc" / "config")
    subprocess.run([dvc, "stage", "add", "-q", "-n", "s", "-o", "out.txt", "echo 1 > out.txt"],
                   cwd=tmp_path, check=True)
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-q", "-m", "a stage")
    subprocess.run([dvc, "repro", "-q"], cwd=tmp_path, check=True)
    assert (tmp_path / "dvc.lock").is_file()
    assert "?? dvc.lock" in _git(tmp_path, "status", "--porcelain").splitlines()


def test_a_committed_metrics_drift_in_a_clean_clone_still_fails(clean_clone):
    rewritten = _rewrite_as_another_cpu(clean_clone)
    _git(clean_clone, "add", "artifacts/metrics")  # staged: the next commit's figures
    assert gen.stale(clean_clone) == ["docs/generated/metrics.md"]
    _git(clean_clone, "commit", "-q", "-m", "the metrics, not the docs")
    assert gen.drifted(clean_clone) == []
    assert gen.stale(clean_clone) == ["docs/generated/metrics.md"]
    gold = rewritten["eval"]["eval.gold_gain"]
    assert any("eval:eval.gold_gain quoted as" in b and b.endswith(f"the metric is {gold}")
               for b in quote_mismatches(clean_clone))
    gen.write(clean_clone)  # regenerating fixes the page, not a figure typed in a doc by hand
    assert gen.stale(clean_clone) == []
    assert [b for b in quote_mismatches(clean_clone) if not b.startswith("docs/generated/")]


def test_a_wrong_quoted_figure_is_caught():
    metrics = {"eval": {"eval.gold_gain": 0.151, "eval.n_prompts": 211},
               "ppo": {"rollouts": 960}, "dedup": {"kept": 274}, "ingest": {"kept": 2400}}
    assert gen.figure_mismatches("gain `eval.gold_gain` +0.151, `eval:eval.n_prompts` 211", metrics) == []
    assert gen.figure_mismatches("`rollouts`: 960 and `ppo:rollouts` 960", metrics) == []
    assert gen.figure_mismatches("`eval.gold_gain` = 0.15", metrics) == []  # the digits written
    assert gen.figure_mismatches("`eval.gold_gain` 0.166", metrics) == [
        "eval:eval.gold_gain quoted as 0.166, the metric is 0.151"]
    assert gen.figure_mismatches("`rollouts` 1,920", metrics) == [
        "ppo:rollouts quoted as 1,920, the metric is 960"]
    # `kept` belongs to two stages: only the stage-qualified form is checked
    assert gen.figure_mismatches("`kept` 1", metrics) == []
    assert gen.figure_mismatches("`ingest:kept` 1", metrics) != []
    tiny = {"ppo": {"heldout.gold_gain": 0.000213}}
    assert gen.figure_mismatches("`ppo:heldout.gold_gain` 2.130e-04", tiny) == []
    assert gen.figure_mismatches("`ppo:heldout.gold_gain` 2.000e-04", tiny) != []


def test_config_reference_covers_every_params_key(repo):

    page = (repo / "docs/generated/config.md").read_text(encoding="utf-8")
    params = yaml.safe_load((repo / "params.yaml").read_text(encoding="utf-8"))
    for section, keys in params.items():
        assert f"## `{section}`" in page
        chunk = page.split(f"## `{section}`", 1)[1].split("\n## ", 1)[0]
        for key in keys or {}:
            assert f"| `{key}` |" in chunk, (section, key)


def test_config_reference_shows_each_declared_range(repo):
    """The range column is pipeline/ranges.py's table joined with the features' ConfigFields
    (`ranges.of`, what the params check reads): every key that has a range shows it."""
    from rlhf.pipeline import ranges
    from rlhf.pipeline.config import SECTIONS, config_class

    page = gen.config_page(repo)
    shown = 0
    for section in SECTIONS:
        chunk = page.split(f"## `{section}`", 1)[1].split("\n## ", 1)[0]
        rows = {line.split(" | ")[0][3:-1]: line.split(" | ")[4]
                for line in chunk.splitlines() if line.startswith("| `")}
        for key, spec in ranges.of(config_class(section)).items():
            if key in rows:
                for rng in spec if isinstance(spec, tuple) else (spec,):  # a table: its columns
                    assert str(rng) in rows[key], (section, key, rows[key])
                shown += 1
    assert shown > 100
    assert "| `temperature` | `float` | 0.8 | 0.8 | > 0.3 |" in page  # the loop's own (ppo)
    assert "| `prune_top_k` | `int` | 50 | 50 | >= 2 |" in page  # a feature's ConfigField


# the feature vocabulary: the tiers are seed 001 §4.1's Level 0/1/2; a switch is named by its
# feature in the registry, never by the older numberings ("rollout economy II", "level two")
OLD_VOCABULARY = re.compile(r"rollout economy I{1,3}\b|\blevels? (one|two|three)\b", re.IGNORECASE)


def old_vocabulary(root: Path) -> list[str]:
    """Lines of the params files and the hand-written docs that name a feature the old ways."""
    files = [root / "params.yaml", root / "profiles/realdata/params.yaml", root / "README.md",
             *sorted((root / "docs").glob("*.md"))]
    return [f"{p.relative_to(root)}:{i}: {line.strip()}" for p in files if p.is_file()
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
            if OLD_VOCABULARY.search(line)]


def test_params_and_docs_name_features_one_way(repo, tmp_path):
    assert old_vocabulary(repo) == []
    (tmp_path / "docs").mkdir()
    (tmp_path / "params.yaml").write_text("a: 1  # Level 2: the strong RM\n"
                                          "b: 2  # rollout economy II: the scheduler\n")
    (tmp_path / "docs" / "x.md").write_text("Seed 000 §3.1 levels two and three.\n")
    assert old_vocabulary(tmp_path) == ["params.yaml:2: b: 2  # rollout economy II: the scheduler",
                                        "docs/x.md:1: Seed 000 §3.1 levels two and three."]


def test_field_meanings_read_the_comments():
    from gen_reference import field_meanings
    from rlhf.pipeline.ppo.config import PPOConfig

    m = field_meanings(PPOConfig)
    assert m["batch_size"].startswith("prompts per step")
    assert "budget of generated tokens" in m["total_tokens"]  # the comment block above it


# --------------------------------------------------------------------------- outside references
OUTSIDE = re.compile(r"ARCHITECTURE\.md|ANCHORS\.md|\bissues? \d+\b|\(issue \d+|\bREADME\b(?!\.md)")


def outside_references(root: Path) -> list[str]:
    """Every line of the repository's code and configs that cites an issue number or a document
    outside the repository (docs/ and the READMEs describe the project's history elsewhere)."""
    hits = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.suffix not in {".py", ".yaml", ".yml", ".toml", ".cfg"} or not path.is_file() \
                or rel.startswith((".venv/", "artifacts/", "build/")) or "/." in "/" + rel:
            continue
        if rel == "tests/test_docs.py":
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                hits.append(f"{rel}:{i}: {line.strip()}")
    return hits


def test_outside_reference_is_found(tmp_path):
    (tmp_path / "a.py").write_text("x = 1  # see ARCHITECTURE.md\ny = 2  # seed 000 §3.2\n"
                                   "z = 3  # (issue 14)\n")
    assert outside_references(tmp_path) == ["a.py:1: x = 1  # see ARCHITECTURE.md",
                                            "a.py:3: z = 3  # (issue 14)"]


def test_no_code_cites_issues_or_outside_documents(repo):
    hits = outside_references(repo)
    assert hits == [], f"{len(hits)} lines:\n" + "\n".join(hits)


def test_the_dag_picture_is_dvcs_own_graph(tmp_path):
    """docs/generate.py's edges are the ones `dvc dag` derives from the same dvc.yaml."""
    import subprocess
    import sys

    shutil.copy(REPO / "dvc.yaml", tmp_path / "dvc.yaml")
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    dvc = str(Path(sys.executable).parent / "dvc")
    subprocess.run([dvc, "init", "--no-scm", "-q"], cwd=tmp_path, check=True)
    out = subprocess.run([dvc, "dag", "--md", "dvc.yaml"], cwd=tmp_path, check=True,
                         capture_output=True, text=True).stdout
    names = dict(re.findall(r'(node\d+)\["([\w-]+)"\]', out))
    theirs = sorted((names[a], names[b]) for a, b in re.findall(r"(node\d+)-->(node\d+)", out))
    assert theirs and theirs == sorted(gen.dag_edges(REPO)[1])


# --------------------------------------------------------------------------- quoted paths
ROOTS = ("pipeline", "cli", "store", "bench", "docs", "tests", "profiles", "configs", "artifacts")
# a path from one of the repository's folders: globs (`*`), brace lists (`{a,b}`) and `<name>`
# placeholders are patterns, `module.name` a name the module defines
QUOTED = re.compile(r"(?<![\w./-])((?:" + "|".join(ROOTS) + r")/(?:[\w.*/-]|\{[\w.,-]+\}|<\w+>)*)")
DOTTED = re.compile(r"(?<![\w.])rlhf\.((?:pipeline|cli|store)(?:\.\w+)+)")
# what a run writes, not a repository file: every artifacts/ folder but the metrics git holds
# (.gitignore says the same), `make bench-all`'s report, and the file a command's flag names
OUTPUT = re.compile(r"(profiles/[^/]+/)?artifacts/(?!metrics/)|bench/BENCHMARKS_ALL\.md$")
WRITES = re.compile(r"(--(?:json|out[\w-]*|report|metrics)[ =]|\s>\s*)$")


def _defines(module: Path, name: str) -> bool:
    return module.is_file() and re.search(rf"\b{name}\b", module.read_text(encoding="utf-8")) \
        is not None


def _path_exists(root: Path, quoted: str) -> bool:
    quoted = quoted.rstrip(".-")  # the sentence's full stop
    if OUTPUT.match(quoted):
        return True
    variants = [""]
    for part in re.split(r"(\{[^}]*\})", re.sub(r"<\w+>", "*", quoted)):
        options = part[1:-1].split(",") if part.startswith("{") else [part]
        variants = [v + o for v in variants for o in options]
    for path in variants:
        if "*" in path:
            if next(root.glob(path), None) is None:
                return False
        elif not (root / path).exists():
            named = re.fullmatch(r"(.+)\.(\w+)", path)
            if not ((root / f"{path}.py").is_file()
                    or named and _defines(root / f"{named[1]}.py", named[2])):
                return False
    return True


def _module_exists(root: Path, dotted: str) -> bool:
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        base = root.joinpath(*parts[:n])
        if base.is_dir() or base.with_suffix(".py").is_file():
            module = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
            return n == len(parts) or _defines(module, parts[n])
    return False


def _split_history(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """A markdown text's (line, text) with each table column headed `was` emptied, and the
    (line, cell) emptied: a move's old paths, which must be gone."""
    lines, history, was = [], [], None
    for i, line in enumerate(text.splitlines(), 1):
        cells = line.split("|")
        if not line.startswith("|"):
            was = None
        elif was is None:
            was = [n for n, c in enumerate(cells) if c.strip() == "was"]
        else:
            history += [(i, c) for n, c in enumerate(cells) if n in was]
            line = "|".join("" if n in was else c for n, c in enumerate(cells))
        lines.append((i, line))
    return lines, history


def _python_prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a Python file."""
    import ast
    import io
    import tokenize

    source = path.read_text(encoding="utf-8")
    out = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
           if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and ast.get_docstring(node, clean=False) is not None:
            first = node.body[0]
            lines = first.value.value.splitlines()
            out += [(first.lineno + i, line) for i, line in enumerate(lines)]
    return out


def stale_paths(root: Path) -> list[str]:
    """`file:line: path` for each repository path that README.md, docs/, params.yaml, a
    profile's params.yaml or a Python comment or docstring quotes and the repository lacks,
    and for each old path of a move (a `was` column) that is still there."""
    bad, texts = [], []
    for md in doc_files(root):
        lines, history = _split_history(md.read_text(encoding="utf-8"))
        texts.append((md, lines))
        bad += [f"{md.relative_to(root).as_posix()}:{i}: {q} (was, still there)"
                for i, cell in history for q in QUOTED.findall(cell) if (root / q).exists()]
    texts += [(p, enumerate(p.read_text(encoding="utf-8").splitlines(), 1))
              for p in [root / "params.yaml", *sorted(root.glob("profiles/*/params.yaml"))]]
    texts += [(p, _python_prose(p)) for top in ROOTS if top != "artifacts"
              for p in sorted((root / top).rglob("*.py"))]
    for path, lines in texts:
        for i, line in lines:
            line = line.replace("\\.", ".")  # a path inside a quoted regex
            where = f"{path.relative_to(root).as_posix()}:{i}:"
            bad += [f"{where} {q[1].rstrip('.-')}" for q in QUOTED.finditer(line)
                    if not WRITES.search(line[:q.start()]) and not _path_exists(root, q[1])]
            bad += [f"{where} rlhf.{d}" for d in DOTTED.findall(line)
                    if not _module_exists(root, d)]
    return sorted(bad)


def test_every_quoted_path_exists(repo):
    stale = stale_paths(repo)
    assert not stale, "quoted, not in the repository:\n" + "\n".join(stale)


def test_a_stale_quoted_path_is_caught(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "pipeline" / "decode").mkdir(parents=True)
    (tmp_path / "pipeline" / "decode" / "hf.py").write_text(
        '"""HF decode (was pipeline/generation.py)."""\n\n\ndef generate():  # see docs/gone.md\n'
        '    """Like rlhf.pipeline.decode.hf.generate, not rlhf.pipeline.generation."""\n')
    (tmp_path / "README.md").write_text(
        "`pipeline/decode/`, `pipeline/decode/*.py`, pipeline/decode/{hf,native}.py,\n"
        "pipeline/decode/hf.generate, pipeline/decode/hf.sample, artifacts/store/pool,\n"
        "`artifacts/metrics/eval.json`, `pipeline/decode/<name>.py`, bench/x.py.\n")
    (tmp_path / "docs" / "map.md").write_text(
        "| module | was |\n| --- | --- |\n| `pipeline/decode/hf.py` | `pipeline/generation.py` |\n"
        "| `pipeline/decode/hf.py` | `pipeline/decode/hf.py` |\n"
        "\nIt was `pipeline/generation.py`.\n")
    (tmp_path / "params.yaml").write_text("ppo:\n  engine: hf  # pipeline/engine.py\n")
    assert stale_paths(tmp_path) == [
        "README.md:1: pipeline/decode/{hf,native}.py",
        "README.md:2: pipeline/decode/hf.sample",
        "README.md:3: artifacts/metrics/eval.json",
        "README.md:3: bench/x.py",
        "docs/map.md:4: pipeline/decode/hf.py (was, still there)",
        "docs/map.md:6: pipeline/generation.py",
        "params.yaml:2: pipeline/engine.py",
        "pipeline/decode/hf.py:1: pipeline/generation.py",
        "pipeline/decode/hf.py:4: docs/gone.md",
        "pipeline/decode/hf.py:5: rlhf.pipeline.generation"]


# --------------------------------------------------------------------------- the module map
def module_map(root: Path) -> tuple[str, dict[str, str], list[tuple[str, str, str]]]:
    """docs/architecture-modules.md's first section, its picture's boxes {id: label} and its
    edges (from, arrow, to)."""
    text = (root / "docs/architecture-modules.md").read_text(encoding="utf-8")
    section = text.split("## The rooms and the flow", 1)[1].split("\n## ", 1)[0]
    chart = re.search(r"```mermaid\n(.*?)```", section, re.DOTALL)[1]
    boxes = dict(re.findall(r'^\s*(\w+)\["(.*)"\]\s*$', chart, re.MULTILINE))
    edges = re.findall(r"^\s*(\w+) (-->|-\.->)(?:\|[^|]*\|)? (\w+)\s*$", chart, re.MULTILINE)
    return section, boxes, edges


def map_errors(root: Path) -> list[str]:
    """What the module map's picture says that dvc.yaml and the folders do not."""

    section, boxes, edges = module_map(root)
    stages = yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    deps = {s: [next(iter(x)) if isinstance(x, dict) else x for x in d.get("deps") or []]
            for s, d in stages.items()}
    placed = [(s, box) for box, label in boxes.items()
              for names in re.findall(r"stages?: ([\w, ]+)", label) for s in names.split(", ")]
    box_of = dict(placed)
    bad = [f"stage {s} is in {n} boxes" for s in stages
           if (n := sum(x == s for x, _ in placed)) != 1]
    bad += [f"box {b} names stage {s}, which dvc.yaml lacks" for s, b in placed if s not in stages]
    for s, box in box_of.items():
        named = [q.rstrip("/") for q in QUOTED.findall(boxes[box])]
        if s in deps and not any(d == n or d.startswith(n + "/") for d in deps[s] for n in named):
            bad.append(f"stage {s} depends on nothing box {box} names")
    solid = [(a, b) for a, arrow, b in edges if arrow == "-->"]

    def reaches(a: str, b: str) -> bool:
        seen, todo = {a}, [a]
        while todo:
            here = todo.pop()
            for x, y in solid:
                if x == here and y not in seen:
                    seen.add(y)
                    todo.append(y)
        return b in seen

    bad += [f"dvc edge {up} -> {down}: no arrows from box {box_of[up]} to box {box_of[down]}"
            for up, down in gen.dag_edges(root)[1] if up in box_of and down in box_of
            and box_of[up] != box_of[down] and not reaches(box_of[up], box_of[down])]
    dotted = {b for a, arrow, b in edges if arrow == "-.->" and a == "decode"}
    users = {box_of.get(s) for s, d in deps.items() if "pipeline/decode" in d}
    if dotted != users:
        bad.append(f"decode's dotted arrows end at {sorted(dotted)}, its stages' boxes are "
                   f"{sorted(users)}")
    modules = [p for p in [*sorted(root.glob("pipeline/*")), *sorted(root.glob("cli/*.py"))]
               if p.name != "__init__.py" and (p.suffix == ".py" or (p / "__init__.py").is_file())]
    bad += [f"{rel} is not on the map" for p in modules
            if (rel := p.relative_to(root).as_posix() + ("/" if p.is_dir() else "")) not in section]
    return bad


def test_the_module_map_draws_the_pipeline(repo):
    assert map_errors(repo) == []


def test_a_wrong_module_map_is_caught(tmp_path):
    root = _copy_tree(tmp_path / "repo")
    for rel in ("pipeline", "cli"):
        shutil.copytree(REPO / rel, root / rel, ignore=shutil.ignore_patterns("__pycache__"))
    assert map_errors(root) == []
    (root / "pipeline" / "rooms.py").write_text('"""A new module."""\n')
    page = root / "docs/architecture-modules.md"
    page.write_text(page.read_text(encoding="utf-8")
                    .replace("stage: rollups", "stage: rollup")
                    .replace("  world -->|sources, tokenizer| funnel\n", "")
                    .replace("  decode -.-> eval\n", ""))
    assert map_errors(root) == [
        "stage rollups is in 0 boxes", "box store names stage rollup, which dvc.yaml lacks",
        "dvc edge world -> ingest: no arrows from box world to box funnel",
        ("decode's dotted arrows end at ['models', 'ppo'], its stages' boxes are "
         "['eval', 'models', 'ppo']"),
        "pipeline/rooms.py is not on the map"]
