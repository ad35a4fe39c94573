"""`rlhf query`, `rlhf tables`, `rlhf audit`, `rlhf rollup`: read-only SQL over the store, the
named audits, and the per-step rollups they read.

    rlhf tables
    rlhf query "SELECT source_type, count(*) FROM prompts GROUP BY ALL"
    rlhf query "FROM rollouts WHERE run_id = 'ppo-0001'" --format parquet --out r.parquet
    rlhf audit                      # lists the audits
    rlhf audit lineage CHECKPOINT
    rlhf rollup                     # after a PPO run wrote to the store (dvc repro does it)

Statements go through store/query.py's gate and a locked DuckDB connection (store/catalog.py);
a refused or failing query is an `error:` line and exit code 2, never a traceback.
"""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import io
import json
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.text import Text

from rlhf.cli.common import METRICS, REPORT, add_plain_row, data_table, fail, plain, write_metrics

DISPLAY_ROWS = 100  # rows a rich table shows when no --limit is given
STORE_HELP = "Store root: one folder of parquet shards per table."


class Format(str, enum.Enum):
    table = "table"
    csv = "csv"
    jsonl = "jsonl"
    parquet = "parquet"


def _json_default(value: Any) -> Any:
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    return str(value)


def _cell(value: Any) -> Text:
    """One value as rich text, verbatim (never read as markup: `[/INST]` is text)."""
    if value is None:
        return plain("NULL", style="dim")
    if isinstance(value, float):
        return plain(f"{value:.6g}")
    if isinstance(value, (list, dict)):
        return plain(json.dumps(value, default=_json_default, ensure_ascii=False))
    if isinstance(value, dt.datetime):
        return plain(value.isoformat(sep=" "))
    return plain(value)


def _csv_castable(typ) -> bool:
    """Whether Arrow's CSV writer can cast the type to text itself."""
    import pyarrow as pa

    if pa.types.is_dictionary(typ):
        return _csv_castable(typ.value_type)
    return not (pa.types.is_nested(typ) or pa.types.is_interval(typ)
                or pa.types.is_binary(typ) or pa.types.is_large_binary(typ)
                or pa.types.is_fixed_size_binary(typ) or isinstance(typ, pa.ExtensionType))


def _flat_for_csv(batch):
    """CSV cannot hold lists or structs (they become JSON text), nor bytes (hex) or intervals."""
    import pyarrow as pa

    columns = []
    for col in batch.columns:
        if pa.types.is_nested(col.type):
            col = pa.array([None if v is None else json.dumps(v, default=_json_default,
                                                              ensure_ascii=False)
                            for v in col.to_pylist()], pa.string())
        elif not _csv_castable(col.type):
            col = pa.array([None if v is None else _json_default(v) for v in col.to_pylist()],
                           pa.string())
        columns.append(col)
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)


def _batches(reader, limit: int | None):
    """Record batches of the result, cut at `limit` rows; then whether rows were left over."""
    taken = 0
    out = []
    more = False
    for batch in reader:
        if limit is not None and taken + batch.num_rows > limit:
            out.append(batch.slice(0, limit - taken))
            more = True
            break
        out.append(batch)
        taken += batch.num_rows
    return out, more, reader.schema


