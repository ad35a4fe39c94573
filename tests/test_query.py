"""`rlhf query` and `rlhf tables`: output formats, clear errors, and a test per attack."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import synthetic_store
from rlhf.cli.app import app
from rlhf.store.catalog import connect
from rlhf.store.query import QueryRefused, check_sql
from rlhf.store.rollup import list_rollups
from rlhf.store.schemas import TABLES

runner = CliRunner()
WIDE = {"COLUMNS": "250"}


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return synthetic_store.build(tmp_path_factory.mktemp("q") / "store")


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def rlhf(*args: str):
    return runner.invoke(app, list(args), env=WIDE)


def _ok(result):
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    return result.output


# Formats ----------------------------------------------------------------------------------

def test_default_rich_table(store):
    out = _ok(rlhf("query", "SELECT source_type, count(*) AS n FROM prompts GROUP BY ALL "
                   "ORDER BY source_type", "--store", str(store)))
    lines = [line for line in out.splitlines() if "│" in line]
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in lines]
    assert cells == [["human", "3"], ["open_dataset", "1"], ["user_query", "2"]]
    assert "3 row(s)" in out


def test_csv_to_stdout_and_file(store, tmp_path):
    sql = "SELECT prompt_id, reasons FROM rejected ORDER BY source_line, source_file"
    out = _ok(rlhf("query", sql, "--store", str(store), "--format", "csv"))
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["prompt_id"] for r in rows] == ["x3", "", "x1", "x2"]
    assert json.loads(rows[3]["reasons"]) == ["email", "phone"]  # lists become JSON text
    target = tmp_path / "sub" / "rejected.csv"
    _ok(rlhf("query", sql, "--store", str(store), "-f", "csv", "--out", str(target)))
    with target.open() as fh:
        assert list(csv.DictReader(fh)) == rows


def test_jsonl_keeps_types(store):
    out = _ok(rlhf("query", "SELECT run_id, step, reward, flags, created_at FROM rollouts "
                   "WHERE run_id = 'b' ORDER BY step, prompt_id", "--store", str(store),
                   "--format", "jsonl"))
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["step"], r["reward"]) for r in rows] == [(3, 2.0), (3, 1.0), (4, 4.0)]
    assert rows[0]["flags"] == [] and rows[0]["created_at"].startswith("2026-01-01T09:03:00")


def test_parquet_needs_out_and_round_trips(store, tmp_path):
    result = rlhf("query", "FROM pool", "--store", str(store), "--format", "parquet")
    assert result.exit_code == 2 and "--out" in result.output
    result = rlhf("query", "FROM pool", "--store", str(store), "--out", str(tmp_path / "t.txt"))
    assert result.exit_code == 2 and "--out needs --format" in result.output
    assert not (tmp_path / "t.txt").exists()
    target = tmp_path / "pool.parquet"
    _ok(rlhf("query", "FROM pool ORDER BY prompt_id", "--store", str(store), "-f", "parquet",
             "-o", str(target)))
    table = pq.read_table(target)
    assert table.column("prompt_id").to_pylist() == ["p1", "p2", "p4", "p6"]
    assert table.schema.field("topic_cluster").type == TABLES["pool"].field("topic_cluster").type


def test_limit_and_display_cap(store):
    out = _ok(rlhf("query", "SELECT range AS i FROM range(1000)", "--store", str(store)))
    assert "100 row(s) shown; more not shown" in out
    out = _ok(rlhf("query", "SELECT range AS i FROM range(1000)", "--store", str(store),
                   "-f", "jsonl", "--limit", "7"))
    assert [json.loads(x)["i"] for x in out.splitlines()] == list(range(7))
    out = _ok(rlhf("query", "SELECT range AS i FROM range(1000)", "--store", str(store),
                   "-f", "jsonl"))
    assert len(out.splitlines()) == 1000  # files and pipes are not capped


def test_explain_shows_pruning(store):
    out = _ok(rlhf("query", "SELECT count(*) FROM rollouts WHERE run_id = 'a'", "--store",
                   str(store), "--explain"))
    assert "READ_PARQUET" in out
    out = _ok(rlhf("query", "EXPLAIN ANALYZE SELECT count(*) FROM rollouts WHERE run_id = 'a' "
                   "AND step >= 3", "--store", str(store), "-f", "csv"))
    # The hive folders prune run b's files; the step sort prunes row groups (store/rollouts.py).
    assert "Scanning Files: 3/5" in out
    assert "Row Groups Scanned: 2 / 4" in out


def test_describe_show_summarize_with_values_are_allowed(store):
    for sql in ["DESCRIBE rollouts", "SHOW rollouts", "SHOW TABLES", "SUMMARIZE pool",
                "WITH x AS (SELECT 1 AS a) SELECT * FROM x", "VALUES (1), (2)", "FROM pool",
                "/* a comment */ SELECT 42;"]:
        _ok(rlhf("query", sql, "--store", str(store), "-f", "jsonl"))
    out = _ok(rlhf("query", "DESCRIBE rollouts", "--store", str(store), "-f", "jsonl"))
    assert [json.loads(x)["column_name"] for x in out.splitlines()] == TABLES["rollouts"].names


def test_tables_lists_every_view_with_columns_and_counts(store):
    out = _ok(rlhf("tables", "--store", str(store)))
    for name, schema in TABLES.items():
        assert name in out
        for field in schema:
            assert field.name in out
    rows = {c[0]: c[1] for c in ([x.strip() for x in line.split("│")[1:3]]
                                 for line in out.splitlines() if line.startswith("│"))
            if c[0]}
    assert rows["prompts"] == "6" and rows["rollouts"] == "9" and rows["train_metrics"] == "0"


def test_empty_views_are_typed(tmp_path):
    (tmp_path / "store").mkdir()
    con = connect(tmp_path / "store", locked=True)
    described = {r[0]: r[1] for r in con.execute("DESCRIBE rollouts").fetchall()}
    assert described["flags"] == "VARCHAR[]" and described["tier"] == "TINYINT"
    assert described["created_at"] == "TIMESTAMP WITH TIME ZONE"
    assert con.execute("SELECT count(*) FROM rm_scores").fetchone() == (0,)
    views = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    rollups = {r.name for r in list_rollups()}  # and a view per rollup (store/rollup.py)
    assert views == set(TABLES) | rollups  # no helper objects left behind
    assert all(con.execute(f"SELECT count(*) FROM {r}").fetchone() == (0,) for r in rollups)


# Errors -----------------------------------------------------------------------------------

@pytest.mark.parametrize("sql, needle", [
    ("SELEC 1", "not valid SQL"),
    ("SELECT * FROM no_such_table", "no_such_table"),
    ("SELECT nonexistent_column FROM prompts", "nonexistent_column"),
    ("SELECT 1/0::INTEGER + 'x'", "query failed"),
    ("   ", "empty query"),
])
def test_bad_query_is_a_clear_error(store, sql, needle):
    result = rlhf("query", sql, "--store", str(store))
    assert result.exit_code == 2
    assert "error:" in result.output and needle in result.output
    assert "Traceback" not in result.output


def test_missing_store_is_a_clear_error(tmp_path):
    result = rlhf("query", "SELECT 1", "--store", str(tmp_path / "nope"))
    assert result.exit_code == 2 and "store folder not found" in result.output
    result = rlhf("tables", "--store", str(tmp_path / "nope"))
    assert result.exit_code == 2 and "store folder not found" in result.output


# Attacks: each refused with a clear message, exit code 2, nothing written -----------------

def _attacks(store: Path, outside: Path) -> list[tuple[str, str]]:
    leak = outside / "leak.csv"
    return [
        ("copy_to", f"COPY (SELECT * FROM prompts) TO '{leak}'"),
        ("copy_into_store", f"COPY (SELECT * FROM prompts) TO '{store}/prompts/evil.parquet'"),
        ("attach", f"ATTACH '{outside}/x.duckdb' AS x"),
        ("install", "INSTALL httpfs"),
        ("load", "LOAD httpfs"),
        ("read_csv_etc_passwd", "SELECT * FROM read_csv('/etc/passwd')"),
        ("read_text_escape", f"SELECT * FROM read_text('{store}/../../../etc/passwd')"),
        ("url", "SELECT * FROM read_parquet('https://example.com/x.parquet')"),
        ("create", "CREATE TABLE t AS SELECT * FROM prompts"),
        ("create_or_replace_view", "CREATE OR REPLACE VIEW prompts AS SELECT 1 AS x"),
        ("insert", "INSERT INTO prompts SELECT * FROM prompts"),
        ("delete", "DELETE FROM prompts"),
        ("update", "UPDATE prompts SET text = 'x'"),
        ("drop", "DROP VIEW prompts"),
        ("set", "SET enable_external_access = true"),
        ("reset", "RESET lock_configuration"),
        ("pragma", "PRAGMA enable_profiling"),
        ("call", "CALL pragma_version()"),
        ("second_statement", f"SELECT 1; COPY (SELECT 1) TO '{leak}'"),
        ("second_select", "SELECT 1; SELECT 2"),
        ("explain_analyze_copy", f"EXPLAIN ANALYZE COPY (SELECT 1) TO '{leak}'"),
        ("query_function_copy", f"SELECT * FROM query('COPY (SELECT 1) TO ''{leak}''')"),
        ("export", f"EXPORT DATABASE '{outside}/db'"),
    ]


ATTACK_NAMES = [name for name, _ in _attacks(Path("/s"), Path("/o"))]


@pytest.mark.parametrize("name", ATTACK_NAMES)
def test_attack_is_refused(store, tmp_path, name):
    sql = dict(_attacks(store, tmp_path))[name]
    before = _files(store)
    result = rlhf("query", sql, "--store", str(store))
    assert result.exit_code == 2, result.output
    assert "error:" in result.output and ("refused" in result.output
                                          or "query failed" in result.output)
    assert "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []  # nothing written outside
    assert _files(store) == before  # nothing written inside the store either
    # The store still answers afterwards: the attack changed nothing.
    assert rlhf("query", "SELECT count(*) FROM prompts", "--store", str(store),
                "-f", "csv").output.splitlines()[-1] == "6"


@pytest.mark.parametrize("name", [n for n in ATTACK_NAMES if n not in
                                  ("read_csv_etc_passwd", "read_text_escape", "url",
                                   "query_function_copy")])
def test_the_gate_refuses_before_running(store, tmp_path, name):
    sql = dict(_attacks(store, tmp_path))[name]
    with pytest.raises(QueryRefused) as refused:
        check_sql(sql)
    message = str(refused.value)
    if name.startswith("second"):
        assert "exactly one statement allowed, got 2" in message
    else:  # the message names the statement as it was written
        assert sql.split()[0].upper() in message


def test_file_reads_are_refused_by_the_locked_configuration(store):
    result = rlhf("query", "SELECT * FROM read_csv('/etc/passwd')", "--store", str(store))
    assert result.exit_code == 2
    assert "refused: queries may read only the store" in result.output
    assert "root:" not in result.output


def test_locked_connection_holds_without_the_gate(store, tmp_path):
    """Defence in depth: the configuration alone stops what the gate would have stopped."""
    con = connect(store, locked=True)
    assert con.execute("SELECT count(*) FROM rollouts").fetchone() == (9,)  # views still work
    # No progress bar may print into a CSV on stdout.
    assert con.execute("SELECT current_setting('enable_progress_bar')").fetchone() == (False,)
    leak = tmp_path / "leak.csv"
    for sql in [f"COPY (SELECT 1) TO '{leak}'", f"ATTACH '{tmp_path}/x.duckdb'",
                "INSTALL httpfs", "LOAD httpfs", "SELECT * FROM read_csv('/etc/passwd')",
                "SELECT * FROM glob('/etc/*')"]:
        with pytest.raises(duckdb.PermissionException):
            con.execute(sql)
    for sql in ["SET enable_external_access = true", "SET allowed_directories = ['/']",
                "SET lock_configuration = false"]:
        with pytest.raises(duckdb.InvalidInputException, match="locked"):
            con.execute(sql)
    assert list(tmp_path.iterdir()) == []


# User data is shown verbatim: rich never reads a value, a column name, a title or an error
# message as markup. One test per place user data reaches a rich table. -----------

MARKUP = ["[/INST]", "[bold red]x", "<s>[INST] hi [/INST]", "[link=file:///etc]y[/link]",
          ":smile:", "[/]"]


def _table_cells(out: str) -> list[str]:
    return [c.strip() for line in out.splitlines() if "│" in line for c in line.split("│")[1:-1]]


@pytest.mark.parametrize("text", MARKUP)
def test_values_are_shown_verbatim_in_every_format(store, text, tmp_path):
    lit = text.replace("'", "''")
    sql = f"SELECT '{lit}' AS v, ['{lit}'] AS l, {{'k': '{lit}'}} AS s"
    out = _ok(rlhf("query", sql, "--store", str(store)))
    cells = _table_cells(out)
    assert cells[0] == text
    assert json.loads(cells[1]) == [text] and json.loads(cells[2]) == {"k": text}
    csv_out = _ok(rlhf("query", sql, "--store", str(store), "-f", "csv"))
    assert next(csv.DictReader(io.StringIO(csv_out)))["v"] == text
    assert json.loads(_ok(rlhf("query", sql, "--store", str(store), "-f", "jsonl")))["v"] == text


def test_column_names_are_shown_verbatim(store):
    out = _ok(rlhf("query", 'SELECT 1 AS "[/INST]", 2 AS "[bold]b"', "--store", str(store)))
    header = [c.strip() for c in next(line for line in out.splitlines() if "┃" in line)
              .split("┃")[1:-1]]
    assert header == ["[/INST]", "[bold]b"]


def test_duckdb_settings_table_shows(store):
    out = _ok(rlhf("query", "SELECT name, value, description FROM duckdb_settings()",
                   "--store", str(store), "--limit", "500"))
    assert "allowed_directories" in out


def test_columns_that_share_a_name_keep_their_own_values(store):
    out = _ok(rlhf("query", "SELECT 'x' AS a, 'y' AS a", "--store", str(store)))
    assert _table_cells(out) == ["x", "y"]
    out = _ok(rlhf("query", "SELECT 'x' AS a, 'y' AS a", "--store", str(store), "-f", "csv"))
    assert out.splitlines() == ['"a","a"', '"x","y"']
    result = rlhf("query", "SELECT 'x' AS a, 'y' AS a", "--store", str(store), "-f", "jsonl")
    assert result.exit_code == 2 and "error:" in result.output and "distinct" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_values_csv_cannot_cast_become_text(store):
    out = _ok(rlhf("query", "SELECT INTERVAL 1 DAY AS i, 'ab'::BLOB AS b, MAP {'k': 1} AS m",
                   "--store", str(store), "-f", "csv"))
    row = next(csv.DictReader(io.StringIO(out)))
    assert row["b"] == "6162" and json.loads(row["m"]) == [["k", 1]] and "days=1" in row["i"]


@pytest.mark.parametrize("sql", ["SELECT '[/INST]' syntax error", "SELECT * FROM \"[/INST]\"",
                                 "SELECT '[bold red]x'::INTEGER"])
def test_an_error_quoting_markup_is_one_clean_error_line(store, sql):
    result = rlhf("query", sql, "--store", str(store))
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1
    assert "[/INST]" in result.output or "[bold red]x" in result.output


def test_tables_shows_a_store_path_verbatim(tmp_path):
    root = synthetic_store.build(tmp_path / "[/INST]" / "[bold]store")
    out = _ok(rlhf("tables", "--store", str(root)))
    assert "[/INST]/[bold]store" in out.replace("\n", "")


def test_audit_title_parameters_and_values_verbatim(store, tmp_path):
    from rlhf.store.io import write_shard

    out = _ok(rlhf("audit", "lineage", "[/INST]", "--store", str(store)))
    assert "checkpoint='[/INST]'" in out
    # a prompt whose source type and text hold markup, through the sources audit's table
    root = synthetic_store.build(tmp_path / "store")
    write_shard("prompts", [{"prompt_id": "m1", "text": "[/INST]", "source_type": "[bold red]x",
                             "source_file": "[/b].jsonl", "source_line": 1, "provenance": "{}",
                             "created_at": None, "n_tokens": 1}],
                root / "prompts" / "part-markup.parquet")
    out = _ok(rlhf("audit", "sources", "--store", str(root)))
    assert "[bold red]x" in _table_cells(out)
    out = _ok(rlhf("query", "SELECT text, source_file FROM prompts WHERE prompt_id = 'm1'",
                   "--store", str(root)))
    assert _table_cells(out) == ["[/INST]", "[/b].jsonl"]


def test_a_damaged_shard_is_a_clear_error(tmp_path):
    root = synthetic_store.build(tmp_path / "store")
    shard = sorted((root / "prompts").glob("*.parquet"))[0]
    shard.write_bytes(shard.read_bytes()[:100])  # cut short: no parquet footer
    for args in (["query", "SELECT 1"], ["tables"], ["audit", "sources"]):
        result = rlhf(*args, "--store", str(root))
        assert result.exit_code == 2, (args, result.output)
        assert isinstance(result.exception, SystemExit)
        assert "error:" in result.output and shard.name in result.output


def test_control_characters_in_values_are_shown_as_escapes_not_sent_to_the_terminal(store):
    sql = "SELECT 'a' || chr(27) || '[31mred' || chr(0) || chr(13) || 'z' AS v"
    out = _ok(rlhf("query", sql, "--store", str(store)))
    assert "\x1b" not in out and "\x00" not in out and "\r" not in out
    assert _table_cells(out) == ["a\\x1b[31mred\\x00\\rz"]
    # the machine formats keep the value itself (JSON escapes it, as JSON does)
    row = json.loads(_ok(rlhf("query", sql, "--store", str(store), "-f", "jsonl")))
    assert row["v"] == "a\x1b[31mred\x00\rz"
