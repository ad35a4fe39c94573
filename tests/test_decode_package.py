"""The rooms' boundaries, read from the imports with `ast`. The decode package (pipeline/decode/):
no module of the package imports the trainer (`rlhf.pipeline.ppo`) or a stage module (a dvc.yaml
stage's own module); the package's modules import one another without a cycle; and no module
outside it imports a module of the package, or a name its `__init__` does not list: everything else
goes through `rlhf.pipeline.decode`'s public names. The trainer (pipeline/ppo/): no module of
pipeline/, cli/ or store/ imports it but its own and its command, cli/ppo.py (what a stage and the
trainer share lives in the shared rooms: pipeline/models/, pipeline/decode/, pipeline/samplers.py).

Every import counts, a function's own too (an import inside a function closes a circle as well
as one at the top). A test may still name a module of the package as the target of a
`monkeypatch.setattr("rlhf.pipeline.decode.<module>.<name>", ...)`, the place a fault is
injected, which is not an import.

    .venv/bin/python -m pytest -q tests/test_decode_package.py
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "rlhf.pipeline.decode"
DECODE = REPO / "pipeline" / "decode"
OUTSIDE = ("pipeline", "cli", "store", "bench", "tests", "docs")
TRAINER = "rlhf.pipeline.ppo"
# what may import the trainer besides its own modules: its command (bench/ and tests/ drive it,
# docs/gen_reference.py documents its features' fields; none of them is a room of `rlhf`)
TRAINER_USERS = ("rlhf.cli.ppo",)


def module_name(path: Path) -> str:
    """The import name of a repository file (`rlhf.` + its path for the installed folders)."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["rlhf", *parts] if parts[0] in ("pipeline", "cli", "store") else parts)


def imports(path: Path, own: str) -> list[tuple[str, list[str], int]]:
    """Every import of module `own` (the file `path`), anywhere in it: (module, the names
    imported from it, line), a relative import resolved against the module's own package."""
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            out.append((base, [a.name for a in node.names], node.lineno))
    return out


def within(name: str, module: str) -> bool:
    return name == module or name.startswith(module + ".")


def stage_modules() -> set[str]:
    """Each dvc.yaml stage's own module, as import names: the `pipeline/` module or package that
    its dependencies name as the stage (`ppo`: pipeline/ppo; `reward`: pipeline/reward, from
    pipeline/reward/stage.py; `eval`: pipeline/eval.py)."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    out = set()
    for name, stage in stages.items():
        own = None
        for dep in stage.get("deps", []):
            parts = Path(dep.removesuffix(".py")).parts
            if own is None and parts[0] == "pipeline" and name in parts:
                own = "/".join(parts[: parts.index(name) + 1])
        if own is not None:
            out.add("rlhf." + own.removesuffix(".py").replace("/", "."))
    return out


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(DECODE.glob("*.py"))}


def outside_modules() -> dict[str, Path]:
    return {module_name(p): p for top in OUTSIDE for p in sorted((REPO / top).rglob("*.py"))
            if DECODE not in p.parents}


def beside_the_trainer() -> dict[str, Path]:
    """The modules of `rlhf` (pipeline/, cli/, store/) outside the trainer's room and its users."""
    modules = {module_name(p): p for top in ("pipeline", "cli", "store")
               for p in sorted((REPO / top).rglob("*.py"))}
    return {n: p for n, p in modules.items() if not within(n, TRAINER) and n not in TRAINER_USERS}


