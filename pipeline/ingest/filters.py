"""Content filters (seed 000 §4.2: empty, over-long, URL, e-mail, phone number, code block, control
characters), one class each, on datatrove's contract: a filter has a `name` and its `filter(rec)`
returns True to keep the record, or (False, reason) to drop it with a reason code of
`REASON_CODES` (a bare False drops it with the filter's name).

Unlike a datatrove pipeline, a dropped record still meets the later filters: the quarantine lists
every reason that applied. The one exception is a filter that `stops` (empty: there is nothing left
to judge). `build_filters(cfg)` is the chain the stage runs, in the order the reasons are recorded;
a filter switched off in params.yaml is not in it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from rlhf.pipeline.ingest.config import IngestConfig, IngestError
from rlhf.pipeline.ingest.detectors import (
    _bare_domain_re,
    has_code_block,
    has_control_char,
    has_email,
    has_phone,
    has_url,
    is_blank,
    regex_token_count,
)
from rlhf.pipeline.ingest.record import Record

Verdict = bool | tuple[bool, str]  # True: keep; (False, reason) or False: drop


class Filter(ABC):
    """One rule over a record's text (`rec.text`, never None here)."""

    name: ClassVar[str]
    stops: ClassVar[bool] = False  # a record it drops meets no later filter

    @abstractmethod
    def filter(self, rec: Record) -> Verdict:
        """True to keep `rec`, (False, reason) to drop it."""

    def filter_batch(self, batch: Sequence[Record]) -> list[Verdict]:
        """The verdicts of a batch (a filter that works better on many records at once, such as
        a tokenizer's, overrides this)."""
        return [self.filter(rec) for rec in batch]

    def drop_reason(self, verdict: Verdict) -> str | None:
        """None when `verdict` keeps the record, else the reason it was dropped for."""
        if isinstance(verdict, tuple):
            keep, reason = verdict
            return None if keep else reason
        return None if verdict else self.name


class TokenCounter:
    """Token counts with the world's tokenizer when a path is given, else the regex count."""

    def __init__(self, tokenizer_path: str | Path | None = None):
        self.name = "regex (word / CJK character / punctuation mark)"
        self._tok = None
        if tokenizer_path is not None:
            from transformers import AutoTokenizer

            path = Path(tokenizer_path)
            if not path.exists():
                raise IngestError(f"tokenizer not found: {path}")
            try:
                self._tok = AutoTokenizer.from_pretrained(str(path))
            except (OSError, ValueError) as exc:
                raise IngestError(f"cannot load tokenizer {path}: {exc}") from None
            self._tok.model_max_length = 10**30  # we count tokens; the model never sees them
            self.name = f"{type(self._tok).__name__} from {path}"

    def __call__(self, texts: list[str]) -> list[int]:
        if self._tok is None:
            return [regex_token_count(t) for t in texts]
        if not texts:
            return []
        ids = self._tok(texts, add_special_tokens=False)["input_ids"]
        return [len(x) for x in ids]


class EmptyFilter(Filter):
    """Drops a prompt that is empty, whitespace or zero-width characters only."""

    name = "empty"
    stops = True

    def filter(self, rec: Record) -> Verdict:
        return (False, "empty") if is_blank(rec.text) else True


class LengthFilter(Filter):
    """Drops a prompt of more than `max_chars` characters (never tokenized: a 5,000,000-character
    prompt without spaces is one regex token) or more than `max_tokens` tokens; sets
    `rec.n_tokens` on every record it tokenizes."""

    name = "too_long"

    def __init__(self, max_chars: int, max_tokens: int, count_tokens: TokenCounter):
        self.max_chars = max_chars
        self.max_tokens = max_tokens
        self.count_tokens = count_tokens

    def filter(self, rec: Record) -> Verdict:
        return self.filter_batch([rec])[0]

    def filter_batch(self, batch: Sequence[Record]) -> list[Verdict]:
        verdicts: list[Verdict] = [True] * len(batch)
        countable = []
        for i, rec in enumerate(batch):
            if len(rec.text) > self.max_chars:
                verdicts[i] = (False, "too_long")
            else:
                countable.append(i)
        counts = self.count_tokens([batch[i].text for i in countable])
        for i, n in zip(countable, counts):
            batch[i].n_tokens = n
            if n > self.max_tokens:
                verdicts[i] = (False, "too_long")
        return verdicts


class ControlCharFilter(Filter):
    """Drops a prompt holding a control character (tab, LF and CR are text)."""

    name = "control_char"

    def filter(self, rec: Record) -> Verdict:
        return (False, "control_char") if has_control_char(rec.text) else True


class UrlFilter(Filter):
    """Drops a prompt holding a URL: a scheme or www. link, or a bare domain of `bare_tlds`."""

    name = "url"

    def __init__(self, bare_tlds: Sequence[str] = ()):
        self.bare_domain_re = _bare_domain_re(bare_tlds) if bare_tlds else None

    def filter(self, rec: Record) -> Verdict:
        return (False, "url") if has_url(rec.text, self.bare_domain_re) else True


class EmailFilter(Filter):
    """Drops a prompt holding an e-mail address."""

    name = "email"

    def filter(self, rec: Record) -> Verdict:
        return (False, "email") if has_email(rec.text) else True


class PhoneFilter(Filter):
    """Drops a prompt holding a phone number (`detectors.has_phone`: quantities, dates and ranges
    are not phone numbers)."""

    name = "phone"

    def __init__(self, min_digits: int = 9, intl_min_digits: int = 8, max_digits: int = 15):
        self.min_digits = min_digits
        self.intl_min_digits = intl_min_digits
        self.max_digits = max_digits

    def filter(self, rec: Record) -> Verdict:
        hit = has_phone(rec.text, self.min_digits, self.intl_min_digits, self.max_digits)
        return (False, "phone") if hit else True


class CodeBlockFilter(Filter):
    """Drops a prompt holding a fenced code block or `indented_min_lines` indented code lines."""

    name = "code_block"

    def __init__(self, indented_min_lines: int = 2):
        self.indented_min_lines = indented_min_lines

    def filter(self, rec: Record) -> Verdict:
        return (False, "code_block") if has_code_block(rec.text, self.indented_min_lines) else True


def build_filters(cfg: IngestConfig, count_tokens: TokenCounter) -> list[Filter]:
    """The chain of `cfg`, in the order reasons are recorded; empty and length always run."""
    chain: list[Filter] = [EmptyFilter(), LengthFilter(cfg.max_chars, cfg.max_tokens, count_tokens)]
    if cfg.filter_control_chars:
        chain.append(ControlCharFilter())
    if cfg.filter_url:
        chain.append(UrlFilter(cfg.url_bare_tlds))
    if cfg.filter_email:
        chain.append(EmailFilter())
    if cfg.filter_phone:
        chain.append(PhoneFilter(cfg.phone_min_digits, cfg.phone_intl_min_digits,
                                 cfg.phone_max_digits))
    if cfg.filter_code_block:
        chain.append(CodeBlockFilter(cfg.indented_code_min_lines))
    return chain


def apply_filters(filters: Sequence[Filter], batch: Sequence[Record]) -> None:
    """Run the chain over the records of `batch` that have a text, each filter on the whole batch
    at once; every drop adds its reason to the record (`Record.reject`)."""
    live = [rec for rec in batch if rec.text is not None]
    for filt in filters:
        verdicts = filt.filter_batch(live)
        survivors = []
        for rec, verdict in zip(live, verdicts):
            reason = filt.drop_reason(verdict)
            if reason is not None:
                rec.reject(reason)
            if reason is None or not filt.stops:
                survivors.append(rec)
        live = survivors
