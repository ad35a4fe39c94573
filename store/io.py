"""Atomic parquet shards: the only way the pipeline writes a table.

A shard is written to a hidden temporary file in its final folder, fsynced, then renamed into
place, and the folder is fsynced, so a crash never leaves a partial shard visible: readers glob
`*.parquet` and never see `.*.tmp` files. `ShardWriter` streams rows into numbered shards.

    python -c "from rlhf.store.io import read_table; print(read_table('prompts', 'artifacts/store/prompts'))"
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rlhf.store.hashing import keys_for
from rlhf.store.schemas import schema_for

TMP_SUFFIX = ".tmp"


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def to_arrow(table: str, rows: pa.Table | Iterable[Mapping[str, Any]]) -> pa.Table:
    """Rows (dicts or an Arrow table) as an Arrow table of `table`'s schema, columns in order.

    In a table with `prompt_id` and `prompt_key` columns, `prompt_key` is derived here from
    `prompt_id` (store.hashing.prompt_key), so every writer stores the same key; a row that
    brings its own must bring that value.

    Raises ValueError naming the table when a column is missing, extra, or of the wrong type.
    """
    schema = schema_for(table)
    keyed = "prompt_key" in schema.names and "prompt_id" in schema.names
    try:
        rows = rows if isinstance(rows, pa.Table) else list(rows)
        names = rows.column_names if isinstance(rows, pa.Table) else {k for r in rows for k in r}
        extra = set(names) - set(schema.names)
        if extra:
            raise ValueError(f"unexpected columns {sorted(extra)}")
        data = rows
        if not isinstance(rows, pa.Table):
            fields = [f for f in schema if f.name in names or not (keyed and f.name == "prompt_key")]
            data = pa.Table.from_pylist(rows, schema=pa.schema(fields))
        if keyed:
            data = _with_prompt_key(data)
        data = data.select(schema.names)
        if isinstance(rows, pa.Table):
            return data.cast(schema)  # also checks nullability
        # dict rows are typed by the schema already (a missing nullable=False field stays null,
        # as it always has for dict rows)
        return pa.Table.from_arrays(data.columns, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError, ValueError) as exc:
        raise ValueError(f"rows do not fit table {table!r}: {exc}") from exc


def _with_prompt_key(data: pa.Table) -> pa.Table:
    """`data` with its `prompt_key` column derived from `prompt_id` (checked if present)."""
    if "prompt_id" not in data.column_names:
        raise KeyError("prompt_id")  # reported as a missing column, like any other
    ids = data["prompt_id"].cast(pa.string())
    keys = keys_for(ids)
    if "prompt_key" not in data.column_names:
        return data.append_column("prompt_key", keys)
    given = data["prompt_key"].cast(pa.int64()).combine_chunks()
    if not given.equals(keys):
        bad = pc.index(pc.equal(given, keys).fill_null(False), False).as_py()
        raise ValueError(f"prompt_key of row {bad} is not store.hashing.prompt_key(prompt_id) "
                         "(leave the column out and the store derives it)")
    return data


def write_shard(table: str, rows: pa.Table | Iterable[Mapping[str, Any]], path: str | Path,
                **parquet_options: Any) -> Path:
    """Write one shard atomically (temp file in the same folder, fsync, rename, fsync folder).

    `parquet_options` go to `pyarrow.parquet.write_table` (e.g. `row_group_size`: smaller groups
    let readers skip more by their min/max statistics, which the rollout store relies on).
    """
    path = Path(path)
    data = to_arrow(table, rows)
    return _write_atomic(path, lambda fh: pq.write_table(
        data, fh, **{"compression": "zstd", **parquet_options}))


def _write_atomic(path: Path, write: Callable[[BinaryIO], Any]) -> Path:
    """`write(fh)` into a hidden temporary file beside `path`, fsync, rename, fsync the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}{TMP_SUFFIX}")
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def remove_partials(directory: str | Path) -> int:
    """Delete temporary files a killed writer left behind; returns how many it removed."""
    directory = Path(directory)
    if not directory.is_dir():
        return 0
    leftovers = list(directory.glob(f".*{TMP_SUFFIX}"))
    for p in leftovers:
        p.unlink(missing_ok=True)
    return len(leftovers)


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write a small text file (a metrics JSON) so that it is either the old or the new one,
    never half written: temporary file in the same folder, fsync, rename, fsync of the folder."""
    path = Path(path)
    remove_dead_partials(path.parent)  # a killed run's half-written copy (never visible)
    return _write_atomic(path, lambda fh: fh.write(text.encode("utf-8")))


# Whole folders (a table, a model) are written into hidden staging siblings and swapped in at the
# end. Several folders are swapped together under a journal, `.swap-<pid>.json` beside the first:
# written only once every staging folder is complete, removed once every swap is done. A run
# killed before the journal leaves only hidden staging folders (the previous outputs whole); one
# killed during the swaps leaves each folder whole, old or new, and the next run that stages
# folders there completes those swaps first (`recover_swaps`). Leftovers of dead processes are
# removed then too.

_STAGING = ".staging-"
_OLD = ".old-"
_JOURNAL = ".swap-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pid_of(name: str, marker: str) -> int | None:
    tail = name.rsplit(marker, 1)[-1].split(".", 1)[0]
    return int(tail) if marker in name and tail.isdigit() else None


def staging_dir(final: str | Path) -> Path:
    """A hidden, empty sibling folder to write a whole folder into before `swap_in`."""
    final = Path(final)
    staging = final.with_name(f".{final.name}{_STAGING}{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    return staging


def swap_in(staging: str | Path, final: str | Path) -> None:
    """Replace folder `final` by the fully written `staging` folder (two renames), so a failed
    run leaves the previous folder whole and a rerun never appends to stale shards."""
    staging, final = Path(staging), Path(final)
    staging.mkdir(parents=True, exist_ok=True)
    if final.exists():
        old = final.with_name(f".{final.name}{_OLD}{_pid_of(staging.name, _STAGING) or os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
        staging.rename(final)
        shutil.rmtree(old)
    else:
        final.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(final)
    _fsync_dir(final.parent)


def _finish(journal: Path) -> None:
    """Complete the swaps a journal lists (each: staging -> final, or already done), then drop it."""
    for staging, final in json.loads(journal.read_text(encoding="utf-8")):
        staging, final = Path(staging), Path(final)
        if staging.is_dir():
            swap_in(staging, final)
        old = final.with_name(f".{final.name}{_OLD}{_pid_of(staging.name, _STAGING)}")
        shutil.rmtree(old, ignore_errors=True)  # killed after the swap, before its cleanup
    journal.unlink(missing_ok=True)
    _fsync_dir(journal.parent)


def recover_swaps(folders: Iterable[str | Path]) -> int:
    """Before staging `folders`: finish the swaps that a killed run's journal lists beside them
    and remove the staging / old folders and temporary files of dead processes. Returns how many
    journals it finished."""
    finished = 0
    parents = {Path(f).parent for f in folders}
    for parent in parents:
        if not parent.is_dir():
            continue
        for journal in sorted(parent.glob(f"{_JOURNAL}*.json")):
            pid = _pid_of(journal.name, _JOURNAL)
            if pid is not None and pid != os.getpid() and not _pid_alive(pid):
                _finish(journal)
                finished += 1
    for parent in parents:
        if not parent.is_dir():
            continue
        live_journals = {_pid_of(j.name, _JOURNAL) for j in parent.glob(f"{_JOURNAL}*.json")}
        for child in parent.iterdir():
            if not child.name.startswith("."):
                continue
            for marker in (_STAGING, _OLD):
                pid = _pid_of(child.name, marker)
                if (pid is not None and pid != os.getpid() and pid not in live_journals
                        and not _pid_alive(pid)):
                    shutil.rmtree(child, ignore_errors=True)
        remove_dead_partials(parent)
    return finished


def remove_dead_partials(directory: str | Path) -> int:
    """Delete the temporary files (`.<name>.<pid>.tmp`) that killed processes left in
    `directory`; those of live writers stay. Returns how many it removed."""
    directory = Path(directory)
    if not directory.is_dir():
        return 0
    removed = 0
    for p in directory.glob(f".*{TMP_SUFFIX}"):
        pid = _pid_of(p.name[: -len(TMP_SUFFIX)], ".")
        if pid is not None and pid != os.getpid() and not _pid_alive(pid):
            p.unlink(missing_ok=True)
            removed += 1
    return removed


@contextmanager
def staged_folders(finals: Iterable[str | Path]) -> Iterator[dict[Path, Path]]:
    """Write whole folders into hidden staging siblings, then swap them all in under a journal;
    on failure remove the staging folders (the previous folders stay whole).

    Yields {final folder: staging folder}. Used for store tables (`staged_tables`) and for model
    folders (the reward stage's rm_strong and rm_light).
    """
    finals = [Path(f) for f in finals]
    recover_swaps(finals)
    staging = {f: staging_dir(f) for f in finals}
    for path in staging.values():
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        yield staging
    except BaseException:
        for path in staging.values():
            shutil.rmtree(path, ignore_errors=True)
        raise
    for path in staging.values():
        path.mkdir(parents=True, exist_ok=True)
    if not finals:
        return
    journal = finals[0].with_name(f"{_JOURNAL}{os.getpid()}.json")
    write_text_atomic(journal, json.dumps([[str(s.resolve()), str(f.resolve())]
                                           for f, s in staging.items()]))
    _finish(journal)


@contextmanager
def staged_tables(store: str | Path, tables: Iterable[str]) -> Iterator[dict[str, Path]]:
    """Write whole tables into staging folders, then swap them all in; on failure remove them.

    Yields {table: staging folder}. Stages that replace their tables (ingest, dedup) use it so a
    failed run leaves the previous tables whole and a rerun never appends to stale shards.
    """
    store = Path(store)
    store.mkdir(parents=True, exist_ok=True)
    tables = list(tables)
    with staged_folders([store / t for t in tables]) as staging:
        yield {t: staging[store / t] for t in tables}


def shard_paths(directory: str | Path) -> list[Path]:
    """The visible shards of a table folder, in name order (recursing into partition folders)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.rglob("*.parquet") if not p.name.startswith("."))


