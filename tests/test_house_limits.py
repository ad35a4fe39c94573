"""The house limits of the design card's style, read with `ast`: no module over 500 lines outside
data tables, no function over 100 lines (its decorators included) outside bench scripts, in every
.py under pipeline/, cli/, store/ and docs/. `ALLOWED` names each exception with its reason; a
planted long module and function are caught, and every exception names a file that exists.

    .venv/bin/python -m pytest -q tests/test_house_limits.py
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODULE_LINES, FUNCTION_LINES = 500, 100
FOLDERS = ("pipeline", "cli", "store")  # all of their .py files, and docs/*.py

# path (or folder/*) -> why it may pass a limit
ALLOWED = {
    "pipeline/world/topics.py": "a data table: the embedded world's topics, their facts, keywords "
                                "and questions (one `_t(...)` row each)",
}


def sources(root: Path) -> list[Path]:
    return sorted([*(p for top in FOLDERS for p in (root / top).rglob("*.py")),
                   *(root / "docs").glob("*.py")])


def allowed(rel: str, allow: dict[str, str]) -> bool:
    return any(rel == k or (k.endswith("/*") and rel.startswith(k[:-1])) for k in allow)


def over_limits(root: Path, allow: dict[str, str] = ALLOWED) -> list[str]:
    """Each module over MODULE_LINES lines and each function over FUNCTION_LINES lines, outside
    `allow`."""
    bad = []
    for path in sources(root):
        rel = path.relative_to(root).as_posix()
        if allowed(rel, allow):
            continue
        text = path.read_text(encoding="utf-8")
        if (n := len(text.splitlines())) > MODULE_LINES:
            bad.append(f"{rel}: {n} lines (a module: at most {MODULE_LINES})")
        for node in ast.walk(ast.parse(text, rel)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                if (n := node.end_lineno - start + 1) > FUNCTION_LINES:
                    bad.append(f"{rel}:{node.lineno} {node.name}: {n} lines (a function: at most "
                               f"{FUNCTION_LINES})")
    return bad


def test_no_module_or_function_over_the_limits():
    bad = over_limits(REPO)
    assert bad == [], "split these by what they do (or, a data table, add it to ALLOWED):\n" + \
        "\n".join(bad)


def test_every_exception_names_a_file_and_a_reason():
    for key, why in ALLOWED.items():
        assert why.strip(), key
        found = list(REPO.glob(key)) if key.endswith("/*") else [REPO / key]
        assert any(p.is_file() for p in found), f"ALLOWED names {key}, which does not exist"


def test_a_long_module_and_a_long_function_are_caught(tmp_path):
    (tmp_path / "pipeline" / "room").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(FUNCTION_LINES))
    (tmp_path / "pipeline" / "room" / "long.py").write_text(
        "import functools\n\n\n@functools.cache\ndef grown():\n" + body)
    (tmp_path / "docs" / "big.py").write_text("y = 1\n" * (MODULE_LINES + 1))
    (tmp_path / "pipeline" / "table.py").write_text("z = 1\n" * (MODULE_LINES + 1))
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "script.py").write_text("def f():\n" + body)  # bench: not read
    assert over_limits(tmp_path, {"pipeline/table.py": "a data table"}) == [
        f"docs/big.py: {MODULE_LINES + 1} lines (a module: at most {MODULE_LINES})",
        (f"pipeline/room/long.py:5 grown: {FUNCTION_LINES + 2} lines (a function: at most "
         f"{FUNCTION_LINES})")]
