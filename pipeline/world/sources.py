"""Raw prompt sources with planted defects and duplicates, and the truth file that labels them.

Writes the three trusted source types of seed 000 §4.2 as JSONL (human-written prompts with
writer_id and writing date; user queries with session_id and timestamp; open-dataset rows with a
human preference score), one JSON object per line, written as bytes. Mixed in: every defect the
ingest filters must catch, each labelled in truth.jsonl with its REASON_CODES, and clean duplicates
(exact copies and paraphrases, expected []) whose `dup_of` points at the original line.

A clean prompt is a *framed question*: one of the knowledge table's distinct questions wrapped in
a style (plain, polite, for a beginner, step by step, exam context, ...). The first clean row of a
question is its original; every later clean row of the same question is a duplicate of it ("exact"
when the text is identical, else "paraphrase": same question, other framing or light rewording).
Distinct questions are clearly different questions, so semantic dedup can be checked exactly.

    rlhf world generate --seed 0 --out artifacts/world
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

from rlhf.pipeline.world.topics import TOPICS, Topic

FILES = {
    "human": "sources/human.jsonl",
    "user_query": "sources/user_queries.jsonl",
    "open_dataset": "sources/open_dataset.jsonl",
}

# Wrappers around a question. Each keeps the question itself intact, so two framings of one
# question stay near-duplicates (MiniLM cosine distance ~0.05-0.2) while different questions
# are far apart (> 0.35, seed 000 §4.2).
FRAMES: tuple[str, ...] = (
    "{q}",
    "{q} Please keep it short.",
    "{q} Explain it for a beginner.",
    "{q} Answer in two or three sentences.",
    "Quick question: {q}",
    "I'm studying for an exam. {q}",
    "{q} Give me the key facts.",
    "My friend asked me this and I was not sure. {q}",
    "{q} Explain it step by step.",
    "For a presentation at work: {q}",
    "{q} I would like a clear, simple answer.",
    "Hi! {q} Thanks.",
    "{q} Please explain it to a ten-year-old.",
    "Can you help me understand something? {q}",
    "I have always wondered about this. {q}",
    "{q} Be precise and avoid jargon.",
    "I keep reading different things online and I am confused. {q} What are the main points?",
    "{q} Keep the answer focused on the facts, please.",
)

# Frames that move a question least (MiniLM mean shift < 0.06): paraphrases reframe with these,
# so a paraphrase stays well under the 0.35 dedup threshold from its original.
LIGHT_FRAMES: tuple[int, ...] = (0, 1, 2, 4, 5, 6, 7, 10, 11, 14, 15, 17)

DATASETS = ("ultrafeedback-sim", "helpful-prompts-sim")
N_WRITERS = 24

URLS = ("https://example.com/article?id=42", "http://www.example.org/notes", "www.example.net/faq",
        "https://docs.example.io/guide/intro.html", "http://192.0.2.15/page")
EMAILS = ("jane.doe@example.com", "j.smith+notes@mail.example.org", "support@example.net",
          "li.wei_88@example.cn")
# Several national formats (US, UK, DE, FR, IN, CN, JP, AU).
PHONES = ("+1 415 555 0132", "(415) 555-0132", "415-555-0132", "+44 20 7946 0958",
          "+44 7700 900123", "020 7946 0958", "+49 30 12345678", "+33 1 42 68 53 00",
          "06 12 34 56 78", "+91 98765 43210", "+86 138 0013 8000", "03-1234-5678",
          "+61 2 9876 5432")
CODE_BLOCKS = (
    "```python\nfor i in range(10):\n    print(i)\n```",
    "```\nSELECT name FROM users WHERE id = 1;\n```",
    "```js\nconst x = [1, 2, 3].map(n => n * 2);\n```",
    "Here is my script:\n\n    def area(r):\n        return 3.14 * r * r\n",
)
PII_SNIPPETS = {
    "url": ("{q} I read about it here: {v}", "Source: {v} {q}", "{q} (see {v})"),
    "email": ("{q} Please send the answer to {v}.", "From {v}: {q}", "{q} My email is {v}."),
    "phone": ("{q} Call me at {v} if that is easier.", "{q} You can reach me on {v}.",
              "My number is {v}. {q}"),
    "code_block": ("{q}\n{v}", "{v}\n{q}"),
}
PII_VALUES = {"url": URLS, "email": EMAILS, "phone": PHONES, "code_block": CODE_BLOCKS}

# Defect kinds -> relative weight. Each produces one line with the listed expected codes.
DEFECT_WEIGHTS: dict[str, float] = {
    "bad_json": 0.08, "invalid_utf8": 0.07, "bad_type": 0.06, "unknown_source": 0.07,
    "missing_provenance": 0.12, "low_preference": 0.10, "empty": 0.07, "too_long": 0.05,
    "url": 0.09, "email": 0.08, "phone": 0.10, "code_block": 0.07, "combo": 0.05,
}
COMBOS: tuple[tuple[str, ...], ...] = (
    ("url", "email"), ("email", "phone"), ("phone", "code_block"), ("missing_provenance", "url"),
    ("low_preference", "phone"), ("unknown_source", "email"),
)


@dataclass
class Row:
    source: str  # the file's source type (which file it goes to)
    data: object = None  # what is serialised (None: `raw` holds the bytes)
    raw: bytes | None = None
    expected: list[str] = field(default_factory=list)
    kind: str = "clean"  # clean / exact / paraphrase / a defect kind
    intent: tuple[int, int] | None = None  # (topic index, question index)
    dup_of: int | None = None  # index of the original row
    file: str = ""
    line: int = 0

    def to_bytes(self) -> bytes:
        if self.raw is not None:
            return self.raw
        return json.dumps(self.data, ensure_ascii=False, sort_keys=True).encode("utf-8")


def intents() -> list[tuple[int, int]]:
    return [(ti, qi) for ti, t in enumerate(TOPICS) for qi in range(len(t.questions))]


def frame(question: str, frame_idx: int) -> str:
    return FRAMES[frame_idx].format(q=question)


def reword(text: str, rng: random.Random) -> str:
    """A light rewording that keeps the meaning (synonym swap, contraction, case, punctuation)."""
    swaps = [("What is", "What's"), ("What are", "What're"), ("How does", "In what way does"),
             ("Why do", "For what reason do"), ("Explain", "Please explain"),
             ("Please keep it short.", "Keep it brief, please."), ("Can you", "Could you"),
             ("I'm", "I am"), ("Give me", "Tell me"), ("simple", "plain")]
    rng.shuffle(swaps)
    for a, b in swaps:
        if a in text:
            return text.replace(a, b, 1)
    if text[:1].isupper():
        return "Please, " + text[0].lower() + text[1:]
    return text + " Thanks."


def paraphrase(question: str, original_frame: int, rng: random.Random) -> str:
    """Another wording of the same framed question, never identical to the original."""
    original = frame(question, original_frame)
    for _ in range(8):
        if rng.random() < 0.5:
            text = frame(question, rng.choice(LIGHT_FRAMES))
        else:
            text = reword(original, rng)
        if text != original:
            return text
    return original + " Thank you."


def _provenance(source: str, rng: random.Random) -> dict:
    if source == "human":
        day = date(2025, 1, 1) + timedelta(days=rng.randrange(365))
        return {"writer_id": f"w-{rng.randrange(N_WRITERS):03d}", "written_at": day.isoformat()}
    if source == "user_query":
        t = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=rng.randrange(180 * 86400))
        return {"session_id": f"s-{rng.getrandbits(48):012x}",
                "timestamp": t.strftime("%Y-%m-%dT%H:%M:%SZ")}
    return {"dataset": rng.choice(DATASETS),
            "preference_score": round(rng.uniform(0.81, 1.0), 3)}


def clean_row(source: str, text: str, rng: random.Random) -> dict:
    return {"text": text, "source_type": source, **_provenance(source, rng)}


def _random_question(rng: random.Random) -> tuple[Topic, str]:
    t = rng.choice(TOPICS)
    return t, frame(rng.choice(t.questions), rng.randrange(len(FRAMES)))


def long_text(rng: random.Random, n_words: int) -> str:
    """An over-long but otherwise clean prompt (no digits, URLs or code), about n_words words."""
    pool = [s for t in TOPICS for s in (*t.facts, *t.questions)
            if not any(ch.isdigit() for ch in s) and "http" not in s.lower()]
    parts = ["I am preparing a long report and pasted all my notes below, sorry for the length."]
    count = len(parts[0].split())
    while count < n_words:
        s = rng.choice(pool)
        parts.append(s)
        count += len(s.split())
    _, q = _random_question(rng)
    parts.append(f"With all that in mind: {q}")
    return " ".join(parts)


def _with_pii(code: str, text: str, rng: random.Random) -> str:
    return rng.choice(PII_SNIPPETS[code]).format(q=text, v=rng.choice(PII_VALUES[code]))


def defect_row(kind: str, rng: random.Random, long_words: int) -> Row:
    """One defective line of the given kind, with its expected reason codes."""
    sources = list(FILES)
    source = "open_dataset" if kind == "low_preference" else rng.choice(sources)
    _, text = _random_question(rng)
    row = clean_row(source, text, rng)
    if kind == "combo":
        combo = rng.choice(COMBOS)
        if "low_preference" in combo:
            source = "open_dataset"
            row = clean_row(source, text, rng)
        for code in combo:
            if code in PII_SNIPPETS:
                row["text"] = _with_pii(code, row["text"], rng)
            elif code == "missing_provenance":
                _drop_provenance(row, rng)
            elif code == "low_preference":
                row["preference_score"] = _low_score(rng)
            elif code == "unknown_source":
                row["source_type"] = rng.choice(("forum_scrape", "synthetic", "crawler"))
        return Row(source, row, expected=sorted(combo), kind="combo")
    if kind == "bad_json":
        line = json.dumps(row, ensure_ascii=False, sort_keys=True)
        variant = rng.randrange(4)
        if variant == 0:
            raw = line[: max(5, len(line) // 2)]
        elif variant == 1:
            raw = repr(row)  # single quotes: Python, not JSON
        elif variant == 2:
            raw = line[:-1] + ",}"
        else:
            raw = json.dumps([row["text"], source])  # valid JSON, but not an object
        return Row(source, raw=raw.encode("utf-8"), expected=["bad_json"], kind=kind)
    if kind == "invalid_utf8":
        marker = "\u0001MARK\u0001"
        row["text"] = row["text"].replace(" ", f" {marker}", 1)
        line = json.dumps(row, ensure_ascii=False, sort_keys=True).encode("utf-8")
        bad = rng.choice((b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"\x80abc", b"caf\xe9"))
        raw = line.replace(json.dumps(marker)[1:-1].encode("utf-8"), bad, 1)
        return Row(source, raw=raw, expected=["invalid_utf8"], kind=kind)
    if kind == "bad_type":
        if source == "open_dataset" and rng.random() < 0.5:
            row["preference_score"] = rng.choice(("high", "0.9 maybe", [0.9]))
        else:
            row["text"] = rng.choice((12345, ["What is DNA made of?"], {"q": "Why do bees dance?"},
                                      True))
        return Row(source, row, expected=["bad_type"], kind=kind)
    if kind == "unknown_source":
        if rng.random() < 0.25:
            del row["source_type"]
        else:
            row["source_type"] = rng.choice(("forum_scrape", "synthetic", "crawler", ""))
        return Row(source, row, expected=["unknown_source"], kind=kind)
    if kind == "missing_provenance":
        _drop_provenance(row, rng)
        return Row(source, row, expected=["missing_provenance"], kind=kind)
    if kind == "low_preference":
        row["preference_score"] = _low_score(rng)
        return Row(source, row, expected=["low_preference"], kind=kind)
    if kind == "empty":
        row["text"] = rng.choice(("", " ", "   ", "\n", "\t \n ", "\u00a0\u3000"))
        return Row(source, row, expected=["empty"], kind=kind)
    if kind == "too_long":
        row["text"] = long_text(rng, long_words + rng.randrange(long_words // 4 + 1))
        return Row(source, row, expected=["too_long"], kind=kind)
    if kind in PII_SNIPPETS:
        row["text"] = _with_pii(kind, row["text"], rng)
        return Row(source, row, expected=[kind], kind=kind)
    raise ValueError(f"unknown defect kind {kind!r}")


def _low_score(rng: random.Random) -> float:
    # <= 0.8 is rejected (seed 000 §4.2 keeps only > 0.8); plant the boundary value too.
    return 0.8 if rng.random() < 0.2 else round(rng.uniform(0.05, 0.8), 3)


def _drop_provenance(row: dict, rng: random.Random) -> None:
    required = {"human": ("writer_id", "written_at"), "user_query": ("session_id", "timestamp"),
                "open_dataset": ("dataset", "preference_score")}[row["source_type"]]
    key = rng.choice(required)
    how = rng.randrange(4)
    if how == 0:
        del row[key]
    elif how == 1:
        row[key] = None
    elif how == 2 and key != "preference_score":
        row[key] = ""
    else:  # the wrong source's provenance: e.g. a human row carrying a session id
        del row[key]
        other = "session_id" if row["source_type"] != "user_query" else "writer_id"
        row[other] = f"x-{rng.getrandbits(24):06x}"


def _split(n: int, mix: dict[str, float]) -> dict[str, int]:
    total = sum(mix.values())
    counts = {k: int(n * v / total) for k, v in mix.items()}
    counts[max(mix, key=mix.get)] += n - sum(counts.values())
    return counts


def generate(rng: random.Random, n_lines: int, source_mix: dict[str, float], defect_rate: float,
             exact_dup_rate: float, paraphrase_rate: float, long_words: int
             ) -> tuple[dict[str, list[Row]], dict]:
    """The rows of every source file (in line order) and the counts for the report."""
    n_defect = round(n_lines * defect_rate)
    n_exact = round(n_lines * exact_dup_rate)
    n_clean = n_lines - n_defect - n_exact
    all_intents = intents()
    n_unique = min(len(all_intents), n_clean, max(1, n_clean - round(n_lines * paraphrase_rate)))
    if n_exact and not n_unique:
        raise ValueError(f"n_prompts={n_lines} leaves no clean original for the exact duplicates")
    n_para = n_clean - n_unique

    rows: list[Row] = []
    order = list(all_intents)
    rng.shuffle(order)
    sources = list(source_mix)
    weights = [source_mix[s] for s in sources]
    originals: list[int] = []
    frames_of: dict[int, int] = {}
    for intent in order[:n_unique]:
        ti, qi = intent
        f = rng.randrange(len(FRAMES))
        source = rng.choices(sources, weights)[0]
        text = frame(TOPICS[ti].questions[qi], f)
        frames_of[len(rows)] = f
        originals.append(len(rows))
        rows.append(Row(source, clean_row(source, text, rng), kind="clean", intent=intent))
    for _ in range(n_para):
        o = rng.choice(originals)
        ti, qi = rows[o].intent
        text = paraphrase(TOPICS[ti].questions[qi], frames_of[o], rng)
        source = rng.choices(sources, weights)[0]
        rows.append(Row(source, clean_row(source, text, rng), kind="paraphrase",
                        intent=rows[o].intent, dup_of=o))
    for _ in range(n_exact):
        o = rng.choice(originals)
        source = rng.choices(sources, weights)[0]
        rows.append(Row(source, clean_row(source, rows[o].data["text"], rng), kind="exact",
                        intent=rows[o].intent, dup_of=o))
    kinds = list(DEFECT_WEIGHTS)
    kweights = [DEFECT_WEIGHTS[k] for k in kinds]
    for _ in range(n_defect):
        rows.append(defect_row(rng.choices(kinds, kweights)[0], rng, long_words))

    # Shuffle positions, but keep each original before its duplicates within the whole stream.
    perm = list(range(len(rows)))
    rng.shuffle(perm)
    rank = {idx: pos for pos, idx in enumerate(perm)}
    for i, r in enumerate(rows):
        if r.dup_of is not None and rank[i] < rank[r.dup_of]:
            rank[i], rank[r.dup_of] = rank[r.dup_of], rank[i]
    by_file: dict[str, list[Row]] = {s: [] for s in FILES}
    for i in sorted(range(len(rows)), key=rank.__getitem__):
        r = rows[i]
        r.file = FILES[r.source]
        by_file[r.source].append(r)
        r.line = len(by_file[r.source])

    codes = Counter(c for r in rows for c in r.expected)
    counts = {
        "lines": len(rows),
        "lines_per_file": {FILES[s]: len(v) for s, v in by_file.items()},
        "clean_rows": sum(1 for r in rows if not r.expected),
        "clean_per_source_type": dict(sorted(Counter(r.source for r in rows
                                                     if not r.expected).items())),
        "defect_rows": sum(1 for r in rows if r.expected),
        "defect_rows_per_code": dict(sorted(codes.items())),
        "defect_rows_per_kind": dict(sorted(Counter(r.kind for r in rows if r.expected).items())),
        "defect_rows_per_file": {FILES[s]: sum(1 for r in v if r.expected)
                                 for s, v in by_file.items()},
        "multi_code_rows": sum(1 for r in rows if len(r.expected) > 1),
        "unique_questions": n_unique,
        "questions_available": len(all_intents),
        "duplicates": {"exact": n_exact, "paraphrase": n_para},
    }
    return by_file, {"rows": rows, "counts": counts}


def truth_lines(rows: list[Row]) -> list[bytes]:
    """truth.jsonl, ordered by file then line; dup_of names the original's file and line."""
    out = []
    for r in sorted(rows, key=lambda r: (r.file, r.line)):
        dup = rows[r.dup_of] if r.dup_of is not None else None
        rec = {
            "file": r.file, "line": r.line, "expected": r.expected,
            "dup_of": {"file": dup.file, "line": dup.line} if dup else None,
            "dup_kind": r.kind if r.kind in ("exact", "paraphrase") else None,
            "topic": TOPICS[r.intent[0]].name if r.intent else None,
        }
        out.append(json.dumps(rec, sort_keys=True).encode("utf-8"))
    return out
