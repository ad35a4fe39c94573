"""Read-only SQL over the store: the statement gate, the locked connection, the named audits.

`rlhf query` and `rlhf audit` both come through here. Two independent locks keep a question a
question:

1. the gate (`check_sql`): DuckDB's own parser must find exactly one statement, of type SELECT
   (which covers WITH, VALUES, FROM-first, DESCRIBE, SHOW and SUMMARIZE) or EXPLAIN of such a
   statement; COPY, ATTACH, INSTALL/LOAD, CREATE, INSERT, DELETE, SET, PRAGMA, CALL, a second
   statement... are refused before anything runs;
2. the connection (`store.catalog.connect(root, locked=True)`): files outside the store, the
   network and extensions are off, and the configuration is locked.

The named audits are SQL files in store/audits/ that a user can read and copy; parameters are
DuckDB named parameters (`$checkpoint`) declared in the file's header:

    -- param: window BIGINT = 100 : steps per row

    python -c "from rlhf.store.query import list_audits; print([a.name for a in list_audits()])"
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

AUDITS_DIR = Path(__file__).resolve().parent / "audits"

ALLOWED = "SELECT, WITH, VALUES, DESCRIBE, SHOW, SUMMARIZE or EXPLAIN"
_EXPLAIN = re.compile(r"^\s*EXPLAIN\s+(?:ANALY[SZ]E\s+)?", re.IGNORECASE)


class QueryRefused(ValueError):
    """The statement is not a single read-only question; the message says why."""


def _statement_type(statement: Any) -> str:
    return str(statement.type).rsplit(".", 1)[-1]  # "StatementType.SELECT" -> "SELECT"


def check_sql(sql: str) -> str:
    """Return `sql` if it is exactly one read-only statement, else raise QueryRefused.

    Parsed by DuckDB itself (`extract_statements`), so the gate and the engine never disagree on
    where a statement ends. EXPLAIN ANALYZE runs its statement, so EXPLAIN is judged by what it
    explains.
    """
    if not sql or not sql.strip():
        raise QueryRefused("empty query")
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryRefused(f"not valid SQL: {_clean(exc)}") from None
    if len(statements) != 1:
        raise QueryRefused(f"exactly one statement allowed, got {len(statements)} "
                           "(nothing was run)")
    kind = _statement_type(statements[0])
    if kind == "SELECT":
        return sql
    if kind == "EXPLAIN":
        match = _EXPLAIN.match(statements[0].query)
        if match is None:
            raise QueryRefused("EXPLAIN is allowed only as `EXPLAIN [ANALYZE] <query>`")
        inner = statements[0].query[match.end():]
        try:
            check_sql(inner)
        except QueryRefused as exc:
            raise QueryRefused(f"EXPLAIN of a refused statement: {exc}") from None
        return sql
    # Name the statement as the user wrote it (DuckDB files INSTALL under LOAD, USE under SET).
    words = statements[0].query.split(None, 1)
    word = words[0].upper() if words and words[0].isalpha() else ""
    label = word if word and word != "WITH" else kind
    raise QueryRefused(f"{label} statements are not allowed: read-only questions only "
                       f"({ALLOWED})")


def _clean(exc: BaseException) -> str:
    """DuckDB's message without its multi-line caret diagram noise at the end."""
    return str(exc).strip()


def open_store(root: str | Path) -> duckdb.DuckDBPyConnection:
    """The locked connection `rlhf query` uses; FileNotFoundError if the store folder is missing."""
    from rlhf.store.catalog import connect

    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"store folder not found: {root} (run the pipeline, or pass --store)")
    return connect(root, locked=True)


def run_sql(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any] | None = None,
            explain: bool = False) -> duckdb.DuckDBPyRelation:
    """Gate `sql`, then run it on `con` (optionally as EXPLAIN): a relation to read the rows from.

    Raises QueryRefused for a refused statement and duckdb.Error for a failing query.
    """
    check_sql(sql)
    if explain:
        body = sql.strip().rstrip(";")
        if _EXPLAIN.match(body):
            raise QueryRefused("--explain with a statement that already says EXPLAIN")
        sql = check_sql("EXPLAIN " + body)
    return con.sql(sql, params=params or None)


# The named audits -------------------------------------------------------------------------

_PARAM = re.compile(r"^--\s*param:\s*(\w+)\s+(\w+)(?:\s*=\s*(\S+))?\s*:\s*(.*)$")
_CASTS = {"VARCHAR": str, "BIGINT": int, "INTEGER": int, "DOUBLE": float}


@dataclass(frozen=True)
class AuditParam:
    name: str
    type: str  # VARCHAR / BIGINT / INTEGER / DOUBLE
    default: str | None  # None: required
    help: str

    def convert(self, raw: str) -> Any:
        try:
            return _CASTS[self.type](raw)
        except ValueError:
            raise QueryRefused(f"parameter {self.name} expects {self.type}, got {raw!r}") from None


@dataclass(frozen=True)
class Audit:
    name: str
    path: Path
    summary: str  # the file's first comment line
    params: tuple[AuditParam, ...]

    @property
    def sql(self) -> str:
        return self.path.read_text(encoding="utf-8")

    def bind(self, args: list[str]) -> dict[str, Any]:
        """Positional command-line values -> named parameters (defaults fill the rest)."""
        if len(args) > len(self.params):
            raise QueryRefused(f"audit {self.name} takes {len(self.params)} argument(s) "
                               f"({self.usage()}), got {len(args)}")
        bound: dict[str, Any] = {}
        for i, param in enumerate(self.params):
            if i < len(args):
                bound[param.name] = param.convert(args[i])
            elif param.default is not None:
                bound[param.name] = param.convert(param.default)
            else:
                raise QueryRefused(f"audit {self.name} needs {param.name.upper()} "
                                   f"({param.help}); usage: {self.usage()}")
        return bound

    def usage(self) -> str:
        parts = [f"rlhf audit {self.name}"]
        for p in self.params:
            parts.append(p.name.upper() if p.default is None else f"[{p.name.upper()}={p.default}]")
        return " ".join(parts)


def _parse_audit(path: Path) -> Audit:
    """The header: a summary (first comment lines, up to `usage:`), then `param:` lines."""
    summary: list[str] = []
    params: list[AuditParam] = []
    in_summary = True
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("--"):
            break
        text = line.lstrip("-").strip()
        m = _PARAM.match(line)
        if m:
            name, ptype, default, help_ = m.groups()
            if ptype.upper() not in _CASTS:
                raise ValueError(f"{path}: parameter {name} has unsupported type {ptype}")
            params.append(AuditParam(name, ptype.upper(), default, help_.strip()))
        if m or text.startswith("usage:") or not text:
            in_summary = False
        elif in_summary:
            summary.append(text)
    return Audit(path.stem, path, " ".join(summary), tuple(params))


def list_audits() -> list[Audit]:
    return [_parse_audit(p) for p in sorted(AUDITS_DIR.glob("*.sql"))]


def get_audit(name: str) -> Audit:
    audits = {a.name: a for a in list_audits()}
    if name not in audits:
        raise QueryRefused(f"unknown audit {name!r}; known audits: {', '.join(sorted(audits))}")
    return audits[name]
