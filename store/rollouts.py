"""The rollout store layout: partitioned by run and step bucket, sorted by step, small row groups.

The PPO trainer appends every step's rollouts through `RolloutWriter` (and its RM scores and
training metrics through `StepShardWriter("rm_scores" / "train_metrics", ...)`, which lay them
out the same way):

    <store>/rollouts/run_id=<run>/step_bucket=<k>/part-<first step>-<last step>.parquet

with k = step // steps_per_bucket. The layout is what makes the audits prune and run fast:

- a filter on `run_id` skips whole folders (DuckDB reads the folders as hive partitions);
- every shard is sorted by step and cut into row groups of `row_group_size` rows, so each row
  group covers one contiguous step range and a filter on steps skips row groups by their
  min/max statistics. 524,288 rows a group (a whole shard of `rows_per_shard` 500,000 rows is
  one group): each group repeats the dictionary of the prompts it holds (50k ids of 64
  characters cost ~3 MiB), so at 262,144 rows those pages were ~9 bytes a row per id column, at
  524,288 ~5 (bench/bench_query.py); a step range still prunes to one shard's rows;
- inside each row group, rows of a table with a `prompt_key` (rollouts) are ordered by `tier`,
  then by that key: the audits that group or join all rows by prompt then touch their hash
  tables in runs of the same key (lineage ~15 % and sources ~10 % faster on the 10M-row
  benchmark, and smaller files than in step order), and the Level-2 rows that `rlhf audit rm`
  reads (`tier = 2`) are one block per row group (rm ~15 % less CPU, 0.4 bytes a row more;
  bench/bench_query.py); the row groups' step ranges, and so the step pruning, stay as they were.

A shard always holds whole steps, and its name says which, so a resumed run can drop exactly the
steps it is about to redo (`resume_after`) and never stores a step twice. Each shard is written
atomically (store.io).

    python -c "from rlhf.store.rollouts import RolloutWriter; help(RolloutWriter)"
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rlhf.store.io import to_arrow, write_shard
from rlhf.store.schemas import schema_for

RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# Columns unique per row (a dictionary would only add to them): stored plain.
UNIQUE_COLUMNS = frozenset({"response_key", "prompt_text", "response_text"})
# Prompt ids repeat across a row group (50k distinct 64-character ids take ~3 MiB); pyarrow's
# default 1 MiB dictionary page would fall back to plain strings, doubling the bytes per row and
# the time DuckDB spends decoding and hashing them (bench/bench_query.py).
DICTIONARY_PAGE_LIMIT = 16 << 20
SHARD = re.compile(r"^part-(\d+)-(\d+)\.parquet$")
# The order of rows inside a row group, for a table with these columns (module docstring).
ROW_GROUP_ORDER = ("tier", "prompt_key")


def run_folder(directory: str | Path, run_id: str) -> Path:
    """`<rollouts table folder>/run_id=<run_id>`, after checking the id is a safe folder name."""
    if not RUN_ID.match(run_id):
        raise ValueError(f"run_id {run_id!r} must be letters, digits, '.', '_' or '-' (max 128)")
    return Path(directory) / f"run_id={run_id}"


def run_shards(directory: str | Path, run_id: str) -> list[tuple[int, int, Path]]:
    """(first step, last step, path) of every shard of a run, in step order."""
    found = []
    for path in run_folder(directory, run_id).glob("step_bucket=*/part-*.parquet"):
        m = SHARD.match(path.name)
        if m:
            found.append((int(m.group(1)), int(m.group(2)), path))
    return sorted(found)


class StepShardWriter:
    """Buffers a run's rows of a per-step table and writes sorted, step-bucketed, whole-step shards.

    `table` is any store table with `run_id` and `step` columns (rollouts, rm_scores, ...).

    Rows arrive in step order (a step may come in several batches); a shard is cut when the
    step bucket changes, or when the buffer holds `rows_per_shard` rows and a new step begins.
    Rows of a step that is already on disk are refused, so nothing is stored twice.
    """

    def __init__(self, table: str, directory: str | Path, run_id: str, *,
                 steps_per_bucket: int = 1000,
                 rows_per_shard: int = 500_000, row_group_size: int = 524_288,
                 resume_after: int | None = None):
        if steps_per_bucket < 1 or rows_per_shard < 1 or row_group_size < 1:
            raise ValueError("steps_per_bucket, rows_per_shard and row_group_size must be >= 1")
        if not {"run_id", "step"} <= set(schema_for(table).names):
            raise ValueError(f"table {table!r} has no run_id and step columns")
        self.table = table
        self.directory = Path(directory)
        self.run_id = run_id
        self.folder = run_folder(directory, run_id)
        self.steps_per_bucket = steps_per_bucket
        self.rows_per_shard = rows_per_shard
        self.row_group_size = row_group_size
        if resume_after is not None:
            self._trim_after(resume_after)
        shards = run_shards(directory, run_id)
        self.last_written_step: int | None = shards[-1][1] if shards else None
        self._buffer: list[pa.Table] = []
        self._buffered_rows = 0
        self.rows_written = 0
        self.paths: list[Path] = []

    # Resume -------------------------------------------------------------------------------
    def _trim_after(self, step: int) -> None:
        """Drop the stored steps > `step` (the ones a run resumed from checkpoint `step` redoes).

        Each change is atomic, and re-running it after a crash finishes the job: a shard whose
        name still reaches past `step` is trimmed again (same content, same name).
        """
        for first, last, path in run_shards(self.directory, self.run_id):
            if last <= step:
                continue
            if first <= step:
                # read as the schema is now: a column added since the shard was written
                # (an older version's run, resumed) comes back null, not missing
                kept = pq.read_table(path, schema=schema_for(self.table))
                kept = kept.filter(pc.less_equal(kept["step"], step))
                kept = kept.take(pc.sort_indices(kept["step"]))  # stable
                new_last = pc.max(kept["step"]).as_py()
                write_shard(self.table, self._row_group_order(kept),
                            path.with_name(f"part-{first:09d}-{new_last:09d}.parquet"),
                            **self._parquet_options())
            path.unlink()

    # Writing ------------------------------------------------------------------------------
    def _parquet_options(self) -> dict[str, Any]:
        # Dictionaries for repeated values (ids, names, steps, tiers); not for per-row-unique
        # hashes and texts, nor for floats (rewards, KL), where they only slow decoding. Floats
        # are stored byte-stream-split (their exponent bytes together compress: ~0.2 bytes a
        # row less for each of reward and KL, bench/bench_query.py).
        fields = schema_for(self.table)
        floats = [f.name for f in fields if pa.types.is_floating(f.type)]
        return {"row_group_size": self.row_group_size,
                "use_dictionary": [f.name for f in fields if f.name not in UNIQUE_COLUMNS
                                   and f.name not in floats],
                "use_byte_stream_split": floats or False,
                "dictionary_pagesize_limit": DICTIONARY_PAGE_LIMIT}

    def _row_group_order(self, data: pa.Table) -> pa.Table:
        """Rows sorted by step, each future row group (every `row_group_size` rows, as
        pyarrow cuts them) reordered by `ROW_GROUP_ORDER` when the table has those columns
        (a stable sort: rows of one tier and prompt keep their step order)."""
        if not set(ROW_GROUP_ORDER) <= set(data.column_names):
            return data
        n = self.row_group_size
        keys = [(k, "ascending") for k in ROW_GROUP_ORDER]
        return pa.concat_tables([
            part.take(pc.sort_indices(part, sort_keys=keys))
            for part in (data.slice(lo, n) for lo in range(0, data.num_rows, n))] or [data])

    def _bucket(self, step: int) -> int:
        return step // self.steps_per_bucket

    def _buffer_span(self) -> tuple[int, int] | None:
        if not self._buffer:
            return None
        return (pc.min(self._buffer[0]["step"]).as_py(), pc.max(self._buffer[-1]["step"]).as_py())

    def write(self, rows: pa.Table | Iterable[Mapping[str, Any]]) -> None:
        """Append rows (dicts or an Arrow table of the table's schema) of this run."""
        data = to_arrow(self.table, rows)
        if data.num_rows == 0:
            return
        if pc.any(pc.not_equal(data["run_id"], self.run_id)).as_py():
            raise ValueError(f"rows of another run given to the writer of run {self.run_id!r}")
        data = data.take(pc.sort_indices(data["step"]))  # stable: keeps a step's batch order
        first, last = pc.min(data["step"]).as_py(), pc.max(data["step"]).as_py()
        span = self._buffer_span()
        floor = span[1] if span else None
        if self.last_written_step is not None and first <= self.last_written_step:
            raise ValueError(f"run {self.run_id!r}: step {first} is already stored (last stored "
                             f"step {self.last_written_step}); resume with resume_after=<step>")
        if floor is not None and first < floor:
            raise ValueError(f"run {self.run_id!r}: steps must not go backwards ({first} < {floor})")
        # Split by bucket, so a batch spanning a bucket boundary lands in two folders.
        for bucket in range(self._bucket(first), self._bucket(last) + 1):
            lo, hi = bucket * self.steps_per_bucket, (bucket + 1) * self.steps_per_bucket
            part = data.filter(pc.and_(pc.greater_equal(data["step"], lo), pc.less(data["step"], hi)))
            if part.num_rows:
                self._append(part)

    def _append(self, part: pa.Table) -> None:
        span = self._buffer_span()
        if span is not None:
            new_first = pc.min(part["step"]).as_py()
            if self._bucket(new_first) != self._bucket(span[0]):
                self.flush()
            elif self._buffered_rows >= self.rows_per_shard and new_first > span[1]:
                self.flush()
        self._buffer.append(part)
        self._buffered_rows += part.num_rows

    def flush(self) -> Path | None:
        """Write the buffered steps as one shard; returns its path (None if nothing buffered)."""
        span = self._buffer_span()
        if span is None:
            return None
        first, last = span
        data = self._row_group_order(pa.concat_tables(self._buffer))
        path = (self.folder / f"step_bucket={self._bucket(first)}"
                / f"part-{first:09d}-{last:09d}.parquet")
        write_shard(self.table, data, path, **self._parquet_options())
        self.rows_written += data.num_rows
        self.last_written_step = last
        self._buffer, self._buffered_rows = [], 0
        self.paths.append(path)
        return path

    def close(self) -> list[Path]:
        self.flush()
        return self.paths

    def __enter__(self) -> StepShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()


class RolloutWriter(StepShardWriter):
    """The PPO trainer's writer: `StepShardWriter` for the `rollouts` table.

        with RolloutWriter("artifacts/store/rollouts", run_id="ppo-0001") as w:
            w.write(step_rows)  # each step's rows, steps in order
    """

    def __init__(self, directory: str | Path, run_id: str, **kwargs: Any):
        super().__init__("rollouts", directory, run_id, **kwargs)