def public_names() -> set[str]:
    """The names `__init__.py`'s `__all__` lists (read from the source, not by importing)."""
    for node in ast.parse((DECODE / "__init__.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__"
                                                for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError("pipeline/decode/__init__.py lists no __all__")


def boundary_violations(modules: dict[str, Path], forbidden: set[str]) -> list[str]:
    """Imports of `modules` that reach a module in (or under) `forbidden`."""
    return [f"{name}:{line} imports {m}" for name, path in modules.items()
            for module, names, line in imports(path, name)
            for m in [module, *(f"{module}.{n}" for n in names)]
            if any(within(m, f) for f in forbidden)]


def cycle(modules: dict[str, Path]) -> list[str] | None:
    """A cycle among `modules` through their imports of one another, or None."""
    edges = {}
    for name, path in modules.items():
        targets = set()
        for module, names, _ in imports(path, name):
            targets |= {module, *(f"{module}.{n}" for n in names)}
        edges[name] = sorted(t for t in targets if t in modules and t != name)
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node, trail):
        state[node] = 1
        for nxt in edges[node]:
            if state.get(nxt) == 1:
                return [*trail[trail.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt, [*trail, nxt])):
                return found
        state[node] = 2
        return None

    for start in edges:
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def outside_violations(modules: dict[str, Path], public: set[str]) -> list[str]:
    """Imports of `modules` (outside the package) of a module of the package, or of a name
    its `__all__` does not list."""
    bad = []
    for name, path in modules.items():
        for module, names, line in imports(path, name):
            if within(module, PACKAGE) and module != PACKAGE:
                bad.append(f"{name}:{line} imports the package's own module {module}")
            elif module == PACKAGE:
                bad += [f"{name}:{line} imports {n}, which {PACKAGE} does not list"
                        for n in names if n not in public]
    return bad


def test_the_stage_modules_are_found():
    stages = stage_modules()
    assert {"rlhf.pipeline.ppo", "rlhf.pipeline.eval", "rlhf.pipeline.reward",
            "rlhf.pipeline.preferences", "rlhf.pipeline.difficulty"} <= stages
    assert not any(within(PACKAGE, s) for s in stages)


def test_decode_imports_neither_the_trainer_nor_a_stage():
    bad = boundary_violations(package_modules(), {"rlhf.pipeline.ppo", *stage_modules()})
    assert not bad, "pipeline/decode reaches outside its room:\n" + "\n".join(bad)


def test_decode_has_no_import_cycle():
    found = cycle(package_modules())
    assert found is None, "an import cycle in pipeline/decode: " + " -> ".join(found)


def test_outside_imports_only_the_public_names():
    modules = outside_modules()
    assert "rlhf.pipeline.ppo.generate" in modules and "tests.test_engine" in modules
    bad = outside_violations(modules, public_names())
    assert not bad, "\n".join(bad)


def test_nothing_beside_the_trainer_imports_it():
    modules = beside_the_trainer()
    assert {"rlhf.pipeline.eval", "rlhf.pipeline.difficulty", "rlhf.cli.eval"} <= set(modules)
    assert not any(within(n, TRAINER) for n in modules) and "rlhf.cli.ppo" not in modules
    bad = boundary_violations(modules, {TRAINER})
    assert not bad, "reaches into the trainer (move what they share to a shared room):\n" + \
        "\n".join(bad)


def test_the_public_names_are_the_packages():
    from rlhf.pipeline import decode

    assert set(decode.__all__) == public_names()
    assert all(hasattr(decode, n) for n in decode.__all__)


BAD = {  # one module that breaks a rule, and the check that must report it
    "trainer": "def f():\n    from rlhf.pipeline.ppo.rollout import Rollout\n",
    "stage": "from rlhf.pipeline import eval\n",
    "private": "from rlhf.pipeline.decode.native import prefill\n",
    "private_dotted": "import rlhf.pipeline.decode.sampling\n",
    "unlisted": "from rlhf.pipeline.decode import EDGE_MARGIN\n",
    "stage_to_trainer": "def f():\n    from rlhf.pipeline.ppo import core\n",
    "stage_to_trainer_package": "from rlhf.pipeline import ppo\n",
    "stage_to_trainer_relative": "def f():\n    from .ppo.samplers import load_prompts\n",
}


@pytest.mark.parametrize("case", [*BAD, "cycle", "relative_cycle"])
def test_the_checks_fail_on_the_imports_they_forbid(tmp_path, case):
    """Each check, given the real modules plus one that breaks its rule (its file under
    tmp_path), reports it: the checks can fail."""
    decode = dict(package_modules())
    if case in ("trainer", "stage"):
        (tmp_path / "bad.py").write_text(BAD[case])
        decode["rlhf.pipeline.decode.bad"] = tmp_path / "bad.py"
        assert boundary_violations(decode, {"rlhf.pipeline.ppo", *stage_modules()})
    elif case.startswith("stage_to_trainer"):  # pipeline/eval.py, reaching into the trainer
        (tmp_path / "eval.py").write_text((REPO / "pipeline" / "eval.py").read_text()
                                          + "\n\n" + BAD[case])
        modules = {**beside_the_trainer(), "rlhf.pipeline.eval": tmp_path / "eval.py"}
        assert boundary_violations(modules, {TRAINER})
    elif case in ("private", "private_dotted", "unlisted"):
        (tmp_path / "mod.py").write_text(BAD[case])
        assert outside_violations({"bench.mod": tmp_path / "mod.py"}, public_names())
    else:  # sampling.py, which the engines import, now imports one of them
        line = ("from rlhf.pipeline.decode.native import prefill" if case == "cycle"
                else "from .native import prefill")
        (tmp_path / "sampling.py").write_text((DECODE / "sampling.py").read_text()
                                              + f"\n\ndef f():\n    {line}\n")
        decode["rlhf.pipeline.decode.sampling"] = tmp_path / "sampling.py"
        assert cycle(decode) is not None
