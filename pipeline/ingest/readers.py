"""Readers: each yields Records, one per input row, never raising on bad content; and the
sources of an `--sources` argument (files and saved `datasets` folders, in a stable order)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhf.pipeline.ingest.adapters import adapt
from rlhf.pipeline.ingest.config import IngestConfig, IngestError
from rlhf.pipeline.ingest.record import Record


def _trim(s: str, n: int) -> str:
    return s if len(s) <= n else s[:n] + "…"


_BOM = b"\xef\xbb\xbf"


def read_jsonl(path: Path, name: str, cfg: IngestConfig) -> Iterator[Record]:
    """One Record per physical line (bytes), .jsonl or .jsonl.gz; a corrupt archive ends the file
    with one `unreadable` row. A line is read at most `max_line_bytes` at a time: a longer one is
    a `too_long` row without being parsed."""
    opener: Callable[..., Any] = gzip.open if path.name.endswith(".gz") else open
    line_no = 0
    limit = cfg.max_line_bytes
    with opener(path, "rb") as fh:
        while True:
            try:
                raw = fh.readline(limit + 1)
                overlong = len(raw) > limit and not raw.endswith(b"\n")
                rest = raw
                while rest and not rest.endswith(b"\n") and len(rest) > limit:
                    rest = fh.readline(limit + 1)  # drop the rest of the line, piece by piece
            except (OSError, EOFError, gzip.BadGzipFile) as exc:
                yield Record(name, line_no + 1, f"unreadable: {exc}", ["unreadable"])
                return
            if not raw:
                return
            line_no += 1
            if line_no == 1 and raw.startswith(_BOM):
                raw = raw[len(_BOM):]
            if overlong:
                head = raw[: cfg.raw_max_chars].decode("utf-8", "backslashreplace")
                yield Record(name, line_no, head[: cfg.raw_max_chars] + "…", ["too_long"])
                continue
            body = raw.rstrip(b"\r\n")
            if not body.strip(b" \t\r\n\f\v"):
                yield Record(name, line_no, "", blank=True)
                continue
            try:
                line = body.decode("utf-8")
            except UnicodeDecodeError:
                yield Record(name, line_no,
                             _trim(body.decode("utf-8", "backslashreplace"), cfg.raw_max_chars),
                             ["invalid_utf8"])
                continue
            rec = Record(name, line_no, _trim(line, cfg.raw_max_chars))
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):
                rec.reject("bad_json")
                yield rec
                continue
            adapt(rec, obj, cfg)
            yield rec


def _raw_of(row: dict[str, Any], n: int) -> str:
    return _trim(json.dumps(row, default=str, ensure_ascii=True), n)


def _read_rows(rows: Iterable[dict[str, Any]], name: str, cfg: IngestConfig,
               start: int = 1) -> Iterator[Record]:
    for i, row in enumerate(rows, start):
        rec = Record(name, i, _raw_of(row, cfg.raw_max_chars))
        # columnar formats give every row every column; a null column is an absent field
        adapt(rec, {k: v for k, v in row.items() if v is not None}, cfg)
        yield rec


def read_parquet(path: Path, name: str, cfg: IngestConfig) -> Iterator[Record]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    line = 0
    try:
        pf = pq.ParquetFile(path)
        for batch in pf.iter_batches(batch_size=cfg.batch_rows):
            rows = batch.to_pylist()
            yield from _read_rows(rows, name, cfg, line + 1)
            line += len(rows)
    except (OSError, pa.ArrowException) as exc:
        yield Record(name, line + 1, f"unreadable: {exc}", ["unreadable"])


def read_hf_dataset(path: Path, name: str, cfg: IngestConfig) -> Iterator[Record]:
    """A folder saved by `datasets.save_to_disk` (memory-mapped; iterated batch by batch)."""
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except (OSError, ValueError, FileNotFoundError) as exc:
        yield Record(name, 1, f"unreadable: {exc}", ["unreadable"])
        return
    parts = loaded.items() if isinstance(loaded, datasets.DatasetDict) else [(None, loaded)]
    for split, ds in parts:
        split_name = f"{name}/{split}" if split else name
        line = 0
        for batch in ds.iter(batch_size=cfg.batch_rows):
            keys = list(batch)
            n = len(batch[keys[0]]) if keys else 0
            rows = [{k: batch[k][i] for k in keys} for i in range(n)]
            yield from _read_rows(rows, split_name, cfg, line + 1)
            line += n


def _is_hf_dataset(path: Path) -> bool:
    return path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file())


def _kind(path: Path) -> str | None:
    if _is_hf_dataset(path):
        return "datasets"
    if path.is_file():
        if path.name.endswith((".jsonl", ".jsonl.gz", ".ndjson")):
            return "jsonl"
        if path.name.endswith(".parquet"):
            return "parquet"
    return None


@dataclass(frozen=True)
class Source:
    path: Path
    name: str  # recorded as source_file: relative to the parent of the --sources argument
    kind: str


def collect_sources(paths: Iterable[str | Path]) -> tuple[list[Source], list[str]]:
    """Source files (and saved dataset folders) under the given paths, in a stable order; the
    second list names files skipped for an unknown format."""
    sources: list[Source] = []
    skipped: list[str] = []
    for arg in paths:
        arg = Path(arg)
        if not arg.exists():
            raise IngestError(f"source path not found: {arg}")
        base = arg.resolve().parent
        if arg.is_file() or _is_hf_dataset(arg):
            kind = _kind(arg)
            if kind is None:
                raise IngestError(f"{arg}: unknown source format (expected .jsonl, .jsonl.gz, "
                                  ".parquet or a saved `datasets` folder)")
            sources.append(Source(arg, arg.resolve().relative_to(base).as_posix(), kind))
            continue
        stack = [arg]
        found: list[Path] = []
        while stack:
            d = stack.pop()
            for child in sorted(d.iterdir()):
                if child.name.startswith("."):
                    continue
                if _is_hf_dataset(child) or child.is_file():
                    found.append(child)
                elif child.is_dir():
                    stack.append(child)
        for child in sorted(found):
            kind = _kind(child)
            name = child.resolve().relative_to(base).as_posix()
            if kind is None:
                skipped.append(name)
            else:
                sources.append(Source(child, name, kind))
    if not sources:
        raise IngestError("no source files found (expected .jsonl, .jsonl.gz, .parquet or a "
                          "saved `datasets` folder)")
    names = [s.name for s in sources]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise IngestError(f"two sources would be recorded under the same name: {sorted(dup)}")
    return sources, skipped


READERS = {"jsonl": read_jsonl, "parquet": read_parquet, "datasets": read_hf_dataset}


def iter_records(sources: Iterable[Source], cfg: IngestConfig) -> Iterator[Record]:
    for src in sources:
        yield from READERS[src.kind](src.path, src.name, cfg)