def _emit(reader, fmt: Format, out: Path | None, limit: int | None, title: str) -> None:
    """Write the result in `fmt` to `out` (or stdout); the rich table caps rows at DISPLAY_ROWS."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    if fmt is Format.table:
        shown = limit if limit is not None else DISPLAY_ROWS
        batches, more, schema = _batches(reader, shown)
        result = pa.Table.from_batches(batches, schema=schema)
        # by position, not by name: two columns may share a name (`SELECT 1 AS a, 2 AS a`)
        columns = [col.to_pylist() for col in result.columns]
        table = data_table(title, [(f.name, {"overflow": "fold"}) for f in schema],
                           show_lines=False, title_justify="left")
        for i in range(result.num_rows):
            add_plain_row(table, *(_cell(col[i]) for col in columns))
        console = Console(width=max(Console().width, 100))
        console.print(table)
        note = f"{result.num_rows} row(s)"
        if more:
            note += " shown; more not shown (--limit N, or --format csv/jsonl/parquet --out FILE)"
        console.print(plain(note, style="dim"), highlight=False)
        return
    batches, _, schema = _batches(reader, limit)
    n = sum(b.num_rows for b in batches)
    if fmt is Format.parquet:
        out.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_batches(batches, schema=schema), out, compression="zstd")
    elif fmt is Format.csv:
        buf = io.BytesIO()
        flat = [_flat_for_csv(b) for b in batches or [pa.RecordBatch.from_pylist([], schema=schema)]]
        pacsv.write_csv(pa.Table.from_batches(flat), buf)
        _write_text(buf.getvalue().decode("utf-8"), out)
    else:
        names = schema.names
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise _OutputError(f"column name(s) {twice} appear more than once; a JSON line needs "
                               "distinct keys (give the columns aliases)")
        lines = [json.dumps(row, default=_json_default, ensure_ascii=False)
                 for b in batches for row in b.to_pylist()]
        _write_text("".join(line + "\n" for line in lines), out)
    if out is not None:
        Console(stderr=True).print(plain(f"wrote {n} row(s) to {out}"), highlight=False)


class _OutputError(ValueError):
    """The result cannot be written in the asked format (reported as an `error:` line)."""


def _write_text(text: str, out: Path | None) -> None:
    if out is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")


def _run(store: Path, sql: str, params: dict[str, Any] | None, fmt: Format, out: Path | None,
         limit: int | None, explain: bool, title: str) -> None:
    """Open the locked store, gate and run `sql`, print the result; every failure is `fail`."""
    import duckdb
    import pyarrow as pa

    from rlhf.store.query import QueryRefused, open_store, run_sql

    if fmt is Format.table and out is not None:
        fail("--out needs --format csv, jsonl or parquet")
    if fmt is Format.parquet and out is None and not explain:
        fail("--format parquet needs --out FILE")
    try:
        con = open_store(store)
    except FileNotFoundError as exc:
        fail(str(exc))
    except duckdb.Error as exc:  # a damaged shard: the views read every file's schema
        fail(f"cannot open the store {store}: {exc}")
    try:
        relation = run_sql(con, sql, params, explain=explain)
        if explain:
            typer.echo("\n".join(str(row[-1]) for row in relation.fetchall()))
            return
        reader = relation.to_arrow_reader(8192)
        _emit(reader, fmt, out, limit, title)
    except FileNotFoundError as exc:
        fail(str(exc))
    except QueryRefused as exc:
        fail(f"refused: {exc}")
    except duckdb.PermissionException as exc:
        fail(f"refused: queries may read only the store ({store}); {exc}")
    except duckdb.Error as exc:
        fail(f"query failed: {exc}")
    except OSError as exc:
        fail(f"cannot write the output: {exc}")
    except _OutputError as exc:
        fail(str(exc))
    except (pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
        # a value the output format cannot represent; the user gets the reason, not a traceback
        fail(f"cannot show the result as {fmt.value}: {type(exc).__name__}: {exc}")


def query(
    sql: str = typer.Argument(..., help="One read-only statement: SELECT / WITH / VALUES / "
                              "DESCRIBE / SHOW / SUMMARIZE / EXPLAIN."),
    store: Path = typer.Option(Path("artifacts/store"), "--store", help=STORE_HELP),
    fmt: Format = typer.Option(Format.table, "--format", "-f", help="Output format."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Write to this file (csv/jsonl/parquet)."),
    explain: bool = typer.Option(False, "--explain", help="Show DuckDB's plan instead of rows."),
    limit: int | None = typer.Option(None, "--limit", "-n", min=1,
                                     help=f"At most N rows (a table shows {DISPLAY_ROWS} by default)."),
) -> None:
    """Ask the store a question in SQL (DuckDB, one view per table; see `rlhf tables`)."""
    _run(store, sql, None, fmt, out, limit, explain, title="")


def tables(
    store: Path = typer.Option(Path("artifacts/store"), "--store", help=STORE_HELP),
) -> None:
    """List every view `rlhf query` can read, with its row count, columns and types."""
    import duckdb

    from rlhf.store.query import QueryRefused, open_store
    from rlhf.store.rollup import list_rollups
    from rlhf.store.schemas import TABLES

    rollup_docs = {r.name: f"rollup (store/rollups/{r.name}.sql): {r.doc}" for r in list_rollups()}
    try:
        con = open_store(store)
        names = [r[0] for r in con.execute(
            "SELECT view_name FROM duckdb_views() WHERE NOT internal ORDER BY view_name").fetchall()]
        order = [n for n in TABLES if n in names] + [n for n in names if n not in TABLES]
        table = data_table(f"store views ({store})",
                           [("view", {"style": "bold"}), ("rows", {"justify": "right"}),
                            "columns", "about"], show_lines=True, title_justify="left")
        for name in order:
            ident = '"' + name.replace('"', '""') + '"'
            cols = con.execute(f"DESCRIBE {ident}").fetchall()
            count = con.execute(f"SELECT count(*) FROM {ident}").fetchone()[0]
            doc = ((TABLES[name].metadata or {}).get(b"doc", b"").decode() if name in TABLES
                   else rollup_docs.get(name, ""))
            described = Text("\n").join(Text.assemble(plain(c[0]), " ", plain(c[1], "dim"))
                                        for c in cols)
            add_plain_row(table, name, f"{count:,}", described, doc)
        Console(width=max(Console().width, 120)).print(table)
    except (FileNotFoundError, QueryRefused) as exc:
        fail(str(exc))
    except duckdb.Error as exc:
        fail(f"cannot read the store: {exc}")


def audit(
    name: str | None = typer.Argument(None, help="Audit name; omit to list the audits."),
    args: list[str] | None = typer.Argument(None, help="The audit's parameters, in order."),
    store: Path = typer.Option(Path("artifacts/store"), "--store", help=STORE_HELP),
    fmt: Format = typer.Option(Format.table, "--format", "-f", help="Output format."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Write to this file (csv/jsonl/parquet)."),
    limit: int | None = typer.Option(None, "--limit", "-n", min=1,
                                     help=f"At most N rows (a table shows {DISPLAY_ROWS} by default)."),
    explain: bool = typer.Option(False, "--explain", help="Show DuckDB's plan instead of rows."),
    show_sql: bool = typer.Option(False, "--sql", help="Print the audit's SQL file and exit."),
) -> None:
    """Run a named provenance audit: a SQL file shipped in rlhf/store/audits/ (read it with --sql)."""
    from rlhf.store.query import QueryRefused, get_audit, list_audits

    if name is None:
        table = data_table("audits (rlhf audit NAME [ARGS]; --sql shows the SQL)",
                           [("usage", {"style": "bold"}), "what it answers"], title_justify="left")
        for a in list_audits():
            add_plain_row(table, a.usage(), a.summary)
        Console(width=max(Console().width, 100)).print(table)
        return
    try:
        chosen = get_audit(name)
        if show_sql:
            typer.echo(chosen.sql, nl=False)
            return
        params = chosen.bind(list(args or []))
    except QueryRefused as exc:
        fail(str(exc))
    _note_stale_rollups(store, chosen.sql)
    shown = ", ".join(f"{k}={v!r}" for k, v in params.items())
    _run(store, chosen.sql, params, fmt, out, limit, explain,
         title=f"audit {chosen.name}{' (' + shown + ')' if shown else ''}: {chosen.summary}")


def _note_stale_rollups(store: Path, sql: str) -> None:
    """One line on stderr when an audit that reads rollups will read the raw rows instead,
    because the stored rollups are not fresh."""
    from rlhf.store.rollup import has_rollouts, list_rollups, state

    if not any(r.name in sql for r in list_rollups()):
        return
    try:
        current = state(store) if store.is_dir() and has_rollouts(store) else "fresh"
    except OSError:
        return  # _run reports an unreadable store
    if current != "fresh":
        typer.echo(f"note: the store's rollups are {current}: this audit reads every rollout row "
                   f"(the same answer, slower); `rlhf rollup --store {store}` builds them", err=True)


def rollup(
    store: Path = typer.Option(Path("artifacts/store"), "--store", help=STORE_HELP),
    check: bool = typer.Option(False, "--check", help="Only say whether the stored rollups are "
                               "the store's (exit 1 if not); write nothing."),
    metrics: Path | None = METRICS,
    report: Path | None = REPORT,
) -> None:
    """Build the rollups the audits read (per-step sums of rollouts and RM scores); dvc repro does.

    Until they are rebuilt after a PPO run writes, `rlhf audit` reads every raw row (slower).
    """
    import duckdb

    from rlhf.store.rollup import FOLDER, build, state

    if not store.is_dir():
        fail(f"store folder not found: {store} (run the pipeline, or pass --store)")
    if check:
        current = state(store)
        typer.echo(f"rollups of {store}: {current}")
        raise typer.Exit(0 if current == "fresh" else 1)
    try:
        rows = build(store)
        steps = (store / FOLDER / "rollout_steps.parquet").resolve().as_posix().replace("'", "''")
        rollouts = duckdb.connect().execute(
            f"SELECT coalesce(sum(n), 0)::BIGINT FROM read_parquet('{steps}')").fetchone()[0]
    except duckdb.Error as exc:  # a damaged shard, or the prompt_key collision check
        fail(f"cannot build the rollups of {store}: {exc}")
    except OSError as exc:
        fail(f"cannot write the rollups: {exc}")
    table = data_table(f"rollups of {rollouts:,} rollouts written to {store}/{FOLDER} (fresh)",
                       ["rollup", ("rows", {"justify": "right"}), ("MiB", {"justify": "right"}),
                        ("seconds", {"justify": "right"})], title_justify="left")
    for row in rows:
        add_plain_row(table, row["rollup"], f"{row['rows']:,}", f"{row['bytes'] / 2**20:.2f}",
                      f"{row['seconds']:.2f}")
    Console(width=max(Console().width, 80)).print(table)
    write_metrics("rollups", {"rollout_rows": rollouts,
                              "rows": {r["rollup"]: r["rows"] for r in rows},
                              "bytes": {r["rollup"]: r["bytes"] for r in rows},
                              "seconds": {r["rollup"]: r["seconds"] for r in rows}},
                  metrics, report)
