"""Rollups: per-step summaries of the rollout history that the audits read instead of every row.

At 10M rollouts the audits' floor is their hash aggregation over every row (bench/bench_query.py:
reading a column takes 0.01-0.03 s, grouping and summing it 0.3-0.5 s on 2 cores), whatever the
shards' layout. The audits ask per step window, bucket, source or RM, so a step's thousand
rollouts fold into a few dozen rows once, and each audit then sums those. A rollup is a SQL file
in store/rollups/ (its header names the tables it reads), and it is also what answers when its
stored copy is missing or stale, so an audit's result never depends on whether one was built:

- `build(root)` (`rlhf rollup`, the `rollups` stage of dvc.yaml) writes every rollup to
  `<root>/rollups/<name>.parquet` and, last, `manifest.json` with the fingerprint of what it read;
- `attach(con, root)` (store.catalog.connect) defines a view per rollup: over the stored file
  when the manifest's fingerprint is the store's current one, else the rollup's own SQL over the
  raw tables (the same rows, at the raw tables' speed).

The fingerprint covers every shard of the tables the rollups read (path, size and the parquet
footer, which holds each column chunk's size, row count and min/max) and the rollups' SQL, so a
new, rewritten or removed shard, or an edited rollup, makes the stored copies stale; a copy or
`dvc checkout` that changes only the files' times does not.

    python -c "from rlhf.store.rollup import state; print(state('artifacts/store'))"
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb

from rlhf.store.io import TMP_SUFFIX, remove_partials, shard_paths, write_text_atomic

ROLLUPS_DIR = Path(__file__).resolve().parent / "rollups"
FOLDER = "rollups"  # <store>/rollups/
MANIFEST = "manifest.json"
VERSION = 1  # of the stored format; a change makes every stored rollup stale
_READS = re.compile(r"^--\s*reads:\s*(.+)$", re.MULTILINE)
_PARQUET_TAIL = 8  # footer length (4 bytes, little-endian) + b"PAR1"


@dataclass(frozen=True)
class Rollup:
    name: str
    path: Path
    doc: str  # the file's first comment line
    reads: tuple[str, ...]  # the store tables its SQL reads

    @property
    def sql(self) -> str:
        return self.path.read_text(encoding="utf-8")


def list_rollups() -> list[Rollup]:
    found = []
    for path in sorted(ROLLUPS_DIR.glob("*.sql")):
        text = path.read_text(encoding="utf-8")
        reads = _READS.search(text)
        if reads is None:
            raise ValueError(f"{path}: the header must name the tables it reads (-- reads: ...)")
        found.append(Rollup(path.stem, path, text.splitlines()[0].lstrip("-").strip(),
                            tuple(t.strip() for t in reads.group(1).split(","))))
    return found


def inputs() -> list[str]:
    """Every store table some rollup reads, in a fixed order."""
    return sorted({table for r in list_rollups() for table in r.reads})


def _footer(path: Path) -> bytes:
    """The parquet footer's bytes (its metadata), or the file's tail if it is not parquet."""
    with open(path, "rb") as fh:
        size = fh.seek(0, 2)
        if size < 2 * _PARQUET_TAIL:
            fh.seek(0)
            return fh.read()
        fh.seek(size - _PARQUET_TAIL)
        tail = fh.read(_PARQUET_TAIL)
        length = int.from_bytes(tail[:4], "little")
        if tail[4:] != b"PAR1" or length > size - _PARQUET_TAIL:
            return tail
        fh.seek(size - _PARQUET_TAIL - length)
        return fh.read(length) + tail


def fingerprint(root: str | Path) -> str:
    """sha256 over the rollups' SQL and every shard of the tables they read (module docstring)."""
    root = Path(root)
    h = hashlib.sha256(f"rollups v{VERSION}\n".encode())
    for rollup in list_rollups():
        h.update(f"{rollup.name}\n{rollup.sql}\n".encode())
    for table in inputs():
        directory = root / table
        for shard in shard_paths(directory):
            h.update(f"{shard.relative_to(root).as_posix()}\0{shard.stat().st_size}\0".encode())
            h.update(hashlib.sha256(_footer(shard)).digest())
    return h.hexdigest()


