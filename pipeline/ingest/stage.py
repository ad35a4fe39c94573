"""The stage: read every source, judge each batch with the filters, write `prompts` (kept),
`rejected` (the quarantine) and `external_pairs`, and count so that input = kept + rejected +
skipped."""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlhf.pipeline.ingest.config import IngestConfig
from rlhf.pipeline.ingest.filters import Filter, TokenCounter, apply_filters, build_filters
from rlhf.pipeline.ingest.readers import collect_sources, iter_records
from rlhf.pipeline.ingest.record import Record
from rlhf.store.hashing import content_hash
from rlhf.store.io import ShardWriter, staged_tables
from rlhf.store.schemas import REASON_CODES

TABLES_WRITTEN = ("prompts", "rejected", "external_pairs")


@dataclass
class IngestResult:
    input_rows: int = 0  # every row read, blank JSONL lines included
    kept: int = 0
    rejected: int = 0
    skipped: int = 0  # blank JSONL lines: no row, so neither kept nor rejected
    by_reason: Counter = field(default_factory=Counter)
    by_file: dict[str, dict[str, int]] = field(default_factory=dict)
    external_pairs: int = 0
    external_pairs_skipped: int = 0
    skipped_files: list[str] = field(default_factory=list)
    tokenizer: str = ""

    @property
    def adds_up(self) -> bool:
        return self.input_rows == self.kept + self.rejected + self.skipped

    def metrics(self) -> dict[str, Any]:
        return {
            "input_rows": self.input_rows, "kept": self.kept, "rejected": self.rejected,
            "skipped_blank_lines": self.skipped, "invariant_holds": self.adds_up,
            "by_reason": {code: self.by_reason.get(code, 0) for code in REASON_CODES},
            "by_file": self.by_file, "external_pairs": self.external_pairs,
            "external_pairs_skipped": self.external_pairs_skipped,
            "skipped_files": self.skipped_files, "tokenizer": self.tokenizer,
        }


def _json_default(value: Any) -> str:
    return value.isoformat() if isinstance(value, (dt.date, dt.datetime)) else str(value)


def _provenance_json(prov: dict[str, Any]) -> str:
    return json.dumps(prov, sort_keys=True, ensure_ascii=True, default=_json_default)


def run_ingest(sources: list[str | Path], out_store: str | Path, cfg: IngestConfig,
               tokenizer: str | Path | None = None,
               on_progress: Callable[[int], None] | None = None) -> IngestResult:
    """Read every source, write `prompts`, `rejected` and `external_pairs` under `out_store`.

    Each table is written to a hidden staging folder and swapped in at the end, so a failed run
    leaves the previous tables untouched.
    """
    out_store = Path(out_store)
    srcs, skipped = collect_sources(sources)
    count_tokens = TokenCounter(tokenizer)
    filters = build_filters(cfg, count_tokens)
    result = IngestResult(skipped_files=skipped, tokenizer=count_tokens.name)
    with staged_tables(out_store, TABLES_WRITTEN) as staging:
        writers = {t: ShardWriter(t, staging[t], rows_per_shard=cfg.rows_per_shard)
                   for t in TABLES_WRITTEN}
        batch: list[Record] = []
        for rec in iter_records(srcs, cfg):
            batch.append(rec)
            if len(batch) >= cfg.batch_rows:
                _flush(batch, filters, writers, result)
                if on_progress:
                    on_progress(len(batch))
                batch = []
        _flush(batch, filters, writers, result)
        if on_progress:
            on_progress(len(batch))
        for w in writers.values():
            w.close()
    if not result.adds_up:  # cannot happen; checked all the same
        raise AssertionError(f"ingest lost rows: {result.input_rows} != {result.kept} + "
                             f"{result.rejected} + {result.skipped}")
    return result


def _flush(batch: list[Record], filters: list[Filter], writers: dict[str, ShardWriter],
           result: IngestResult) -> None:
    apply_filters(filters, batch)
    for rec in batch:
        result.input_rows += 1
        per_file = result.by_file.setdefault(rec.source_file, {"input": 0, "kept": 0, "rejected": 0,
                                                               "skipped": 0})
        per_file["input"] += 1
        if rec.blank:
            result.skipped += 1
            per_file["skipped"] += 1
            continue
        text = rec.text.strip() if rec.text is not None else None
        prompt_id = content_hash(text) if text is not None else None
        if rec.reasons:
            result.rejected += 1
            per_file["rejected"] += 1
            result.by_reason.update(rec.reasons)
            writers["rejected"].write({
                "source_file": rec.source_file, "source_line": rec.source_line,
                "source_type": rec.source_type, "reasons": list(rec.reasons),
                "prompt_id": prompt_id, "raw": rec.raw})
            continue
        result.kept += 1
        per_file["kept"] += 1
        writers["prompts"].write({
            "prompt_id": prompt_id, "text": text, "source_type": rec.source_type,
            "source_file": rec.source_file, "source_line": rec.source_line,
            "provenance": _provenance_json(rec.provenance), "created_at": rec.created_at,
            "n_tokens": rec.n_tokens})
        result.external_pairs_skipped += rec.pairs_skipped
        for pair in rec.pairs:
            result.external_pairs += 1
            writers["external_pairs"].write({
                "prompt_id": prompt_id, "source_file": rec.source_file,
                "source_line": rec.source_line, **pair})