def read_table(table: str, directory: str | Path) -> pa.Table:
    """All shards of a table folder as one Arrow table (empty, with the schema, if none)."""
    schema = schema_for(table)
    paths = shard_paths(directory)
    if not paths:
        return schema.empty_table()
    return pa.concat_tables([pq.read_table(p, schema=schema) for p in paths])


def read_dataset(table: str, directory: str | Path):
    """All shards of a table folder as a `datasets.Dataset` (what the training stages read)."""
    import datasets

    return datasets.Dataset(read_table(table, directory))


class ShardWriter:
    """Streams rows into numbered shards `part-00000.parquet`, `part-00001.parquet`, ...

    Each flush is one atomic shard, so a killed writer loses at most the rows still buffered,
    and `next_index` lets a resumed run continue the numbering without overwriting.
    """

    def __init__(self, table: str, directory: str | Path, rows_per_shard: int = 100_000,
                 prefix: str = "part"):
        self.table = table
        self.directory = Path(directory)
        self.rows_per_shard = rows_per_shard
        self.prefix = prefix
        self._buffer: list[Mapping[str, Any]] = []
        remove_dead_partials(self.directory)  # what a killed writer left (never visible)
        self.index = self.next_index()
        self.rows_written = 0
        self.paths: list[Path] = []

    def next_index(self) -> int:
        existing = [p for p in shard_paths(self.directory) if p.name.startswith(self.prefix + "-")]
        return len(existing)

    def write(self, row: Mapping[str, Any]) -> None:
        self._buffer.append(row)
        if len(self._buffer) >= self.rows_per_shard:
            self.flush()

    def extend(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for row in rows:
            self.write(row)

    def flush(self) -> Path | None:
        if not self._buffer:
            return None
        path = self.directory / f"{self.prefix}-{self.index:05d}.parquet"
        write_shard(self.table, self._buffer, path)
        self.rows_written += len(self._buffer)
        self._buffer = []
        self.index += 1
        self.paths.append(path)
        return path

    def close(self) -> list[Path]:
        """Flush the remainder; a table that got no rows still gets one empty shard."""
        if not self.paths and not self._buffer:
            path = self.directory / f"{self.prefix}-{self.index:05d}.parquet"
            write_shard(self.table, [], path)
            self.paths.append(path)
            return self.paths
        self.flush()
        return self.paths

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
