"""Derive each dvc.yaml stage's code deps from the static import graph, never keep them by hand.

    python docs/dvc_deps.py                      # rewrite the code deps of dvc.yaml's stages
    python docs/dvc_deps.py --check              # name the stages whose code deps are stale (exit 1)
    python docs/dvc_deps.py profiles/realdata/dvc.yaml

A stage's code is what its command runs: `rlhf <command>` -> the cli module that defines the
command (cli/app.py's `app.command(...)` / `app.add_typer(...)`) -> every `rlhf.pipeline`,
`rlhf.cli` and `rlhf.store` module it imports, at module level or inside a function, followed
transitively (an import of `rlhf.a.b` runs `a/__init__.py` too, and whatever that imports;
`if TYPE_CHECKING:` blocks never run and are skipped). A top-level function's imports count once
code that runs names it (so cli/common.py's judge loader does not pull the preferences package
into the world stage); class bodies, methods and decorated functions count with their module. The code part of a stage's `deps:` (the
entries under pipeline/, cli/, store/) becomes the smallest sorted list covering those files: a
folder where every .py file under it is needed, else the files. Data deps (artifacts/...,
../shared/...) and their comments stay exactly as written; a comment on a code dep stays while
that dep does. This script lives outside the code folders so that it is no stage's dep itself.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("pipeline", "cli", "store")
# What a module reads beside its code (SQL files loaded by path): needed with the module.
DATA_BESIDE = {"store/rollup.py": ("store/rollups",), "store/query.py": ("store/audits",)}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def module_file(root: Path, dotted: str) -> Path | None:
    """The file `rlhf.<dotted>` runs: `x/y.py` or the package's `x/y/__init__.py`."""
    parts = dotted.split(".")
    if not parts or parts[0] not in ROOTS:
        return None
    base = root.joinpath(*parts)
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def _dotted(root: Path, path: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


IDENT = re.compile(r"[A-Za-z_]\w*")


def units(root: Path, path: Path) -> list[tuple[str | None, set[str], set[str]]]:
    """One file as (function name, in-repo modules imported, names referenced) units: the module's
    own code (class bodies and methods whole: a library may call a method by protocol), then each
    top-level function (nested defs included) unless decorated, which is module code too (a
    decorator may register it). Modules are dotted without `rlhf.`; names come from identifiers,
    attributes, imported names and the words of non-docstring strings (`getattr`, "mod:Class")."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    me = _dotted(root, path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]

    def scan(nodes: list[ast.AST], imports: set[str], refs: set[str]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                scan(node.orelse, imports, refs)  # TYPE_CHECKING imports never run
                continue
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue  # a docstring
            if isinstance(node, ast.Name):
                refs.add(node.id)
            elif isinstance(node, ast.Attribute):
                refs.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                refs.update(IDENT.findall(node.value))
            elif isinstance(node, ast.Import):
                imports.update(a.name[len("rlhf."):] for a in node.names
                               if a.name.startswith("rlhf."))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                elif node.module and node.module.startswith("rlhf."):
                    target = node.module[len("rlhf."):]
                else:
                    target = "" if node.module == "rlhf" else None
                if target is not None:
                    imports.update([target] if target else [])
                    # `from rlhf.pipeline import progress`: a submodule, or a name in the package
                    imports.update(f"{target}.{a.name}" if target else a.name for a in node.names)
                refs.update(a.name for a in node.names)
            scan(list(ast.iter_child_nodes(node)), imports, refs)

    module: tuple[None, set[str], set[str]] = (None, set(), set())
    out: list[tuple[str | None, set[str], set[str]]] = [module]
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.decorator_list:
            unit = (node.name, set(), set())
            scan(node.body, unit[1], unit[2])
            # defaults are evaluated when the module runs
            scan([d for d in node.args.defaults + node.args.kw_defaults if d], module[1], module[2])
            out.append(unit)
        else:
            scan([node], module[1], module[2])
    return out


def _files_of(root: Path, dotted: str) -> list[Path]:
    """The files importing `rlhf.<dotted>` runs: every package's __init__.py on the way, itself."""
    parts = dotted.split(".")
    return [f for i in range(1, len(parts) + 1)
            if (f := module_file(root, ".".join(parts[:i]))) is not None]


def closure(root: Path, start: list[Path], entry: set[str] | None = None,
            others: frozenset[str] = frozenset()) -> set[Path]:
    """Every repository file that running `start` can execute (parents' __init__.py included).
    A top-level function's imports count once its name is referenced by code that runs, or is in
    `entry` (the command's function); `entry` None: every function of `start` runs. `others`:
    the other commands' functions of `start`, which Typer calls only for their own command (their
    names are also section and table names, so a reference by name proves nothing)."""
    files: set[Path] = set()
    names: set[str] = set(entry or ())
    parsed: dict[Path, list] = {}
    done: set[tuple[Path, str | None]] = set()
    todo = [f for p in start for f in [p, *_files_of(root, _dotted(root, p))]]
    changed = True
    while changed:
        changed = False
        while todo:
            path = todo.pop()
            if path not in files:
                files.add(path)
                parsed[path] = units(root, path)
                changed = True
        for path in list(files):
            for name, imports, refs in parsed[path]:
                runs = (name is None or (entry is None and path in start)
                        or (name in names and not (path in start and name in others)))
                if not runs or (path, name) in done:
                    continue
                done.add((path, name))
                changed = True
                names |= refs
                todo += [f for d in imports for f in _files_of(root, d) if f not in files]
    return files


def command_modules(root: Path) -> dict[str, tuple[Path, set[str]]]:
    """{`rlhf` command: (the cli module defining it, its function's name)}, read from cli/app.py's
    registrations (a sub-app's commands are decorated: they run as module code)."""
    app = root / "cli" / "app.py"
    tree = ast.parse(app.read_text(encoding="utf-8"))
    bound: dict[str, str] = {}  # local name -> dotted module (without rlhf.)
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rlhf."):
            mod = node.module[len("rlhf."):]
            for alias in node.names:
                sub = f"{mod}.{alias.name}"
                bound[alias.asname or alias.name] = sub if module_file(root, sub) else mod
    commands: dict[str, tuple[Path, set[str]]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if (isinstance(func, ast.Call) and isinstance(func.func, ast.Attribute)
                and func.func.attr == "command" and isinstance(func.func.value, ast.Name)
                and func.func.value.id == "app" and func.args and node.args):
            name, target = func.args[0].value, node.args[0]
            if not isinstance(target, ast.Attribute) or not isinstance(target.value, ast.Name):
                continue
            owner, entry = target.value.id, {target.attr}
        elif (isinstance(func, ast.Attribute) and func.attr == "add_typer"
              and isinstance(func.value, ast.Name) and func.value.id == "app"):
            kw = {k.arg: k.value for k in node.keywords}
            if "name" not in kw or not isinstance(node.args[0], ast.Name):
                continue
            name, owner, entry = kw["name"].value, node.args[0].id, set()
        else:
            continue
        if owner in bound and (file := module_file(root, bound[owner])) is not None:
            commands[name] = (file, entry)
    return commands


def covering(root: Path, files: set[Path]) -> list[str]:
    """The smallest sorted list of folders and files covering `files` (a folder only where every
    .py file under it is in `files`), plus the data each needed module reads beside it."""
    out: list[str] = []

    def cover(folder: Path) -> None:
        for child in sorted(folder.iterdir()):
            if child.name == "__pycache__":
                continue
            if child.is_dir():
                pys = [p for p in child.rglob("*.py") if "__pycache__" not in p.parts]
                if pys and all(p in files for p in pys):
                    out.append(child.relative_to(root).as_posix())
                elif any(p in files for p in pys):
                    cover(child)
            elif child in files:
                out.append(child.relative_to(root).as_posix())

    for top in ROOTS:
        cover(root / top)
    rels = {p.relative_to(root).as_posix() for p in files}
    for module, data in DATA_BESIDE.items():
        if module in rels:
            out += [d for d in data if not any(d == o or d.startswith(o + "/") for o in out)]
    return sorted(out)


def derived(root: Path, cmd: str, commands: dict[str, tuple[Path, set[str]]]) -> list[str] | None:
    """A stage's derived code deps, from its `rlhf <command>` (None: not an rlhf command)."""
    words = cmd.split()
    if len(words) < 2 or words[0] != "rlhf" or words[1] not in commands:
        return None
    file, entry = commands[words[1]]
    others = frozenset(n for f, e in commands.values() if f == file for n in e) - entry
    return covering(root, closure(root, [file], entry, others))


def is_code(entry: str, prefix: str = "") -> bool:
    """Whether a deps entry is repository code (`prefix`: the way up from the dvc.yaml's folder)."""
    return entry.startswith(prefix) and entry[len(prefix):].split("/", 1)[0] in ROOTS


ENTRY = re.compile(r"^(\s*)- ([^\s#]+)(\s*#.*)?$")


def _deps_blocks(lines: list[str]) -> dict[str, tuple[int, int]]:
    """{stage: (first, end)} line spans of each stage's deps list in a dvc.yaml's text."""
    blocks, stage, i = {}, None, 0
    while i < len(lines):
        line = lines[i]
        if m := re.match(r"^  ([\w.-]+):\s*$", line):
            stage = m.group(1)
        elif stage and re.match(r"^    deps:\s*$", line):
            j = i + 1
            while j < len(lines) and (lines[j].startswith("      ") or not lines[j].strip()):
                j += 1
            while j > i + 1 and not lines[j - 1].strip():
                j -= 1
            blocks[stage] = (i + 1, j)
            i = j
            continue
        i += 1
    return blocks


def rewrite_block(block: list[str], code: list[str], prefix: str = "") -> list[str]:
    """The deps lines with the code entries replaced by `code`: data entries and their comments
    untouched, a kept code entry keeps its inline and preceding comments."""
    indent = "      "
    groups: list[tuple[list[str], str | None, str]] = []  # (comments before, path, line)
    pending: list[str] = []
    for line in block:
        m = ENTRY.match(line)
        if m:
            indent = m.group(1)
            groups.append((pending, m.group(2), line))
            pending = []
        else:
            pending.append(line)
    out: list[str] = []
    listed = {path: (pre, line) for pre, path, line in groups if is_code(path, prefix)}
    placed = False
    for pre, path, line in groups:
        if not is_code(path, prefix):
            out += pre + [line]
        elif not placed:
            placed = True
            for entry in code:
                pre_c, line_c = listed.get(entry, ([], f"{indent}- {entry}"))
                out += pre_c + [line_c]
    if not placed:
        out += [f"{indent}- {entry}" for entry in code]
    return out + pending


def process(dvc_yaml: Path, root: Path, write: bool) -> list[str]:
    """The stages whose listed code deps differ from the derived ones (rewritten when `write`)."""
    text = dvc_yaml.read_text(encoding="utf-8")
    up = os.path.relpath(root, dvc_yaml.resolve().parent)
    prefix = "" if up == "." else up + "/"
    stages = (yaml.safe_load(text) or {}).get("stages", {})
    commands = command_modules(root)
    lines = text.splitlines()
    blocks = _deps_blocks(lines)
    stale: list[str] = []
    for stage in reversed(list(blocks)):
        cmd = " ".join(str(stages.get(stage, {}).get("cmd", "")).split())
        code = derived(root, cmd, commands)
        if code is None:
            continue
        code = [prefix + entry for entry in code]
        first, end = blocks[stage]
        listed = [m.group(2) for line in lines[first:end]
                  if (m := ENTRY.match(line)) and is_code(m.group(2), prefix)]
        if listed != code:
            stale.append(stage)
            lines[first:end] = rewrite_block(lines[first:end], code, prefix)
    if write and stale:
        dvc_yaml.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return sorted(stale)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, help="dvc.yaml files (default: dvc.yaml)")
    parser.add_argument("--check", action="store_true", help="list stale stages, write nothing")
    parser.add_argument("--root", type=Path, default=REPO, help="the repository root")
    args = parser.parse_args(argv)
    bad = 0
    for file in args.files or [args.root / "dvc.yaml"]:
        if not file.is_file():
            print(f"error: {file}: no such file", file=sys.stderr)
            return 2
        try:
            stale = process(file, args.root.resolve(), write=not args.check)
        except (yaml.YAMLError, SyntaxError, OSError) as exc:
            print(f"error: {file}: {str(exc).splitlines()[0]}", file=sys.stderr)
            return 2
        verb = "stale code deps" if args.check else "rewrote code deps"
        if stale:
            print(f"{file}: {verb}: {', '.join(stale)}")
            bad = 1
    return bad if args.check else 0


if __name__ == "__main__":
    sys.exit(main())
