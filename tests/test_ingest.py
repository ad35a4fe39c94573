"""Ingest: source trust, content filters, quarantine, readers and adapters, the count invariant."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rlhf.cli.app import app
from rlhf.pipeline.ingest import (
    IngestConfig,
    IngestError,
    _bare_domain_re,
    has_code_block,
    has_email,
    has_phone,
    has_url,
    regex_token_count,
    run_ingest,
    split_dialogue,
)
from rlhf.store import REASON_CODES, content_hash
from rlhf.store.io import read_table
from typer.testing import CliRunner

CFG = IngestConfig()
BARE = _bare_domain_re(CFG.url_bare_tlds)


# ---------------------------------------------------------------------------------------------
# A world-format fixture: the three source files of COMMON.md, with planted defects and a truth
# list {(file, line): expected reason codes}, written as bytes.

def _human(text, **kw):
    return {"text": text, "source_type": "human", "writer_id": "w01", "written_at": "2026-03-02", **kw}


def _query(text, **kw):
    return {"text": text, "source_type": "user_query", "session_id": "s-9",
            "timestamp": "2026-04-01T10:00:00Z", **kw}


def _open(text, score=0.93, **kw):
    return {"text": text, "source_type": "open_dataset", "dataset": "ultrafeedback",
            "preference_score": score, **kw}


def _line(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode() if not isinstance(obj, bytes) else obj


# (row or raw bytes, expected reason codes)
HUMAN = [
    (_human("Explain how photosynthesis turns light into sugar."), []),
    (_human("Write a haiku about the first snow of winter."), []),
    (_human("Summarise the plot of Hamlet in three sentences."), []),
    (_human("Email me at jane.doe@example.org with the answer."), ["email"]),
    (_human("Call +44 20 7946 0958 to book a table."), ["phone"]),
    (_human("Read https://example.com/guide and summarise it."), ["url"]),
    (_human("Fix this:\n```python\nprint('hi')\n```"), ["code_block"]),
    (_human("What does this do?\n\n    for i in range(3):\n        print(i)"), ["code_block"]),
    (_human("   \n\t "), ["empty"]),
    (_human("word " * 300), ["too_long"]),
    ({"text": "No writer here.", "source_type": "human", "written_at": "2026-03-02"},
     ["missing_provenance"]),
    (_human("Bad date.", written_at="yesterday"), ["bad_type"]),
    (_human(12345), ["bad_type"]),
    (b'{"text": "broken json", "source_type": "human"', ["bad_json"]),
    (b'{"text": "caf\xe9 latin-1", "source_type": "human"}', ["invalid_utf8"]),
    ((b'{"text": "lone \\ud800 surrogate", "source_type": "human", "writer_id": "w", '
      b'"written_at": "2026-01-01"}'), ["invalid_utf8"]),
    (b"[1, 2, 3]", ["bad_json"]),
    (b"", None),  # a blank line: no row, counted as skipped (None), neither kept nor rejected
    (b" \t\r", None),
    (_human("Mail bob@corp.com or visit corp.com, phone (415) 555-2671."),
     ["url", "email", "phone"]),
]
QUERIES = [
    (_query("how do i make sourdough starter"), []),
    (_query("what is 12 + 35 = 47 and the year 2024-01-05 at 10:30"), []),
    (_query("my number is 415-555-2671 call me"), ["phone"]),
    (_query("please text 13800138000"), ["phone"]),
    ({"text": "no session", "source_type": "user_query", "timestamp": "2026-04-01T10:00:00Z"},
     ["missing_provenance"]),
    (_query("bad ts", timestamp="not a time"), ["bad_type"]),
    (_query(""), ["empty"]),
    ({"text": "who am i", "source_type": "forum_scrape", "url_id": 3}, ["unknown_source"]),
    ({"text": "typeless"}, ["unknown_source"]),
]
OPEN = [
    (_open("Give three tips for staying healthy.", 0.93), []),
    (_open("Describe the water cycle.", 0.81), []),
    (_open("List four prime numbers.", 0.8), ["low_preference"]),
    (_open("Name a colour.", 0.2), ["low_preference"]),
    (_open("Scored as text.", "0.9"), ["bad_type"]),
    ({"text": "no dataset", "source_type": "open_dataset", "preference_score": 0.95},
     ["missing_provenance"]),
    (_open("Visit www.example.net for details.", 0.5), ["low_preference", "url"]),
]
FILES = {"sources/human.jsonl": HUMAN, "sources/user_queries.jsonl": QUERIES,
         "sources/open_dataset.jsonl": OPEN}


@pytest.fixture
def world_sources(tmp_path) -> tuple[Path, dict[tuple[str, int], list[str]]]:
    truth = {}
    for name, rows in FILES.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\n".join(_line(r) for r, _ in rows) + b"\n")
        for i, (_, expected) in enumerate(rows, 1):
            if expected is not None:
                truth[(name, i)] = expected
    return tmp_path / "sources", truth


N_BLANK = sum(expected is None for rows in FILES.values() for _, expected in rows)


def _outcome(store: Path) -> dict[tuple[str, int], list[str]]:
    got = {}
    for r in read_table("prompts", store / "prompts").to_pylist():
        got[(r["source_file"], r["source_line"])] = []
    for r in read_table("rejected", store / "rejected").to_pylist():
        key = (r["source_file"], r["source_line"])
        assert key not in got, f"{key} both kept and rejected"
        got[key] = r["reasons"]
    return got


def test_planted_defects_quarantined_with_their_reasons(world_sources, tmp_path):
    sources, truth = world_sources
    result = run_ingest([sources], tmp_path / "store", CFG)
    got = _outcome(tmp_path / "store")
    assert set(got) == set(truth)  # every input row is accounted for, once
    wrong = {k: (got[k], v) for k, v in truth.items() if sorted(got[k]) != sorted(v)}
    assert not wrong, wrong
    n_bad = sum(1 for v in truth.values() if v)
    assert (result.input_rows, result.kept, result.rejected, result.skipped) == (
        len(truth) + N_BLANK, len(truth) - n_bad, n_bad, N_BLANK)
    assert result.by_file["sources/human.jsonl"]["skipped"] == N_BLANK
    for code in REASON_CODES:
        assert result.by_reason.get(code, 0) == sum(code in v for v in truth.values()), code


def test_kept_rows_carry_id_provenance_and_time(world_sources, tmp_path):
    sources, _ = world_sources
    run_ingest([sources], tmp_path / "store", CFG)
    rows = {r["text"]: r for r in read_table("prompts", tmp_path / "store" / "prompts").to_pylist()}
    r = rows["Explain how photosynthesis turns light into sugar."]
    assert r["prompt_id"] == content_hash(r["text"])
    assert json.loads(r["provenance"]) == {"writer_id": "w01", "written_at": "2026-03-02"}
    assert r["created_at"].isoformat() == "2026-03-02T00:00:00+00:00"
    assert r["n_tokens"] == regex_token_count(r["text"]) == 8
    q = rows["how do i make sourdough starter"]
    assert q["created_at"].isoformat() == "2026-04-01T10:00:00+00:00"
    rej = read_table("rejected", tmp_path / "store" / "rejected").to_pylist()
    latin = next(r for r in rej if r["reasons"] == ["invalid_utf8"] and "caf" in r["raw"])
    assert latin["prompt_id"] is None and "\\xe9" in latin["raw"]


def test_rerun_replaces_tables_and_switches_change_counts(world_sources, tmp_path):
    sources, truth = world_sources
    store = tmp_path / "store"
    run_ingest([sources], store, CFG)
    first = read_table("prompts", store / "prompts").num_rows
    run_ingest([sources], store, CFG)
    assert read_table("prompts", store / "prompts").num_rows == first  # not appended
    loose = IngestConfig(filter_phone=False, filter_url=False, min_preference=0.1)
    result = run_ingest([sources], store, loose)
    assert result.kept > first
    assert result.by_reason["phone"] == result.by_reason["url"] == 0
    assert result.input_rows == len(truth) + N_BLANK == result.kept + result.rejected + N_BLANK
    assert not [p for p in store.iterdir() if p.name.startswith(".")]  # no staging left


# ---------------------------------------------------------------------------------------------
# The filters, one rule at a time.

@pytest.mark.parametrize("text, expected", [
    ("see https://a.b/c?d=1", True), ("ftp://files.example.org/x", True),
    ("go to www.python.org now", True), ("example.com is a domain", True),
    ("docs at sub.domain.co.uk/page", True), ("open main.py and node.js", False),
    ("e.g. this, i.e. that", False), ("version 3.11.2 released", False),
    ("write to a@b.com", False),  # an e-mail, not a URL
])
def test_url(text, expected):
    assert has_url(text, BARE) is expected


@pytest.mark.parametrize("text, expected", [
    ("a@b.com", True), ("first.last+tag@mail.example.co.uk", True),
    ("@handle on social media", False), ("a @ b", False), ("user@localhost", False),
])
def test_email(text, expected):
    assert has_email(text) is expected


@pytest.mark.parametrize("text, expected", [
    ("+1 415 555 2671", True), ("+44 20 7946 0958", True), ("+86 138 0013 8000", True),
    ("+49 (0)30 1234567", True), ("+33 1 23 45 67 89", True),
    ("(415) 555-2671", True), ("415-555-2671", True), ("415.555.2671", True),
    ("020 7946 0958", True), ("07700 900123", True), ("01 23 45 67 89", True),
    ("13800138000", True), ("07700900123", True), ("call 555-1234", True),
    ("030 1234567", True),
    ("the year 1999-2005", False), ("on 2024-01-05 at 10:30", False), ("pi is 3.14159", False),
    ("12 + 35 = 47", False), ("1,000,000 people", False), ("ip 192.168.10.10", False),
    ("+15 degrees", False), ("ISBN 978-3-16-148410-0", False), ("order 12345", False),
    # ranges and quantities ("roughly 700-1000 calories" is not a phone number)
    ("roughly 700-1000 calories", False), ("from 100-1000 mg a day", False),
    ("between 250-5000 people", False), ("SAT scores of 400-1600", False),
    ("write 300-1000 words", False), ("pages 123-4567", False), ("$100-1000", False),
    ("the number of people is 100-1000", False), ("a population of 13000000000", False),
    ("15000000000 dollars", False), ("1 000 000 000 people", False), ("0000000000", False),
    ("my number is 555-1234.", True), ("text me at 555-1234 tonight", True),
    ("Call me: 555-1234", True), ("fax (555-2428)", True),
])
def test_phone(text, expected):
    assert has_phone(text) is expected


@pytest.mark.parametrize("text, lines, expected", [
    ("```\ncode\n```", 2, True), ("inline ```x = 1``` here", 2, True), ("~~~\nx\n~~~", 2, True),
    ("intro\n    a = 1\n    b = 2", 2, True), ("intro\n\ta = 1\n\tb = 2", 2, True),
    ("intro\n    just one indented line", 2, False),
    ("intro\n    x = one_indented_line()", 1, True), ("a list:\n- one\n- two", 2, False),
    # indented prose is not code (real OpenAssistant answers indent their lists)
    ("Plan:\n    1. Track your progress: it helps.\n    2. Make it a routine.", 2, False),
    ("Topics\n    Machine Learning\n    Natural Language Processing", 2, False),
    ("Steps\n    - visit the castle\n    - then the museum", 2, False),
    ("Python:\n    if x:\n        go", 2, True),
    ("use `x` inline", 2, False),
])
def test_code_block(text, lines, expected):
    assert has_code_block(text, lines) is expected


def test_regex_token_count_words_punct_cjk():
    assert regex_token_count("Hello, world!") == 4
    assert regex_token_count("深度学习 is fun.") == 7
    assert regex_token_count("") == 0


def test_max_tokens_uses_the_given_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    # a character-level tokenizer: 1 token per character, far more than the regex word count
    vocab = {c: i for i, c in enumerate(["[UNK]"] + list("abcdefghijklmnopqrstuvwxyz "))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(tmp_path / "tok")
    src = tmp_path / "s.jsonl"
    src.write_text(json.dumps(_human("abcdef ghijkl")) + "\n")
    cfg = IngestConfig(max_tokens=10)
    assert run_ingest([src], tmp_path / "a", cfg).kept == 1  # regex: 2 tokens
    res = run_ingest([src], tmp_path / "b", cfg, tokenizer=tmp_path / "tok")  # 13 characters
    assert res.by_reason["too_long"] == 1
    assert str(tmp_path / "tok") in res.tokenizer
    with pytest.raises(IngestError, match="tokenizer not found"):
        run_ingest([src], tmp_path / "c", cfg, tokenizer=tmp_path / "nope")


# ---------------------------------------------------------------------------------------------
# Readers: parquet, saved datasets, gzip, broken archives; each gives the same verdicts.

def _rows_only(rows):
    return [r for r, _ in rows if isinstance(r, dict) and isinstance(r.get("text"), str)
            and isinstance(r.get("preference_score", 0.0), float)]


def test_parquet_and_datasets_match_jsonl(tmp_path):
    import datasets

    rows = _rows_only(HUMAN + OPEN)
    cols = sorted({k for r in rows for k in r})
    table = pa.table({c: [r.get(c) for r in rows] for c in cols})
    (tmp_path / "src").mkdir()
    pq.write_table(table, tmp_path / "src" / "rows.parquet")
    datasets.Dataset(table).save_to_disk(str(tmp_path / "src" / "saved"))
    (tmp_path / "src" / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    run_ingest([tmp_path / "src"], tmp_path / "store", IngestConfig(batch_rows=3))
    got = _outcome(tmp_path / "store")
    by_file: dict[str, list] = {}
    for (f, line), reasons in sorted(got.items()):
        by_file.setdefault(f, []).append(sorted(reasons))
    assert set(by_file) == {"src/rows.parquet", "src/saved", "src/rows.jsonl"}
    assert by_file["src/rows.parquet"] == by_file["src/saved"] == by_file["src/rows.jsonl"]
    assert len(by_file["src/rows.jsonl"]) == len(rows)


def test_gzip_and_truncated_archive_never_crash(tmp_path):
    good = gzip.compress(b"\n".join(_line(r) for r, _ in HUMAN[:3]) + b"\n")
    (tmp_path / "ok.jsonl.gz").write_bytes(good)
    (tmp_path / "cut.jsonl.gz").write_bytes(good[: len(good) // 2])
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    res = run_ingest([tmp_path], tmp_path / "store", CFG)
    got = _outcome(tmp_path / "store")
    assert [got[(f"{tmp_path.name}/ok.jsonl.gz", i)] for i in (1, 2, 3)] == [[], [], []]
    assert got[(f"{tmp_path.name}/bad.parquet", 1)] == ["unreadable"]
    assert ["unreadable"] in [v for (f, _), v in got.items() if f.endswith("cut.jsonl.gz")]
    assert res.input_rows == res.kept + res.rejected


def test_missing_source_is_a_clean_error(tmp_path):
    with pytest.raises(IngestError, match="not found"):
        run_ingest([tmp_path / "nope"], tmp_path / "store", CFG)
    (tmp_path / "empty").mkdir()
    with pytest.raises(IngestError, match="no source files"):
        run_ingest([tmp_path / "empty"], tmp_path / "store", CFG)


# ---------------------------------------------------------------------------------------------
# Adapters for the public formats, on records made here.

HH = {"chosen": "\n\nHuman: How do I bake bread?\n\nAssistant: Mix flour.\n\nHuman: Then?"
                "\n\nAssistant: Knead and bake.",
      "rejected": "\n\nHuman: How do I bake bread?\n\nAssistant: Mix flour.\n\nHuman: Then?"
                  "\n\nAssistant: No idea."}
OA = {"message_tree_id": "t1", "tree_state": "ready_for_export",
      "prompt": {"text": "Name a planet.", "role": "prompter", "review_result": True,
                 "synthetic": False, "replies": [
                     {"text": "Mars.", "role": "assistant", "rank": 1, "replies": []},
                     {"text": "Jupiter, the largest.", "role": "assistant", "rank": 0, "replies": [
                         {"text": "And the smallest?", "role": "prompter", "replies": [
                             {"text": "Mercury.", "role": "assistant", "rank": 0},
                             {"text": "Pluto.", "role": "assistant", "rank": 1}]}]},
                     {"text": "Sun.", "role": "assistant", "rank": 2, "deleted": True}]}}


def test_hh_rlhf_and_oasst_adapters_keep_pairs(tmp_path):
    src = tmp_path / "pub.jsonl"
    synthetic = json.loads(json.dumps(OA))
    synthetic["prompt"]["synthetic"] = True
    bad_hh = {"chosen": "no turns at all", "rejected": "none"}
    src.write_text("\n".join(json.dumps(o) for o in (HH, OA, synthetic, bad_hh)) + "\n")
    res = run_ingest([src], tmp_path / "store", CFG)
    got = _outcome(tmp_path / "store")
    assert [got[("pub.jsonl", i)] for i in (1, 2, 3, 4)] == [[], [], ["synthetic"], ["bad_record"]]
    prompts = read_table("prompts", tmp_path / "store" / "prompts").to_pylist()
    assert [p["text"] for p in prompts] == ["How do I bake bread?", "Name a planet."]
    assert all(p["source_type"] == "open_dataset" for p in prompts)
    pairs = read_table("external_pairs", tmp_path / "store" / "external_pairs").to_pylist()
    assert res.external_pairs == len(pairs) == 3
    hh = pairs[0]
    assert (hh["source"], hh["n_turns"], hh["chosen"], hh["rejected"]) == (
        "hh-rlhf", 2, "Knead and bake.", "No idea.")
    assert hh["prompt_id"] == content_hash("How do I bake bread?")
    assert hh["context"].endswith("\n\nHuman: Then?")
    oa = [(p["n_turns"], p["chosen"], p["rejected"]) for p in pairs[1:]]
    assert oa == [(1, "Jupiter, the largest.", "Mars."), (2, "Mercury.", "Pluto.")]
    assert split_dialogue(HH["chosen"])[0] == ("Human", "How do I bake bread?")


def test_realdata_public_files_add_up(realdata, tmp_path):
    hh = realdata / "hh-rlhf__harmless-base_test.jsonl.gz"
    oa = realdata / "Open-Assistant__en_100_tree.jsonl"
    res = run_ingest([hh, oa], tmp_path / "store", CFG)
    assert res.by_file[hh.name]["input"] == 2312 and res.by_file[oa.name]["input"] == 100
    assert res.input_rows == res.kept + res.rejected == 2412
    pairs = read_table("external_pairs", tmp_path / "store" / "external_pairs").to_pylist()
    hh_pairs = [p for p in pairs if p["source"] == "hh-rlhf"]
    # one pair per kept hh-rlhf row, except the few whose two dialogues split at different
    # turns (5 in this file); 662 of the 2,312 dialogues are single-turn
    assert len(hh_pairs) + res.external_pairs_skipped == res.by_file[hh.name]["kept"]
    assert res.external_pairs_skipped == 5
    assert sum(p["n_turns"] == 1 for p in hh_pairs) <= 662
    oa_pairs = [p for p in pairs if p["source"] == "oasst"]
    assert 0 < len(oa_pairs) <= 754 and all(p["chosen_rank"] < p["rejected_rank"] for p in oa_pairs)
    assert res.by_reason["synthetic"] == 5  # the five model-written trees


# ---------------------------------------------------------------------------------------------
# The command line.

def test_cli_ingest_prints_invariant_and_writes_metrics(world_sources, tmp_path):
    sources, truth = world_sources
    metrics, report = tmp_path / "m" / "ingest.json", tmp_path / "r" / "ingest.json"
    out = CliRunner().invoke(app, ["ingest", "--sources", str(sources), "--out-store",
                                   str(tmp_path / "store"), "--metrics", str(metrics),
                                   "--report", str(report)])
    assert out.exit_code == 0, out.output
    n_bad = sum(1 for v in truth.values() if v)
    assert (f"input {len(truth) + N_BLANK} = kept {len(truth) - n_bad} + rejected {n_bad} + "
            f"skipped (blank lines) {N_BLANK} ok") in " ".join(out.output.split())
    assert set(json.loads(metrics.read_text())) == {"input_rows", "kept", "rejected",
                                                    "invariant_holds", "external_pairs"}
    m = json.loads(report.read_text())
    assert m["input_rows"] == m["kept"] + m["rejected"] + m["skipped_blank_lines"] == \
        len(truth) + N_BLANK
    assert m["invariant_holds"] and m["skipped_blank_lines"] == N_BLANK
    assert m["by_reason"]["phone"] == sum("phone" in v for v in truth.values())
    bad = CliRunner().invoke(app, ["ingest", "--sources", str(tmp_path / "missing"),
                                   "--out-store", str(tmp_path / "s2")])
    assert bad.exit_code == 2 and "not found" in bad.output and "Traceback" not in bad.output


# ---------------------------------------------------------------------------------------------
# The real world generator: every planted defect, no clean prompt lost.

def write_world_sources(root: Path, seed: int, n_lines: int) -> tuple[Path, list[dict], dict]:
    """The world's three source files and truth.jsonl, written as `rlhf world generate` does
    (without its tokenizer and demonstrations, which these tests do not need)."""
    import random

    from rlhf.pipeline.world import WorldConfig, sources

    cfg = WorldConfig(seed=seed, n_prompts=n_lines)
    by_file, gen = sources.generate(random.Random(f"{seed}:sources"), n_lines,
                                    dict(cfg.source_mix), cfg.defect_rate, cfg.exact_dup_rate,
                                    cfg.paraphrase_rate, cfg.long_prompt_words)
    for source, rows in by_file.items():
        path = root / sources.FILES[source]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"".join(r.to_bytes() + b"\n" for r in rows))
    truth = [json.loads(line) for line in sources.truth_lines(gen["rows"])]
    return root / "sources", truth, gen["counts"]


@pytest.mark.parametrize("seed, n_lines", [(0, 2000), (11, 500)])
def test_world_planted_defects_all_quarantined_no_clean_prompt_lost(tmp_path, seed, n_lines):
    sources, truth, counts = write_world_sources(tmp_path / "world", seed, n_lines)
    result = run_ingest([sources], tmp_path / "store", CFG)
    got = _outcome(tmp_path / "store")
    assert len(got) == len(truth) == n_lines
    wrong = [(t["file"], t["line"], t["expected"], got[(t["file"], t["line"])]) for t in truth
             if sorted(got[(t["file"], t["line"])]) != sorted(t["expected"])]
    assert not wrong, wrong[:10]
    clean = {(t["file"], t["line"]) for t in truth if not t["expected"]}
    kept = {(r["source_file"], r["source_line"])
            for r in read_table("prompts", tmp_path / "store" / "prompts").to_pylist()}
    assert kept == clean  # no clean prompt lost, no defect kept
    assert result.input_rows == result.kept + result.rejected == n_lines
    assert result.rejected == counts["defect_rows"]
    assert {c: n for c, n in result.by_reason.items() if n} == counts["defect_rows_per_code"]


def test_shipped_params_equal_the_dataclass_defaults(repo):
    """Library use (tests, benchmarks) builds IngestConfig() / DedupConfig(): the same funnel."""
    from rlhf.pipeline.config import load_section
    from rlhf.pipeline.dedup import DedupConfig

    assert load_section(repo / "params.yaml", "ingest", IngestConfig) == IngestConfig()
    assert load_section(repo / "params.yaml", "dedup", DedupConfig) == DedupConfig()


# ---------------------------------------------------------------------------------------------
# Real-world files: length whatever the tokenizer, control characters, a byte-order
# mark, blank lines; every row accounted for.

def test_length_is_bounded_in_characters_whatever_the_tokenizer(tmp_path):
    src = tmp_path / "long.jsonl"
    rows = [_human("x" * 5_000_000), _human("y" * 5000), _human("z" * 4096), _human("ok")]
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    res = run_ingest([src], tmp_path / "store", CFG)
    got = _outcome(tmp_path / "store")
    # 5,000,000 characters are one regex token, yet too long; the line itself is over 1 MiB
    assert [got[("long.jsonl", i)] for i in (1, 2, 3, 4)] == [["too_long"], ["too_long"], [], []]
    assert res.input_rows == 4 == res.kept + res.rejected
    rej = {r["source_line"]: r for r in read_table("rejected", tmp_path / "store" / "rejected")
           .to_pylist()}
    assert len(rej[1]["raw"]) <= CFG.raw_max_chars + 1  # the quarantine keeps a bounded excerpt
    # with the char bound alone (no line bound in the way): the rule is the character count,
    # with the regex count and with a word-level tokenizer that sees each long word as 1 token
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "ok": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(tmp_path / "t")
    loose = IngestConfig(max_line_bytes=10**8, max_chars=4096)
    for tokenizer in (None, tmp_path / "t"):
        res = run_ingest([src], tmp_path / "s2", loose, tokenizer=tokenizer)
        assert res.by_reason["too_long"] == 2 and res.kept == 2


def test_an_overlong_line_is_read_in_bounded_pieces(tmp_path):
    src = tmp_path / "big.jsonl"
    src.write_bytes(json.dumps(_human("a " * 300_000)).encode() + b"\n"
                    + json.dumps(_human("after the long line")).encode() + b"\n")
    res = run_ingest([src], tmp_path / "store", IngestConfig(max_line_bytes=1000))
    got = _outcome(tmp_path / "store")
    assert got == {("big.jsonl", 1): ["too_long"], ("big.jsonl", 2): []}
    assert res.input_rows == 2


@pytest.mark.parametrize("text", ["nul\x00inside", "esc\x1b[31mred", "del\x7f", "c1\x85x",
                                  "bell\x07"])
def test_control_characters_reject_with_a_reason(tmp_path, text):
    src = tmp_path / "c.jsonl"
    src.write_text(json.dumps(_human(text)) + "\n" + json.dumps(_human("tab\tand\nnewline ok"))
                   + "\n")
    res = run_ingest([src], tmp_path / "store", CFG)
    assert _outcome(tmp_path / "store") == {("c.jsonl", 1): ["control_char"], ("c.jsonl", 2): []}
    assert res.by_reason["control_char"] == 1
    # switched off, the prompt is kept as it is
    assert run_ingest([src], tmp_path / "s3", IngestConfig(filter_control_chars=False)).kept == 2
    # a raw NUL byte inside a JSON string is not JSON at all
    src.write_bytes(b'{"text": "raw\x00nul", "source_type": "human"}\n')
    run_ingest([src], tmp_path / "s2", CFG)
    assert _outcome(tmp_path / "s2") == {("c.jsonl", 1): ["bad_json"]}


def test_control_characters_in_parquet_rows_too(tmp_path):
    pq.write_table(pa.table({"text": ["fine", "bad\x00"], "source_type": ["human"] * 2,
                             "writer_id": ["w"] * 2, "written_at": ["2026-01-01"] * 2}),
                   tmp_path / "p.parquet")
    run_ingest([tmp_path / "p.parquet"], tmp_path / "store", CFG)
    assert _outcome(tmp_path / "store") == {("p.parquet", 1): [], ("p.parquet", 2): ["control_char"]}


@pytest.mark.parametrize("gz", [False, True])
def test_a_byte_order_mark_does_not_reject_the_first_row(tmp_path, gz):
    body = b"\xef\xbb\xbf" + json.dumps(_human("first row")).encode() + b"\r\n" + \
        json.dumps(_human("second row")).encode() + b"\r\n"
    name = "bom.jsonl.gz" if gz else "bom.jsonl"
    (tmp_path / name).write_bytes(gzip.compress(body) if gz else body)
    res = run_ingest([tmp_path / name], tmp_path / "store", CFG)
    assert _outcome(tmp_path / "store") == {(name, 1): [], (name, 2): []}
    texts = [r["text"] for r in read_table("prompts", tmp_path / "store" / "prompts").to_pylist()]
    assert texts == ["first row", "second row"] and res.kept == 2


def test_blank_lines_are_skipped_lines_and_counts_add_up(tmp_path):
    src = tmp_path / "b.jsonl"
    src.write_bytes(b"\n" + json.dumps(_human("one")).encode() + b"\n\n   \n\r\n"
                    + b"{broken\n" + json.dumps(_human("two")).encode() + b"\n\n")
    res = run_ingest([src], tmp_path / "store", CFG)
    # lines: blank, one, blank, spaces, CR only, broken, two, blank (the final newline ends it)
    assert (res.input_rows, res.kept, res.rejected, res.skipped) == (8, 2, 1, 5)
    assert res.by_file["b.jsonl"] == {"input": 8, "kept": 2, "rejected": 1, "skipped": 5}
    got = _outcome(tmp_path / "store")
    assert got == {("b.jsonl", 2): [], ("b.jsonl", 6): ["bad_json"], ("b.jsonl", 7): []}
    assert res.metrics()["invariant_holds"] and res.by_reason["bad_json"] == 1


def test_cli_shows_file_names_verbatim(tmp_path):
    d = tmp_path / "[bold red]src"
    d.mkdir()
    (d / "[INST] chat [red].jsonl").write_text(json.dumps(_human("hello there")) + "\n")
    out = CliRunner().invoke(app, ["ingest", "--sources", str(d), "--out-store",
                                   str(tmp_path / "store")], env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    assert "[bold red]src/[INST] chat [red].jsonl: 1 rows, kept 1" in out.output


def test_filters_on_real_prompts_measured(realdata):
    """The filters' false-positive figures, recomputed (bench/filter_fp.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("filter_fp", Path(__file__).parents[1] /
                                                  "bench" / "filter_fp.py")
    fp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fp)
    report = fp.measure(realdata)
    assert report["prompts"]["texts"] == 2572  # 2,312 hh-rlhf + 100 OpenAssistant + 160 MT-bench
    # every PII rule that fires on a real prompt has been looked at (bench/data labels)
    for rule in ("url", "email", "phone"):
        assert report["prompts"]["false_positive"][rule] == 0, report
    assert report["prompts"]["fired"]["phone"] == 0
    assert report["prompts"]["fired"]["control_char"] == 0
    assert report["unlabelled"] == [], report["unlabelled"]


