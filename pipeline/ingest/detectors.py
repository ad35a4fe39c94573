"""Content detectors: pure functions of a prompt's text, each True when its rule fires (the
filters in `filters.py` wrap them; bench/filter_fp.py measures them on real prompts)."""

from __future__ import annotations

import re
from collections.abc import Iterable

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
