"""A DuckDB connection with one view per store table over its shard glob.

The store root holds one folder per table (`<root>/<table>/**/*.parquet`); a table with no
shards yet still gets a view, empty but typed, so queries written today keep working.

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


def connect(root: str | Path, tables: list[str] | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with a view per table under `root` (all tables by default)."""
    root = Path(root)
    con = duckdb.connect(":memory:")
    for name in tables or list(TABLES):
        directory = root / name
        ident = _quote_ident(name)
        if shard_paths(directory):
            glob = _quote_str(str(directory.resolve() / "**" / "*.parquet"))
            con.execute(
                f"CREATE VIEW {ident} AS SELECT * FROM read_parquet({glob}, union_by_name = true)"
            )
        else:
            con.register(f"__empty_{name}", TABLES[name].empty_table())
            con.execute(f"CREATE VIEW {ident} AS SELECT * FROM {_quote_ident('__empty_' + name)}")
    return con