def test_cli_an_output_path_that_cannot_be_written_is_one_error(world_sources, tmp_path):
    sources, _ = world_sources
    (tmp_path / "a_file").write_text("in the way")
    for extra, message in ((["--out-store", str(tmp_path / "a_file" / "store")], "I/O error"),
                           (["--out-store", str(tmp_path / "s"), "--metrics",
                             str(tmp_path / "a_file" / "m.json")], "cannot write")):
        out = CliRunner().invoke(app, ["ingest", "--sources", str(sources), *extra])
        assert out.exit_code == 2 and isinstance(out.exception, SystemExit), out.output
        assert f"error: {message}" in out.output and "a_file" in out.output


def test_mt_bench_adapter_first_turn_open_dataset(tmp_path):
    src = tmp_path / "mt.jsonl"
    src.write_text(json.dumps({"question_id": 81, "category": "writing",
                               "turns": ["Write a haiku about rain.", "Now in French."]}) + "\n"
                   + json.dumps({"question_id": 82, "category": "math", "turns": []}) + "\n")
    res = run_ingest([src], tmp_path / "store", CFG)
    assert res.kept == 1 and res.rejected == 1 and res.by_reason["bad_type"] == 1
    row = read_table("prompts", tmp_path / "store" / "prompts").to_pylist()[0]
    assert row["text"] == "Write a haiku about rain." and row["source_type"] == "open_dataset"
    prov = json.loads(row["provenance"])
    assert prov["dataset"] == "mt-bench" and prov["question_id"] == 81


