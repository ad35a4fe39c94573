"""The ingest stage's settings (params.yaml `ingest:`) and its one error type."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlhf.pipeline import ranges
from rlhf.store.schemas import SOURCE_TYPES


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
        ranges.check_fields("ingest", self)
        if not self.phone_intl_min_digits <= self.phone_max_digits:
            raise ValueError("need phone_intl_min_digits <= phone_max_digits")
        if not self.phone_min_digits <= self.phone_max_digits:
            raise ValueError("need phone_min_digits <= phone_max_digits")


class IngestError(ValueError):
    """Bad invocation (missing source path, nothing to read): the CLI prints it, no traceback."""
