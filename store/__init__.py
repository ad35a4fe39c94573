"""The dataset-centric store: one schema per table, atomic parquet shards, content hashes, DuckDB views.

    python -c "from rlhf.store import TABLES; print(list(TABLES))"
"""

from rlhf.store.hashing import content_hash
from rlhf.store.schemas import REASON_CODES, TABLES, schema_for

__all__ = ["REASON_CODES", "TABLES", "content_hash", "schema_for"]
