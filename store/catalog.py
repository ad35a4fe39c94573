"""A DuckDB connection with one view per store table over its shard glob.

The store root holds one folder per table (`<root>/<table>/**/*.parquet`); a table with no
shards yet still gets a view, empty but typed, so queries written today keep working. A table
folder with hive partitions (`rollouts/run_id=<id>/step_bucket=<k>/part-*.parquet`, see
store/rollouts.py) is read with `hive_partitioning`, so a filter on `run_id` skips whole folders;
partition keys that are not columns of the table's schema (`step_bucket`) stay out of the view.
Shards written before a column was added to the schema read it as null (`union_by_name`, and
a typed null column when no shard has it), so a store written by an older version still answers
every query and audit of this one. The rollups the audits read (store/rollup.py) are views too.

`connect(root, locked=True)` is what `rlhf query` and `rlhf audit` use: once the views exist,
DuckDB may read files under the store root only (no other file, no network), may not install or
load extensions, and its configuration is locked so no statement can undo that.

    python -c "from rlhf.store.catalog import connect; print(connect('artifacts/store').sql('SHOW TABLES'))"
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from rlhf.store.io import shard_paths
from rlhf.store.schemas import TABLES


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _quote_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _glob_literal(path: str) -> str:
    """`path` as a DuckDB glob that matches only itself: `[`, `*` and `?` as one-character
    classes (a store under `/data/[2026]/` would otherwise be read as a character class)."""
    return "".join(f"[{ch}]" if ch in "[*?" else ch for ch in path)


def partition_keys(directory: Path, shards: list[Path]) -> list[str]:
    """Hive partition keys (`key=value` folder names) between `directory` and its shards."""
    keys: list[str] = []
    for shard in shards:
        for part in shard.relative_to(directory).parts[:-1]:
            key = part.split("=", 1)[0] if "=" in part else None
            if key and key not in keys:
                keys.append(key)
    return keys


def _duckdb_types(con: duckdb.DuckDBPyConnection, name: str) -> list[tuple[str, str]]:
    """(column, DuckDB type) of `name`'s schema, as DuckDB itself maps the Arrow types."""
    helper = f"__schema_{name}"
    con.register(helper, TABLES[name].empty_table())
    try:
        return [(row[0], row[1]) for row in con.execute(f"DESCRIBE {_quote_ident(helper)}").fetchall()]
    finally:
        con.unregister(helper)


def _evolved_select(con: duckdb.DuckDBPyConnection, view: str,
                    types: list[tuple[str, str]]) -> str | None:
    """The select list of `view` when no shard has some of the schema's columns (a column added
    after the store was written; `union_by_name` already reads it as null in older shards once
    one shard has it): the schema's columns in order, the missing ones as typed nulls, then any
    column the shards have beyond the schema. None when nothing is missing."""
    have = [row[0] for row in con.execute(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = ? ORDER BY column_index",
        [view]).fetchall()]
    if all(col in have for col, _ in types):
        return None
    known = {col for col, _ in types}
    cols = [_quote_ident(col) if col in have else f"CAST(NULL AS {ctype}) AS {_quote_ident(col)}"
            for col, ctype in types]
    return ", ".join(cols + [_quote_ident(col) for col in have if col not in known])


def _empty_view_sql(types: list[tuple[str, str]]) -> str:
    """`SELECT NULL::type AS col, ... WHERE false`: an empty view typed like the schema.

    A plain SQL view (rather than a registered Arrow table) keeps no Python object alive, shows
    no helper name in SHOW TABLES, and works unchanged once external access is off.
    """
    cols = ", ".join(f"CAST(NULL AS {ctype}) AS {_quote_ident(col)}" for col, ctype in types)
    return f"SELECT * FROM (SELECT {cols}) WHERE false"


def lock_down(con: duckdb.DuckDBPyConnection, root: str | Path) -> None:
    """Read-only-to-the-store mode: files under `root` only, no extensions, configuration locked.

    Defence in depth under `rlhf query`'s statement gate (store/query.py): even a statement that
    got past the gate could not read /etc/passwd, fetch a URL, ATTACH a file or LOAD an extension.
    """
    allowed = str(Path(root).resolve()) + "/"  # trailing slash: `<root>2/` is not a prefix match
    # DuckDB checks a view's glob pattern itself against the list, so a root holding `[`, `*` or
    # `?` is allowed in its escaped form too (that form matches only the root, see _glob_literal)
    prefixes = sorted({allowed, _glob_literal(allowed)})
    con.execute(f"SET allowed_directories = [{', '.join(_quote_str(p) for p in prefixes)}]")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def connect(root: str | Path, tables: list[str] | None = None,
            locked: bool = False, with_rollups: bool = True) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with a view per table under `root` (all tables by default).

    With every table (and `with_rollups`), a view per rollup too (store/rollup.py: the stored
    per-step summaries when fresh, else their SQL over the tables). `locked=True` then calls
    `lock_down`: the views keep working, nothing else outside `root` can be read, and the
    settings cannot be changed back.
    """
    root = Path(root)
    con = duckdb.connect(":memory:", config={"autoinstall_known_extensions": False,
                                             "autoload_known_extensions": False})
    # No progress bar: it would print into `rlhf query --format csv` output on a long query.
    con.execute("SET enable_progress_bar = false")
    for name in tables or list(TABLES):
        directory = root / name
        ident = _quote_ident(name)
        shards = shard_paths(directory)
        types = _duckdb_types(con, name)
        if shards:
            glob = _quote_str(_glob_literal(str(directory.resolve())) + "/**/*.parquet")
            keys = partition_keys(directory, shards)
            options = "union_by_name = true"
            select = "*"
            if keys:
                # The folder name's value wins over the file's column, so give it the schema's
                # type (a run_id "0042" must stay VARCHAR); other keys stay out of the view.
                typed = {col: ctype for col, ctype in types if col in keys}
                hive_types = ", ".join(f"{_quote_str(c)}: {_quote_str(t)}" for c, t in typed.items())
                options += ", hive_partitioning = true, hive_types_autocast = false"
                if hive_types:
                    options += f", hive_types = {{{hive_types}}}"
                extra = [k for k in keys if k not in typed]
                if extra:
                    select = f"* EXCLUDE ({', '.join(_quote_ident(k) for k in extra)})"
            source = f"read_parquet({glob}, {options})"
            con.execute(f"CREATE VIEW {ident} AS SELECT {select} FROM {source}")
            evolved = _evolved_select(con, name, types)
            if evolved:  # no shard has some of the schema's columns: they read as null
                con.execute(f"CREATE OR REPLACE VIEW {ident} AS SELECT {evolved} FROM {source}")
        else:
            con.execute(f"CREATE VIEW {ident} AS {_empty_view_sql(types)}")
    if tables is None and with_rollups:
        from rlhf.store.rollup import attach

        attach(con, root)
    if locked:
        lock_down(con, root)
    return con
