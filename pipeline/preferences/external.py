"""External human rankings in the real-data folder: hh-rlhf chosen/rejected pairs and
OpenAssistant ranked sibling replies (each reader yields (group key, prompt, [responses best
first])), as `preferences` rows.

The folder is an input like any other: dvc.yaml declares the files `external_files` names as
the preferences stage's dependencies, and a folder given without them is an error, never a
silent "no external rankings" (docs/stages.md).

    python -c "from rlhf.pipeline.preferences import PreferencesConfig as C, external_rows as e; \
print(e('../shared/realdata', C())[1])"
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable
from pathlib import Path

from rlhf.pipeline.preferences.config import PreferencesConfig, heldout_or_train
from rlhf.pipeline.models.text import split_dialogue
from rlhf.store.hashing import content_hash

HH_FILE = "hh-rlhf__harmless-base_test.jsonl.gz"
OASST_FILE = "Open-Assistant__en_100_tree.jsonl"


def read_hh_pairs(path: str | Path) -> Iterable[tuple[str, str, list[str]]]:
    """hh-rlhf chosen/rejected dialogues as (line key, prompt, [chosen reply, rejected reply]).

    Lines that are not JSON, lack either side, or whose two sides do not share the history are
    skipped (counted by the caller as input - kept)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as fh:
        for n, line in enumerate(fh, 1):
            try:
                row = json.loads(line)
                chosen, rejected = split_dialogue(row["chosen"]), split_dialogue(row["rejected"])
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
                continue
            if not chosen or not rejected or chosen[0] != rejected[0]:
                continue
            if not chosen[1] or not rejected[1] or chosen[1] == rejected[1]:
                continue
            yield f"hh:{n}", chosen[0], [chosen[1], rejected[1]]


def read_oasst_groups(path: str | Path) -> Iterable[tuple[str, str, list[str]]]:
    """OpenAssistant ranked sibling replies: (parent id, conversation so far, replies by rank)."""
    def walk(node, history):
        text = node.get("text") or ""
        role = node.get("role")
        turn = text if not history else f"{history}\n\n{'Human' if role == 'prompter' else 'Assistant'}: {text}"
        replies = [r for r in node.get("replies") or [] if isinstance(r, dict)]
        if role == "prompter":
            ranked = []
            for r in replies:
                try:
                    ranked.append((int(r.get("rank")), r.get("text") or ""))
                except (TypeError, ValueError):
                    continue
            ranked = sorted(x for x in ranked if x[1].strip())
            if len(ranked) >= 2:
                yield f"oasst:{node.get('message_id')}", turn, [t for _, t in ranked]
        for r in replies:
            yield from walk(r, turn)

    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            try:
                tree = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(tree, dict) and isinstance(tree.get("prompt"), dict):
                yield from walk(tree["prompt"], "")


def external_files(realdata: str | Path, cfg: PreferencesConfig) -> list[Path]:
    """The files of `realdata` that `external_rows` reads under `cfg` (hh-rlhf, and
    OpenAssistant with `include_oasst`): the stage's dependencies in dvc.yaml."""
    realdata = Path(realdata)
    return [realdata / HH_FILE] + ([realdata / OASST_FILE] if cfg.include_oasst else [])


def missing_files(realdata: str | Path, cfg: PreferencesConfig) -> list[Path]:
    """The files `external_rows` needs that `realdata` lacks (all of them without the folder)."""
    return [p for p in external_files(realdata, cfg) if not p.is_file()]


def external_rows(realdata: str | Path, cfg: PreferencesConfig) -> tuple[list[dict], dict]:
    """`preferences` rows of the external rankings in `realdata`; FileNotFoundError naming the
    first file it lacks."""
    realdata = Path(realdata)
    rows: list[dict] = []
    counts: dict[str, int] = {}
    if missing := missing_files(realdata, cfg):
        raise FileNotFoundError(f"{missing[0]}: not found (the real-data folder {realdata} "
                                "lacks it)")
    sources = [("hh-rlhf", realdata / HH_FILE, read_hh_pairs, cfg.hh_max_pairs)]
    if cfg.include_oasst:
        sources.append(("oasst", realdata / OASST_FILE, read_oasst_groups, 0))
    for source, path, reader, cap in sources:
        n = 0
        for key, prompt, ranked in reader(path):
            if cap and n >= cap:
                break
            pid = content_hash(prompt)
            split = heldout_or_train(key, cfg.hh_heldout_fraction)
            for rank, resp in enumerate(ranked):
                rows.append({
                    "ranking_id": content_hash(key)[:16], "prompt_id": pid, "prompt": prompt,
                    "response_hash": content_hash(resp), "response": resp,
                    "annotator_id": source, "labeled_at": None, "score": None, "rank": rank,
                    "source": source, "response_source": "human", "split": split,
                    "gold_score": None,
                })
            n += 1
        counts[source] = n
    return rows, counts