def test_realdata_mt_bench_reads_every_question(realdata, tmp_path):
    mt = realdata / "FastChat__mt_bench_question.jsonl"
    res = run_ingest([mt], tmp_path / "store", CFG)
    assert res.input_rows == res.kept + res.rejected == 80
    assert res.by_reason.get("bad_type", 0) == 0  # every row is read by the adapter


# ---------------------------------------------------------------------------------------------
# The filter classes (datatrove's contract): each keeps a clean prompt and drops its own case
# with its reason code; the chain records every reason, except after a filter that stops.

def _rec(text):
    from rlhf.pipeline.ingest import Record

    return Record("f.jsonl", 1, text, text=text)


def _filter_cases():
    from rlhf.pipeline.ingest import TokenCounter
    from rlhf.pipeline.ingest.filters import (
        CodeBlockFilter,
        ControlCharFilter,
        EmailFilter,
        EmptyFilter,
        LengthFilter,
        PhoneFilter,
        UrlFilter,
    )

    return [
        (EmptyFilter(), " \u200b\n", "empty"),
        (LengthFilter(max_chars=40, max_tokens=7, count_tokens=TokenCounter()),  # clean: 7 tokens
         "one two three four five six seven eight", "too_long"),
        (LengthFilter(max_chars=30, max_tokens=500, count_tokens=TokenCounter()),  # clean: 26 chars
         "x" * 31, "too_long"),
        (ControlCharFilter(), "a\x1b[31mred", "control_char"),
        (UrlFilter(CFG.url_bare_tlds), "see example.com/faq", "url"),
        (EmailFilter(), "write to ann@example.org", "email"),
        (PhoneFilter(), "call +44 20 7946 0958 today", "phone"),
        (CodeBlockFilter(), "fix this:\n```\nx = 1\n```", "code_block"),
    ]


