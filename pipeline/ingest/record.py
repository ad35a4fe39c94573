"""A Record: one input row as a reader yields it, the adapters fill it in and the filters judge it."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from rlhf.store.schemas import REASON_CODES


@dataclass
class Record:
    source_file: str
    source_line: int
    raw: str
    reasons: list[str] = field(default_factory=list)
    text: str | None = None  # as read; set only when it is a decodable string (stored stripped)
    source_type: str | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    created_at: dt.datetime | None = None
    pairs: list[dict[str, Any]] = field(default_factory=list)
    pairs_skipped: int = 0  # pairs the adapter could not align (histories differ)
    n_tokens: int = 0
    blank: bool = False  # a blank JSONL line: no row at all, counted as skipped

    def reject(self, code: str) -> None:
        assert code in REASON_CODES, code
        if code not in self.reasons:
            self.reasons.append(code)
