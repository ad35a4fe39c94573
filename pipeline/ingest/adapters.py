"""Format adapters: one per row format, chosen per row by its keys (`adapt`); each fills a Record
in from a parsed row. The world's rows also pass layer one here, source trust (seed 000 §4.2):
a trusted source type whose provenance fields are present and typed."""

from __future__ import annotations

import datetime as dt
import math
import re
from typing import Any

from rlhf.pipeline.ingest.config import IngestConfig
from rlhf.pipeline.ingest.detectors import is_encodable
from rlhf.pipeline.ingest.record import Record
from rlhf.pipeline.models.text import clean, flatten, messages_of
from rlhf.store.schemas import SOURCE_TYPES


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


def adapt_messages(rec: Record, obj: dict[str, Any], cfg: IngestConfig) -> None:
    """A user's chat rows: {"messages": [{"role", "content"}, ...], "source_type", <provenance>}.
    The prompt is the conversation up to its last user turn, stored as one text in hh-rlhf's
    notation (`text.flatten`), from which `text.messages_of` reads the same turns back for a chat
    template; one that does not (another role, a first or last turn not the user's, a turn
    holding a `\\n\\nHuman:` tag) is a `bad_record`. Provenance as for the world's rows."""
    messages = obj.get("messages")
    try:
        text = flatten(messages) if isinstance(messages, list) else None
    except (ValueError, AttributeError):
        text = None
    if text is None or messages[-1]["role"] != "user" or messages_of(text) != [
            {"role": m["role"], "content": clean(m["content"])} for m in messages]:
        rec.reject("bad_record")
    else:
        _set_text(rec, text)
    _check_provenance(rec, obj, cfg)
    for key, value in obj.items():
        if key not in ("messages", "source_type") and key not in rec.provenance:
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
    elif "messages" in obj and "text" not in obj:
        adapt_messages(rec, obj, cfg)
    else:
        adapt_generic(rec, obj, cfg)