def _manifest(root: Path) -> dict | None:
    try:
        data = json.loads((root / FOLDER / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def state(root: str | Path) -> str:
    """'fresh' (the stored rollups are the store's), 'stale' (built from other shards or SQL, or
    a file missing) or 'absent' (never built)."""
    root = Path(root)
    manifest = _manifest(root)
    if manifest is None:
        return "absent"
    if manifest.get("fingerprint") != fingerprint(root):
        return "stale"
    folder = root / FOLDER
    if not all((folder / f"{r.name}.parquet").is_file() for r in list_rollups()):
        return "stale"
    return "fresh"


def has_rollouts(root: str | Path) -> bool:
    return bool(shard_paths(Path(root) / "rollouts"))


def attach(con: duckdb.DuckDBPyConnection, root: str | Path, stored: bool = True) -> str:
    """A view per rollup on `con` (which already has the store's table views); returns the state.

    Fresh (and `stored`): each view reads its stored file. Otherwise: each view is the rollup's
    SQL over the table views, so the audits give the same answer, only slower (`stored=False`
    asks for that path whatever the state: bench/bench_query.py times it).
    """
    root = Path(root)
    current = state(root)
    for rollup in list_rollups():
        if current == "fresh" and stored:
            stored = root / FOLDER / f"{rollup.name}.parquet"
            body = f"SELECT * FROM read_parquet({_literal_path(stored)})"
        else:
            body = rollup.sql
        con.execute(f'CREATE VIEW "{rollup.name}" AS {body}')
    return current


def _literal_path(path: Path) -> str:
    """`path` as a DuckDB string literal that names only that file (no glob characters)."""
    from rlhf.store.catalog import _glob_literal, _quote_str

    return _quote_str(_glob_literal(str(path.resolve())))


def build(root: str | Path) -> list[dict]:
    """Write every rollup of the store at `root` and its manifest; returns a row per rollup
    (name, rows, bytes, seconds). The old manifest goes first and the new one is written last,
    each file to a hidden temporary name then renamed: a build killed half-way leaves no
    manifest, so the audits read the raw tables (`state` 'absent') until a build completes."""
    from rlhf.store.catalog import connect

    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"store folder not found: {root} "
                                "(run the pipeline, or pass --store)")
    folder = root / FOLDER
    folder.mkdir(exist_ok=True)
    remove_partials(folder)
    # The fingerprint first: a shard written while the rollups are built makes them stale
    # (the fingerprint would not cover it), never wrongly fresh.
    stamp = fingerprint(root)
    (folder / MANIFEST).unlink(missing_ok=True)  # stale from here until the new one is written
    con = connect(root, with_rollups=False)
    # One thread and sorted rows: the same shards give the same bytes (float sums in one order),
    # so a rerun of the `rollups` stage leaves its outputs' hashes as they were.
    con.execute("SET threads = 1")
    rows = []
    for rollup in list_rollups():
        final = folder / f"{rollup.name}.parquet"
        tmp = folder / f".{rollup.name}.parquet{TMP_SUFFIX}"
        started = time.perf_counter()
        target = str(tmp.resolve()).replace("'", "''")
        con.execute(f"COPY (SELECT * FROM ({rollup.sql}) ORDER BY ALL) TO '{target}' "
                    "(FORMAT parquet, COMPRESSION zstd)")
        with open(tmp, "rb") as fh:  # on disk before the rename makes it visible
            os.fsync(fh.fileno())
        tmp.replace(final)
        n = con.execute(f"SELECT count(*) FROM read_parquet({_literal_path(final)})").fetchone()[0]
        rows.append({"rollup": rollup.name, "rows": n, "bytes": final.stat().st_size,
                     "seconds": round(time.perf_counter() - started, 3)})
    # no seconds in the manifest: it is a DVC-tracked output, and wall-clock would change its hash
    kept = [{k: v for k, v in r.items() if k != "seconds"} for r in rows]
    write_text_atomic(folder / MANIFEST, json.dumps(
        {"version": VERSION, "fingerprint": stamp, "rollups": kept}, indent=1) + "\n")
    return rows
