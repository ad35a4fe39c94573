"""Ingest: layer one of the prompt funnel (seed 000 §4.2): source trust, PII/format filters, quarantine.

    rlhf ingest --sources artifacts/world/sources --out-store artifacts/store \
        --tokenizer artifacts/world/tokenizer --metrics artifacts/metrics/ingest.json

Reads prompt sources as streams (JSONL and JSONL.gz line by line as bytes, parquet in record
batches, a saved `datasets` folder batch by batch), so a large input is never loaded whole.
Every input row ends in exactly one of two tables: `prompts` (kept) or `rejected` (the
quarantine, with every reason code that applied and the row's source file and line), except blank
lines of a JSONL file, which hold no row and are counted as skipped. A line that is broken JSON,
invalid UTF-8, longer than `max_line_bytes` or has wrongly typed fields is a quarantine row, never
a crash, so `input rows = kept + rejected + skipped` holds for every run. A UTF-8 byte-order mark
at the start of a file (Windows and spreadsheet exports) is not part of its first row.

Row formats (one adapter per format, chosen per row by its keys):
- the world's sources: {"text", "source_type", <provenance fields of that type>}
  (COMMON.md: human -> writer_id, written_at; user_query -> session_id, timestamp;
  open_dataset -> dataset, preference_score);
- hh-rlhf dialogues {"chosen", "rejected"}: the prompt is the first human turn; the pair goes to
  `external_pairs` for the reward stage;
- OpenAssistant trees {"message_tree_id", "prompt": {..., "replies": [...]}}: the prompt is the
  root; every group of ranked assistant siblings becomes pairs (better rank = chosen);
- MT-bench questions {"question_id", "category", "turns": [...]}: the prompt is the first turn.
The public formats are open datasets: they carry a human preference or curation (hh-rlhf's binary
choice, OpenAssistant's review and ranking, MT-bench's hand-written questions) but no per-row
score, so they get `adapter_preference_score`.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlhf.store.hashing import content_hash
from rlhf.store.io import ShardWriter, staged_tables
from rlhf.store.schemas import REASON_CODES, SOURCE_TYPES

TABLES_WRITTEN = ("prompts", "rejected", "external_pairs")


@dataclass(frozen=True)
class IngestConfig:
    """params.yaml section `ingest:`. Every filter can be switched off; thresholds are here only."""

    # Layer one, source trust (seed 000 §4.2): the provenance fields each trusted type must carry.
    required_provenance: dict[str, list[str]] = field(default_factory=lambda: {
        "human": ["writer_id", "written_at"],
        "user_query": ["session_id", "timestamp"],
        "open_dataset": ["dataset", "preference_score"],
    })
    # Open-dataset rows are kept only when their human preference score is above this (seed 000
    # §4.2: "human preference > 0.8").
    min_preference: float = 0.8
    # hh-rlhf / OpenAssistant rows carry a human preference but no score; they get this one
    # (an OpenAssistant prompt that failed review or was deleted gets 0.0).
    adapter_preference_score: float = 1.0
    # Drop OpenAssistant prompts flagged `synthetic` (written by a model, not a human).
    drop_synthetic: bool = True
    # Content filters (seed 000 §4.2: "URL, e-mail, phone number, code block").
    filter_url: bool = True
    filter_email: bool = True
    filter_phone: bool = True
    filter_code_block: bool = True
    # Bare domains ("example.com") count as URLs only for these top-level domains, so that file
    # names such as "main.py" or "node.js" do not.
    url_bare_tlds: list[str] = field(default_factory=lambda: [
        "com", "org", "net", "edu", "gov", "mil", "int", "io", "co", "ai", "dev", "app", "info",
        "biz", "xyz", "online", "site", "uk", "de", "cn", "fr", "jp", "ru", "eu", "nl", "au"])
    # A phone number has this many digits: international (+...) between phone_intl_min_digits and
    # phone_max_digits (E.164: at most 15); national forms need phone_min_digits.
    phone_min_digits: int = 9
    phone_intl_min_digits: int = 8
    phone_max_digits: int = 15
    # An indented code block is this many consecutive lines indented by 4+ spaces or a tab.
    indented_code_min_lines: int = 2
    # Over-long prompts: more tokens than this (world tokenizer when given, else the regex count).
    max_tokens: int = 256
    # ... or more characters than this, whatever the tokenizer counts (a 5,000,000-character
    # prompt without spaces is one regex token). 4096 is 16 characters per token at 256 tokens;
    # the longest real prompt in ../shared/realdata has 1,654.
    max_chars: int = 4096
    # A JSONL line longer than this many bytes is quarantined as `too_long` unparsed, read in
    # bounded pieces (memory stays bounded). The longest line in ../shared/realdata is 29 kB.
    max_line_bytes: int = 1_048_576
    # Control characters (Unicode category Cc: NUL, ESC, DEL, C1 ...; tab, LF and CR are text)
    # reject a prompt with `control_char` rather than being stripped: they mean binary junk or a
    # broken export, and stripping would change the text silently (and its content hash).
    filter_control_chars: bool = True
    # Rows tokenized and filtered together (memory stays O(batch_rows)).
    batch_rows: int = 2048
    rows_per_shard: int = 100_000
    # The `raw` column of the quarantine keeps this many characters of the offending line.
    raw_max_chars: int = 2000

    def __post_init__(self) -> None:
        unknown = set(self.required_provenance) - set(SOURCE_TYPES)
        if unknown:
            raise ValueError(f"required_provenance: unknown source type(s) {sorted(unknown)}; "
                             f"trusted types are {list(SOURCE_TYPES)}")
        if not 0.0 <= self.min_preference <= 1.0:
            raise ValueError("min_preference must be in [0, 1]")
        if min(self.max_tokens, self.max_chars, self.max_line_bytes, self.batch_rows,
               self.rows_per_shard) < 1:
            raise ValueError("max_tokens, max_chars, max_line_bytes, batch_rows and "
                             "rows_per_shard must be >= 1")
        if not 1 <= self.phone_intl_min_digits <= self.phone_max_digits:
            raise ValueError("need 1 <= phone_intl_min_digits <= phone_max_digits")
        if not 1 <= self.phone_min_digits <= self.phone_max_digits:
            raise ValueError("need 1 <= phone_min_digits <= phone_max_digits")


class IngestError(ValueError):
    """Bad invocation (missing source path, nothing to read): the CLI prints it, no traceback."""


# --------------------------------------------------------------------------------------------
# Content filters: pure functions of the text, each returning True when the rule fires.

EMAIL_RE = re.compile(r"(?<![\w.%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
_URL_SCHEME_RE = re.compile(r"(?i)\b(?:https?|ftp)://[^\s<>\"']+|\bwww\.[\w-]+\.[^\s<>\"']+")
_PHONE_INTL_RE = re.compile(r"(?<![\w+])\+\d[\d ().-]{5,24}\d(?![\w])")
_PHONE_NATIONAL_RE = re.compile(
    r"(?<![\w.+/-])(?:\(\d{2,5}\)[ .-]?|\d{2,5}[ .-])(?:\d{2,4}[ .-]){0,3}\d{2,8}(?![\w/-]|\.\d)")
_NANP_RE = re.compile(r"\d{3}[ .-]\d{3}[ .-]\d{4}")  # 415-555-2671, 415.555.2671
_PHONE_COMPACT_RE = re.compile(
    r"(?<![\w.+-])(?:1[3-9]\d{9}"  # Chinese mobile 13800138000
    r"|0\d{9,10})(?![\w-]|\.\d)")  # national trunk prefix, no separators: 07700900123
# North-American local 555-1234: also how ranges are written ("roughly 700-1000 calories"), so
# it counts only after a phone word ("call 555-1234", "my number is 555-1234").
_PHONE_LOCAL_RE = re.compile(r"(?<![\w.+-])\d{3}-\d{4}(?![\w-]|\.\d)")
_PHONE_CUE_RE = re.compile(
    r"(?i)\b(?:call|calling|phone|tel|telephone|number(?!s?\s+of\b)|dial|text\s+(?:me|us)|sms|"
    r"reach|contact|mobile|cell|fax|ring|whatsapp|ext)\b[^\d\n]{0,24}$")
# A number followed by a unit, or after a currency sign, is a quantity, not a phone number.
_QUANTITY_AFTER_RE = re.compile(
    r"(?i)\s?(?:%|percent\b|per\b|x\b|times\b|k?cal(?:ories)?\b|calories\b|kj\b|[mkµ]?g\b|"
    r"grams?\b|kilos?\b|kilograms?\b|lbs?\b|pounds?\b|oz\b|ounces?\b|[mµk]?l\b|"
    r"lit(?:re|er)s?\b|[mck]?m\b|mi\b|miles?\b|met(?:re|er)s?\b|feet\b|ft\b|inch(?:es)?\b|"
    r"words?\b|pages?\b|characters?\b|tokens?\b|people\b|persons?\b|users?\b|steps?\b|"
    r"years?\b|months?\b|weeks?\b|days?\b|hours?\b|hrs?\b|minutes?\b|mins?\b|seconds?\b|"
    r"secs?\b|dollars?\b|euros?\b|yen\b|yuan\b|rupees?\b|usd\b|eur\b|gbp\b|points?\b|"
    r"rpm\b|mph\b|km/h\b|kph\b|bce?\b|ad\b|ce\b|bytes?\b|[kmgt]i?b\b|hz\b|[kmg]hz\b|"
    r"volts?\b|v\b|watts?\b|w\b|kwh?\b|degrees?\b|°)")
_CURRENCY_BEFORE = "$€£¥₹"
_FENCE_RE = re.compile(r"```|(?:^|\n)[ \t]{0,3}~~~")
_INDENTED_RE = re.compile(r"^(?: {4,}|\t)\S")
_CODE_LINE_RE = re.compile(r"[=(){}\[\];<>]|:\s*$")
_ZERO_WIDTH = "\u200b\u200c\u200d\u2060\ufeff"
# Regex token count when no tokenizer is given: a word, one CJK character, or one punctuation mark.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af"
TOKEN_RE = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+|[^\w\s]")


def has_email(text: str) -> bool:
    return EMAIL_RE.search(text) is not None


def _bare_domain_re(tlds: Iterable[str]) -> re.Pattern[str]:
    alt = "|".join(sorted((re.escape(t) for t in tlds), key=len, reverse=True))
    return re.compile(rf"(?i)(?<![\w@.-])[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9-]+)*\.(?:{alt})"
                      rf"(?![\w-])(?:/[^\s<>\"']*)?")


def has_url(text: str, bare_domain_re: re.Pattern[str] | None = None) -> bool:
    text = EMAIL_RE.sub(" ", text)  # an e-mail address is not also a URL
    if _URL_SCHEME_RE.search(text):
        return True
    return bool(bare_domain_re and bare_domain_re.search(text))


def _digits(s: str) -> int:
    return sum(ch.isdigit() for ch in s)


def _is_quantity(text: str, start: int, end: int) -> bool:
    """The number at text[start:end] reads as a quantity: a unit follows, a currency sign comes
    before, or it is a round number (5+ trailing zeros: 13000000000 people, 1 000 000 000)."""
    digits = "".join(ch for ch in text[start:end] if ch.isdigit())
    if len(digits) - len(digits.rstrip("0")) >= 5:
        return True
    if start > 0 and text[start - 1] in _CURRENCY_BEFORE:
        return True
    return _QUANTITY_AFTER_RE.match(text, end) is not None


def has_phone(text: str, min_digits: int = 9, intl_min_digits: int = 8, max_digits: int = 15) -> bool:
    """International (+country ...) and common national formats (parentheses, trunk prefix 0,
    North-American 3-3-4, Chinese mobile; 3-4 only after a phone word); dates, times, versions,
    prices, ranges and quantities ("700-1000 calories", "$100-1000") do not fire."""
    text = EMAIL_RE.sub(" ", _URL_SCHEME_RE.sub(" ", text))
    for m in _PHONE_INTL_RE.finditer(text):
        if intl_min_digits <= _digits(m.group()) <= max_digits and not _is_quantity(
                text, m.start(), m.end()):
            return True
    for m in _PHONE_NATIONAL_RE.finditer(text):
        s = m.group()
        n = _digits(s)
        if not min_digits <= n <= max_digits or _is_quantity(text, m.start(), m.end()):
            continue
        if "(" in s or s.startswith("0") or _NANP_RE.fullmatch(s):
            return True
    for m in _PHONE_COMPACT_RE.finditer(text):
        if not _is_quantity(text, m.start(), m.end()):
            return True
    for m in _PHONE_LOCAL_RE.finditer(text):
        if (_PHONE_CUE_RE.search(text, max(0, m.start() - 40), m.start())
                and not _is_quantity(text, m.start(), m.end())):
            return True
    return False


def has_code_block(text: str, indented_min_lines: int = 2) -> bool:
    """A fenced block (``` anywhere, or a ~~~ fence line) or N consecutive indented lines of
    which one looks like code (an operator or bracket, or a line ending in ":"); indented prose
    lists ("    1. Track your progress ...") are not code (9 of the 18 indented runs in the real
    data's turns were such lists, bench/filter_fp.py)."""
    if _FENCE_RE.search(text):
        return True
    run = 0
    code_like = False
    for line in text.splitlines():
        if _INDENTED_RE.match(line):
            run += 1
            code_like = code_like or _CODE_LINE_RE.search(line) is not None
            if run >= indented_min_lines and code_like:
                return True
        else:
            run = 0
            code_like = False
    return False


_CONTROL_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")  # Cc minus \t \n \r


def has_control_char(text: str) -> bool:
    return _CONTROL_RE.search(text) is not None


def is_blank(text: str) -> bool:
    return not text.strip().strip(_ZERO_WIDTH).strip()


def regex_token_count(text: str) -> int:
    return sum(1 for _ in TOKEN_RE.finditer(text))


def is_encodable(text: str) -> bool:
    """False for strings holding lone surrogates (JSON "\\ud800" escapes): not valid UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# --------------------------------------------------------------------------------------------
# Records: what a reader yields and the adapters fill in.

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


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _parse_date(value: str) -> dt.datetime:
    return dt.datetime.combine(dt.date.fromisoformat(value), dt.time(), tzinfo=dt.UTC)


def _parse_timestamp(value: str) -> dt.datetime:
    ts = dt.datetime.fromisoformat(value.replace("Z", "+00:00") if value.endswith("Z") else value)
    if ts.tzinfo is None:  # a naive timestamp is read as UTC (the contract says ISO-8601 UTC)
        ts = ts.replace(tzinfo=dt.UTC)
    return ts.astimezone(dt.UTC)


def _check_provenance(rec: Record, obj: dict[str, Any], cfg: IngestConfig) -> None:
    """Layer one: the source type is trusted and its provenance fields are present and typed."""
    stype = obj.get("source_type")
    if stype is not None and not isinstance(stype, str):
        rec.reject("bad_type")
        return
    if stype not in SOURCE_TYPES:
        rec.reject("unknown_source")
        return
    rec.source_type = stype
    for name in cfg.required_provenance.get(stype, []):
        value = obj.get(name)
        rec.provenance[name] = value
        if _missing(value):
            rec.reject("missing_provenance")
            continue
        if name == "preference_score":
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value)):
                rec.reject("bad_type")
            elif value <= cfg.min_preference:
                rec.reject("low_preference")
            continue
        if name in ("written_at", "timestamp") and isinstance(value, dt.datetime):
            rec.created_at = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
            continue
        if name == "written_at" and isinstance(value, dt.date):
            rec.created_at = _parse_date(value.isoformat())
            continue
        if not isinstance(value, str):
            rec.reject("bad_type")
            continue
        try:
            if name == "written_at":
                rec.created_at = _parse_date(value)
            elif name == "timestamp":
                rec.created_at = _parse_timestamp(value)
        except ValueError:
            rec.reject("bad_type")


def _set_text(rec: Record, text: Any) -> None:
    if not isinstance(text, str):
        rec.reject("bad_type")
    elif not is_encodable(text):
        rec.reject("invalid_utf8")
    else:
        rec.text = text  # filters see it as written (an indented first line is code)


def adapt_generic(rec: Record, obj: dict[str, Any], cfg: IngestConfig) -> None:
    """The world's rows: {"text", "source_type", <provenance fields>}; other keys are kept as
    provenance too."""
    _set_text(rec, obj.get("text"))
    _check_provenance(rec, obj, cfg)
    for key, value in obj.items():
        if key not in ("text", "source_type") and key not in rec.provenance:
            rec.provenance[key] = value


_TURN_RE = re.compile(r"\n\n(Human|Assistant):")


def split_dialogue(dialogue: str) -> list[tuple[str, str]]:
    """An hh-rlhf dialogue as [(role, text)], roles "Human" / "Assistant", texts stripped."""
    parts = _TURN_RE.split(dialogue)
    return [(parts[i], parts[i + 1].strip()) for i in range(1, len(parts) - 1, 2)]


def format_turns(turns: list[tuple[str, str]]) -> str:
    return "".join(f"\n\n{role}: {text}" for role, text in turns)


def adapt_hh_rlhf(rec: Record, obj: dict[str, Any], cfg: IngestConfig) -> None:
    """hh-rlhf {"chosen", "rejected"}: prompt = first human turn; the pair = the two last
    assistant turns after their shared history."""
    rec.source_type = "open_dataset"  # the format says so, even when the row cannot be read
    chosen, rejected = obj.get("chosen"), obj.get("rejected")
    if not isinstance(chosen, str) or not isinstance(rejected, str):
        rec.reject("bad_type")
        return
    if not (is_encodable(chosen) and is_encodable(rejected)):
        rec.reject("invalid_utf8")
        return
    c_turns, r_turns = split_dialogue(chosen), split_dialogue(rejected)
    if not c_turns or c_turns[0][0] != "Human":
        rec.reject("bad_record")
        return
    rec.text = c_turns[0][1]
    rec.source_type = "open_dataset"
    rec.provenance = {"dataset": "hh-rlhf", "preference_score": cfg.adapter_preference_score,
                      "adapter": "hh-rlhf"}
    if cfg.adapter_preference_score <= cfg.min_preference:
        rec.reject("low_preference")
    ok_pair = (len(c_turns) >= 2 and c_turns[-1][0] == "Assistant" and r_turns
               and r_turns[-1][0] == "Assistant" and c_turns[:-1] == r_turns[:-1])
    if ok_pair:
        context = c_turns[:-1]
        rec.pairs.append({
            "source": "hh-rlhf", "context": format_turns(context),
            "n_turns": sum(role == "Human" for role, _ in context),
            "chosen": c_turns[-1][1], "rejected": r_turns[-1][1],
            "chosen_rank": None, "rejected_rank": None})
    else:  # a handful of hh-rlhf rows split the two dialogues at different turns
        rec.pairs_skipped += 1


_OA_ROLE = {"prompter": "Human", "assistant": "Assistant"}


def _oasst_pairs(node: dict[str, Any], path: list[tuple[str, str]], out: list[dict[str, Any]]) -> None:
    role = _OA_ROLE.get(node.get("role"), "Human")
    path = path + [(role, str(node.get("text", "")).strip())]
    replies = [r for r in node.get("replies") or [] if isinstance(r, dict) and not r.get("deleted")]
    ranked = sorted((r for r in replies if r.get("role") == "assistant"
                     and isinstance(r.get("rank"), int) and isinstance(r.get("text"), str)
                     and is_encodable(r["text"])), key=lambda r: r["rank"])
    if role == "Human" and len(ranked) >= 2:
        context = format_turns(path)
        n_turns = sum(r == "Human" for r, _ in path)
        for i, better in enumerate(ranked):
            for worse in ranked[i + 1:]:
                if better["rank"] == worse["rank"]:
                    continue  # a tie is no preference
                out.append({"source": "oasst", "context": context, "n_turns": n_turns,
                            "chosen": better["text"].strip(), "rejected": worse["text"].strip(),
                            "chosen_rank": better["rank"], "rejected_rank": worse["rank"]})
    for reply in replies:
        _oasst_pairs(reply, path, out)


def adapt_oasst(rec: Record, obj: dict[str, Any], cfg: IngestConfig) -> None:
    """OpenAssistant tree: prompt = root text; ranked assistant siblings -> pairs."""
    rec.source_type = "open_dataset"  # the format says so, even when the row cannot be read
    root = obj.get("prompt")
    if not isinstance(root, dict):
        rec.reject("bad_type")
        return
    _set_text(rec, root.get("text"))
    reviewed = root.get("review_result") is not False and not root.get("deleted")
    score = cfg.adapter_preference_score if reviewed else 0.0
    rec.provenance = {"dataset": "oasst", "preference_score": score, "adapter": "oasst",
                      "message_tree_id": obj.get("message_tree_id"),
                      "synthetic": bool(root.get("synthetic"))}
    if score <= cfg.min_preference:
        rec.reject("low_preference")
    if cfg.drop_synthetic and root.get("synthetic"):
        rec.reject("synthetic")
    if rec.text is not None:
        try:
            _oasst_pairs(root, [], rec.pairs)
        except RecursionError:
            rec.pairs.clear()


def adapt_mt_bench(rec: Record, obj: dict[str, Any], cfg: IngestConfig) -> None:
    """MT-bench {"question_id", "category", "turns"}: prompt = the first turn (the second turn
    follows up on a model's answer, so it is no prompt on its own)."""
    rec.source_type = "open_dataset"  # the format says so, even when the row cannot be read
    turns = obj.get("turns")
    if not isinstance(turns, list) or not turns:
        rec.reject("bad_type")
        return
    _set_text(rec, turns[0])
    rec.provenance = {"dataset": "mt-bench", "preference_score": cfg.adapter_preference_score,
                      "adapter": "mt-bench", "question_id": obj.get("question_id"),
                      "category": obj.get("category")}
    if cfg.adapter_preference_score <= cfg.min_preference:
        rec.reject("low_preference")


def adapt(rec: Record, obj: Any, cfg: IngestConfig) -> None:
    if not isinstance(obj, dict):
        rec.reject("bad_json")
    elif "question_id" in obj and "turns" in obj and "text" not in obj:
        adapt_mt_bench(rec, obj, cfg)
    elif "chosen" in obj and "rejected" in obj and "text" not in obj:
        adapt_hh_rlhf(rec, obj, cfg)
    elif "message_tree_id" in obj and isinstance(obj.get("prompt"), dict):
        adapt_oasst(rec, obj, cfg)
    else:
        adapt_generic(rec, obj, cfg)


# --------------------------------------------------------------------------------------------
# Readers: each yields Records, one per input row, never raising on bad content.

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


# --------------------------------------------------------------------------------------------
# Filtering a batch of records.

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


class ContentFilter:
    def __init__(self, cfg: IngestConfig, count_tokens: TokenCounter):
        self.cfg = cfg
        self.count_tokens = count_tokens
        self.bare_domain_re = _bare_domain_re(cfg.url_bare_tlds) if cfg.url_bare_tlds else None

    def __call__(self, batch: list[Record]) -> None:
        cfg = self.cfg
        live = [r for r in batch if r.text is not None]
        for rec in live:
            if is_blank(rec.text):
                rec.reject("empty")
            elif len(rec.text) > cfg.max_chars:
                rec.reject("too_long")  # whatever the tokenizer says; not tokenized at all
        texts = [r for r in live if "empty" not in r.reasons]
        countable = [r for r in texts if "too_long" not in r.reasons]
        for rec, n in zip(countable, self.count_tokens([r.text for r in countable])):
            rec.n_tokens = n
            if n > cfg.max_tokens:
                rec.reject("too_long")
        for rec in texts:
            t = rec.text
            if cfg.filter_control_chars and has_control_char(t):
                rec.reject("control_char")
            if cfg.filter_url and has_url(t, self.bare_domain_re):
                rec.reject("url")
            if cfg.filter_email and has_email(t):
                rec.reject("email")
            if cfg.filter_phone and has_phone(t, cfg.phone_min_digits, cfg.phone_intl_min_digits,
                                              cfg.phone_max_digits):
                rec.reject("phone")
            if cfg.filter_code_block and has_code_block(t, cfg.indented_code_min_lines):
                rec.reject("code_block")


# --------------------------------------------------------------------------------------------
# The stage.

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
    filt = ContentFilter(cfg, count_tokens)
    result = IngestResult(skipped_files=skipped, tokenizer=count_tokens.name)
    with staged_tables(out_store, TABLES_WRITTEN) as staging:
        writers = {t: ShardWriter(t, staging[t], rows_per_shard=cfg.rows_per_shard)
                   for t in TABLES_WRITTEN}
        batch: list[Record] = []
        for rec in iter_records(srcs, cfg):
            batch.append(rec)
            if len(batch) >= cfg.batch_rows:
                _flush(batch, filt, writers, result)
                if on_progress:
                    on_progress(len(batch))
                batch = []
        _flush(batch, filt, writers, result)
        if on_progress:
            on_progress(len(batch))
        for w in writers.values():
            w.close()
    if not result.adds_up:  # cannot happen; checked all the same
        raise AssertionError(f"ingest lost rows: {result.input_rows} != {result.kept} + "
                             f"{result.rejected} + {result.skipped}")
    return result


def _flush(batch: list[Record], filt: ContentFilter, writers: dict[str, ShardWriter],
           result: IngestResult) -> None:
    filt(batch)
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
