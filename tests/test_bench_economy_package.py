"""The benchmark package's shape (bench/economy/), read from its files with `ast`: its modules
import one another without a cycle, neither it nor the tests that import it touch `sys.path`
(it imports as `bench.economy` from the repository root: `python -m bench.economy`, pytest's
`pythonpath`), no module is over 500 lines and no function over 100.

    .venv/bin/python -m pytest -q tests/test_bench_economy_package.py
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from test_decode_package import cycle, module_name

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "bench" / "economy"
MAX_LINES, MAX_FUNCTION = 500, 100


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.glob("*.py"))}


def users() -> list[Path]:
    """The package's modules and every test that imports it."""
    tests = [p for p in sorted((REPO / "tests").glob("test_*.py"))
             if "bench.economy" in p.read_text() and p.name != Path(__file__).name]
    return [*package_modules().values(), *tests]


def path_edits(path: Path) -> list[str]:
    """Each `sys.path` the file names (an insert, an append, an assignment)."""
    return [f"{path.name}:{n.lineno}"
            for n in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(n, ast.Attribute) and n.attr == "path"
            and isinstance(n.value, ast.Name) and n.value.id == "sys"]


def oversized(path: Path) -> list[str]:
    """The file itself when over MAX_LINES, and each function over MAX_FUNCTION lines."""
    text = path.read_text()
    out = [f"{path.name}: {len(text.splitlines())} lines"] if len(
        text.splitlines()) > MAX_LINES else []
    for n in ast.walk(ast.parse(text, str(path))):
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
            length = n.end_lineno - n.lineno + 1
            if length > MAX_FUNCTION:
                out.append(f"{path.name}:{n.lineno} {n.name}: {length} lines")
    return out


def test_the_package_is_found():
    modules = package_modules()
    assert {"bench.economy", "bench.economy.__main__", "bench.economy.arms",
            "bench.economy.dvc_stages", "bench.economy.report"} <= set(modules)
    assert not list((REPO / "bench").glob("economy*.py")), "a module left beside the package"


def test_the_package_has_no_import_cycle():
    found = cycle(package_modules())
    assert found is None, "an import cycle in bench/economy: " + " -> ".join(found)


def test_neither_the_package_nor_its_tests_edit_sys_path():
    found = [hit for path in users() for hit in path_edits(path)]
    assert not found, "sys.path edited at " + ", ".join(found)


def test_no_module_or_function_is_too_long():
    found = [hit for path in package_modules().values() for hit in oversized(path)]
    assert not found, "\n".join(found)


def test_the_package_runs_as_a_module_from_the_repository_root():
    """`python -m bench.economy.dvc_stages --check`: bench/dvc.yaml is what the arms make."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "bench.economy.dvc_stages", "--check"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("case", ["cycle", "relative_cycle", "sys_path", "long_function"])
def test_the_checks_fail_on_what_they_forbid(tmp_path, case):
    """Each check, given one file that breaks its rule (under tmp_path), reports it."""
    if case in ("cycle", "relative_cycle"):  # stats.py, which report.py imports, imports it
        line = ("from bench.economy.report import write_report" if case == "cycle"
                else "from .report import write_report")
        (tmp_path / "stats.py").write_text((PACKAGE / "stats.py").read_text()
                                           + f"\n\ndef f():\n    {line}\n")
        modules = {**package_modules(), "bench.economy.stats": tmp_path / "stats.py"}
        assert cycle(modules) is not None
    elif case == "sys_path":
        bad = tmp_path / "bad.py"
        bad.write_text("import sys\n\nsys.path.insert(0, 'bench')\n")
        assert path_edits(bad) == ["bad.py:3"]
    else:
        bad = tmp_path / "long.py"
        bad.write_text("def f():\n" + "    x = 1\n" * MAX_FUNCTION)
        assert oversized(bad) == [f"long.py:1 f: {MAX_FUNCTION + 1} lines"]
