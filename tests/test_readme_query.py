"""The query examples of docs/store.md run as shown (on the tiny store they build first)."""

from __future__ import annotations

import re
import shlex

from typer.testing import CliRunner

import synthetic_store
from rlhf.cli.app import app

MARKER = "<!-- query-examples:"


def _example_lines(readme: str) -> list[str]:
    block = readme[readme.index(MARKER):]
    block = re.search(r"```bash\n(.*?)```", block, re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def test_readme_query_examples_run_as_shown(repo, tmp_path):
    lines = _example_lines((repo / "docs" / "store.md").read_text(encoding="utf-8"))
    assert lines[0].startswith("python tests/synthetic_store.py /tmp/demo-store")
    synthetic_store.build(tmp_path / "demo-store")
    commands = [shlex.split(line, comments=True) for line in lines[1:]]
    assert len(commands) >= 10 and all(c[0] == "rlhf" for c in commands)
    runner = CliRunner()
    for argv in commands:
        # Only the examples' /tmp paths move into the test's own folder.
        argv = [re.sub(r"^/tmp/", f"{tmp_path}/", a) for a in argv[1:]]
        result = runner.invoke(app, argv, env={"COLUMNS": "200"})
        assert result.exit_code == 0, (argv, result.output)
        assert "Traceback" not in result.output
        if "--sql" not in argv:  # the audits' SQL itself calls error() on a prompt_key collision
            assert "error" not in result.output.lower()
        if argv[:2] == ["audit", "lineage"] and "--sql" not in argv:
            assert "a-2" in result.output  # b-4's lineage goes through a-2
    assert (tmp_path / "run-b.parquet").is_file()
