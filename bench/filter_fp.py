"""How often ingest's content filters fire on real prompts, and how often wrongly.

    .venv/bin/python bench/filter_fp.py              # reads ../shared/realdata
    .venv/bin/python bench/filter_fp.py --json out.json

Two text sets from `../shared/realdata` (read there, never copied into the project):
- `prompts`: what ingest sees as prompts: the first human turn of each hh-rlhf dialogue (2,312),
  the root of each OpenAssistant tree (100), both turns of MT-bench's 80 questions (160);
- `mt_bench`: MT-bench's 80 questions, both turns (160 texts; also part of `prompts`);
- `all_turns`: every distinct turn of those files (hh-rlhf human and assistant turns, every
  OpenAssistant message, MT-bench's turns): 15k texts full of numbers, ranges and quantities,
  the stress test for the phone rule.

Every firing of a PII rule (url, email, phone) and of the code-block rule was read by a person and
labelled true or false positive in `bench/data/filter_labels.json`, keyed by the first 16 hex digits
of the text's content hash and the rule (no text is stored). A firing without a label is listed
under `unlabelled`: after a filter change, read those and label them. The false-positive rate is
labelled false positives / texts.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

from rlhf.pipeline.ingest import (
    IngestConfig,
    _bare_domain_re,
    has_code_block,
    has_control_char,
    has_email,
    has_phone,
    has_url,
    regex_token_count,
    split_dialogue,
)
from rlhf.store.hashing import content_hash

LABELS = Path(__file__).with_name("data") / "filter_labels.json"
CFG = IngestConfig()
_BARE = _bare_domain_re(CFG.url_bare_tlds)
RULES = {
    "url": lambda t: has_url(t, _BARE),
    "email": has_email,
    "phone": lambda t: has_phone(t, CFG.phone_min_digits, CFG.phone_intl_min_digits,
                                 CFG.phone_max_digits),
    "code_block": lambda t: has_code_block(t, CFG.indented_code_min_lines),
    "control_char": has_control_char,
    "too_long_tokens": lambda t: regex_token_count(t) > CFG.max_tokens,
    "too_long_chars": lambda t: len(t) > CFG.max_chars,
}
LABELLED = ("url", "email", "phone", "code_block")


def key(text: str) -> str:
    return content_hash(text)[:16]


def _oasst_messages(node: dict, out: list[str]) -> None:
    if isinstance(node.get("text"), str):
        out.append(node["text"])
    for child in node.get("replies") or []:
        _oasst_messages(child, out)


def texts(realdata: Path) -> dict[str, list[str]]:
    """{"prompts": [...], "all_turns": [...]} from the three real-data files."""
    prompts: list[str] = []
    turns: list[str] = []
    with gzip.open(realdata / "hh-rlhf__harmless-base_test.jsonl.gz", "rt", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            dialogue = split_dialogue(row["chosen"])
            prompts.append(dialogue[0][1])
            for side in ("chosen", "rejected"):
                turns += [t for _, t in split_dialogue(row[side])]
    with open(realdata / "Open-Assistant__en_100_tree.jsonl", encoding="utf-8") as fh:
        for line in fh:
            root = json.loads(line)["prompt"]
            prompts.append(root["text"])
            _oasst_messages(root, turns)
    mt_bench: list[str] = []
    mt = realdata / "FastChat__mt_bench_question.jsonl"
    if mt.is_file():
        with open(mt, encoding="utf-8") as fh:
            for line in fh:
                mt_bench += json.loads(line)["turns"]
    prompts += mt_bench
    turns += prompts
    return {"prompts": prompts, "mt_bench": mt_bench, "all_turns": list(dict.fromkeys(turns))}


def measure(realdata: Path) -> dict:
    labels = json.loads(LABELS.read_text()) if LABELS.is_file() else {}
    report: dict = {"unlabelled": []}
    for name, items in texts(realdata).items():
        fired = dict.fromkeys(RULES, 0)
        fp = dict.fromkeys(LABELLED, 0)
        for text in items:
            for rule, fn in RULES.items():
                if not fn(text):
                    continue
                fired[rule] += 1
                if rule in LABELLED:
                    label = labels.get(f"{key(text)}:{rule}")
                    if label is None:
                        report["unlabelled"].append(f"{name} {key(text)}:{rule}")
                    elif label["verdict"] == "fp":
                        fp[rule] += 1
        report[name] = {"texts": len(items), "fired": fired, "false_positive": fp,
                        "false_positive_rate": {r: fp[r] / len(items) for r in LABELLED}}
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--realdata", type=Path,
                    default=Path(__file__).resolve().parents[1].parent / "shared" / "realdata")
    ap.add_argument("--json", type=Path, help="Also write the report here.")
    args = ap.parse_args()
    report = measure(args.realdata)
    for name in ("prompts", "mt_bench", "all_turns"):
        r = report[name]
        print(f"{name}: {r['texts']:,} texts")
        for rule, n in r["fired"].items():
            extra = (f", false positives {r['false_positive'][rule]} "
                     f"({r['false_positive_rate'][rule]:.2%})") if rule in LABELLED else ""
            print(f"  {rule:16s} fired {n:5d}{extra}")
    if report["unlabelled"]:
        print(f"unlabelled firings ({len(report['unlabelled'])}): read and label them in {LABELS}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
