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
- a user's chat rows {"messages": [{"role": "user" | "assistant", "content"}, ...],
  "source_type", <provenance>}: the prompt is the conversation, one text in hh-rlhf's notation
  (`text.flatten`) that `text.messages_of` reads back turn by turn for a chat template.
The public formats are open datasets: they carry a human preference or curation (hh-rlhf's binary
choice, OpenAssistant's review and ranking, MT-bench's hand-written questions) but no per-row
score, so they get `adapter_preference_score`.

The package, one concern per module: `readers` (files -> Records), `adapters` (a row format ->
the Record's text, provenance and pairs; source trust), `filters` (one class per content rule,
keep or drop with a reason; `detectors` holds their pure text predicates), `stage` (batches,
tables, counts); `config` the settings, `record` the Record they pass along.
"""

from rlhf.pipeline.ingest.adapters import (
    _missing,
    _parse_timestamp,
    adapt,
    format_turns,
    split_dialogue,
)
from rlhf.pipeline.ingest.config import IngestConfig, IngestError
from rlhf.pipeline.ingest.detectors import (
    _bare_domain_re,
    has_code_block,
    has_control_char,
    has_email,
    has_phone,
    has_url,
    is_blank,
    is_encodable,
    regex_token_count,
)
from rlhf.pipeline.ingest.filters import Filter, TokenCounter, apply_filters, build_filters
from rlhf.pipeline.ingest.readers import Source, collect_sources, iter_records
from rlhf.pipeline.ingest.record import Record
from rlhf.pipeline.ingest.stage import TABLES_WRITTEN, IngestResult, run_ingest

# What other modules import from `rlhf.pipeline.ingest` (the stage, its config, the detectors
# bench/filter_fp.py measures, the hh-rlhf dialogue split, the provenance parsers the preferences
# stage shares).
__all__ = [
    "TABLES_WRITTEN", "Filter", "IngestConfig", "IngestError", "IngestResult", "Record", "Source",
    "TokenCounter", "_bare_domain_re", "_missing", "_parse_timestamp", "adapt", "apply_filters",
    "build_filters", "collect_sources", "format_turns", "has_code_block", "has_control_char",
    "has_email", "has_phone", "has_url", "is_blank", "is_encodable", "iter_records",
    "regex_token_count", "run_ingest", "split_dialogue",
]