@pytest.mark.parametrize("case", range(8))
def test_each_filter_keeps_clean_text_and_drops_with_its_reason(case):
    filt, bad, reason = _filter_cases()[case]
    clean = _rec("How do I keep basil fresh?")
    assert filt.filter(clean) is True and filt.drop_reason(filt.filter(clean)) is None
    verdict = filt.filter(_rec(bad))
    assert verdict == (False, reason) and filt.drop_reason(verdict) == reason
    assert reason in REASON_CODES and filt.name == reason


def test_length_filter_counts_tokens_except_over_long_characters():
    from rlhf.pipeline.ingest import TokenCounter
    from rlhf.pipeline.ingest.filters import LengthFilter

    filt = LengthFilter(max_chars=20, max_tokens=3, count_tokens=TokenCounter())
    recs = [_rec("a b"), _rec("a b c d"), _rec("y" * 21)]
    assert filt.filter_batch(recs) == [True, (False, "too_long"), (False, "too_long")]
    assert [r.n_tokens for r in recs] == [2, 4, 0]  # the 21-character one was never tokenized


def test_chain_records_every_reason_in_order_and_stops_after_empty():
    from rlhf.pipeline.ingest import Filter, TokenCounter, apply_filters, build_filters

    chain = build_filters(CFG, TokenCounter())
    assert [f.name for f in chain] == ["empty", "too_long", "control_char", "url", "email",
                                       "phone", "code_block"]
    both, blank, unread = _rec("mail ann@example.org or see www.example.com\x00"), _rec("  "), _rec(None)
    unread.text = None
    apply_filters(chain, [both, blank, unread])
    assert both.reasons == ["control_char", "url", "email"]
    assert blank.reasons == ["empty"] and unread.reasons == []
    off = build_filters(IngestConfig(filter_url=False, filter_email=False, filter_phone=False,
                                     filter_code_block=False, filter_control_chars=False),
                        TokenCounter())
    assert [f.name for f in off] == ["empty", "too_long"]

    class NoQuestion(Filter):  # a bare False drops with the filter's name
        name = "bad_record"

        def filter(self, rec):
            return "?" in rec.text

    ask, tell = _rec("why?"), _rec("because")
    apply_filters([NoQuestion()], [ask, tell])
    assert ask.reasons == [] and tell.reasons == ["bad_record"]
