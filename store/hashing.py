"""Stable hashes for the store: content hashes of texts, integer prompt keys, folder versions.

- `content_hash(text)`: sha256 over NFC-normalised UTF-8 (ARCHITECTURE: "The store"); what
  prompt ids and response hashes are.
- `prompt_key(prompt_id)`: a signed 64-bit integer derived from a prompt id, stored next to it
  in the big tables (`rollouts`, and the `pool` / `difficulty` tables they are joined with), so
  the audits group and join 8-byte integers instead of 64-character strings (bench/bench_query.py).
- `response_key(text)`: the rollouts' response identity, 64 bits of `content_hash(text)` (its
  first 16 hex digits, signed): 8 bytes a row where the full hash took ~34 (bench/bench_query.py).
  `hex_key(hash)` / `HEX_KEY_SQL` turn a full hash (rm_scores, human_labels, preferences) into it.
- `tree_hash(folder)`: a stable id of a model folder's contents (the RM version in `rm_scores`).
- `hash_fraction(key)` / `hashed_split(key, shares)`: a stable number in [0, 1) from a text and
  the split it falls in; every split of the pipeline (pool reward / ppo / eval, held-out pairs,
  held-out demonstrations) is one of these, so the same key always lands on the same side.

    python -c "from rlhf.store.hashing import content_hash, prompt_key; print(prompt_key(content_hash('hello')))"
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc


def content_hash(text: str) -> str:
    """Hex sha256 of the NFC-normalised UTF-8 bytes of `text`.

    NFC makes visually identical strings (composed "é" vs "e" + combining accent) hash the same,
    so a prompt keeps its id whichever editor or dataset wrote it.
    """
    if not isinstance(text, str):
        raise TypeError(f"content_hash expects str, got {type(text).__name__}")
    return hashlib.sha256(unicodedata.normalize("NFC", text).encode("utf-8")).hexdigest()


def hash_fraction(key: str) -> float:
    """A stable number in [0, 1): the first 8 bytes of `content_hash(key)` over 2**64."""
    digest = hashlib.sha256(unicodedata.normalize("NFC", key).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def hashed_split(key: str, shares: Iterable[tuple[str, float]]) -> str:
    """The name whose cumulative share first exceeds `hash_fraction(key)`; shares summing below 1
    leave the rest to the last name with a positive share."""
    shares = list(shares)
    u, acc = hash_fraction(key), 0.0
    for name, share in shares:
        acc += share
        if u < acc:
            return name
    return next(name for name, share in reversed(shares) if share > 0)


# `hex_key` in DuckDB SQL (the first 16 hex digits as UBIGINT, then two's complement)
HEX_KEY_SQL = ("((('0x' || ({hex})[1:16])::UBIGINT)::HUGEINT"
               " - ((('0x' || ({hex})[1:16])::UBIGINT) >> 63)::HUGEINT"
               " * 18446744073709551616)::BIGINT")
# `prompt_key` in DuckDB SQL: `hex_key` of the id's sha256
PROMPT_KEY_SQL = HEX_KEY_SQL.replace("{hex}", "sha256({id})")


def hex_key(hex_hash: str) -> int:
    """The first 16 hex digits of a hash (`content_hash`, sha256 hexdigest) as a signed int64;
    `HEX_KEY_SQL.format(hex="response_hash")` is the same in DuckDB."""
    return int.from_bytes(bytes.fromhex(hex_hash[:16]), "big", signed=True)


def response_key(text: str) -> int:
    """A rollout's response identity: `hex_key(content_hash(text))`, 64 bits of its sha256.

    The rollouts table stores this key (8 bytes a row) instead of the 64-character hash, which
    alone cost more than the whole 32-byte row budget (bench/bench_query.py); the other tables
    keep the full `response_hash`, and `hex_key` of it finds the rollout
    (`rollouts.response_key = HEX_KEY_SQL.format(hex="rm_scores.response_hash")`). Two distinct
    responses share a key with probability about n^2 / 2^65 for n rollouts (3e-6 at 10M); no
    audit groups or joins by it, so a collision would only make two rollouts look alike to a
    reader who compares keys.
    """
    return hex_key(content_hash(text))


def prompt_key(prompt_id: str) -> int:
    """The first 8 bytes of sha256(UTF-8 prompt_id), read as a big-endian signed int64.

    Hashed rather than parsed from the id: most prompt ids are content hashes, but a JSONL
    prompt file may carry its own ids ("p01"), and one rule must serve every id. The same in
    DuckDB SQL: `PROMPT_KEY_SQL.format(id="prompt_id")`.

    A 64-bit key can collide: two distinct ids share one with probability about n^2 / 2^65 for
    n ids (7e-11 for 50k prompts, 3e-6 for 10M). The store refuses a write whose rows hold such
    a pair (`keys_for`), and the audits refuse a pool or difficulty table that holds one
    (store/audits/*.sql), so a collision stops a query instead of merging two prompts.
    """
    if not isinstance(prompt_id, str):
        raise TypeError(f"prompt_key expects str, got {type(prompt_id).__name__}")
    return int.from_bytes(hashlib.sha256(prompt_id.encode("utf-8")).digest()[:8], "big",
                          signed=True)


def keys_for(prompt_ids: pa.Array | pa.ChunkedArray) -> pa.Array:
    """`prompt_key` of every id (int64, nulls stay null), hashing each distinct id once.

    Raises ValueError when two distinct ids of the array share a key (see `prompt_key`).
    """
    if isinstance(prompt_ids, pa.ChunkedArray):
        prompt_ids = prompt_ids.combine_chunks()
    if pa.types.is_dictionary(prompt_ids.type):
        prompt_ids = prompt_ids.cast(prompt_ids.type.value_type)
    encoded = pc.dictionary_encode(prompt_ids)
    distinct = encoded.dictionary.to_pylist()
    keys = [prompt_key(p) for p in distinct]
    if len(set(keys)) != len(keys):
        first: dict[int, str] = {}
        for p, k in zip(distinct, keys):
            if k in first:
                raise ValueError(f"prompt ids {first[k]!r} and {p!r} share prompt_key {k} "
                                 "(a 64-bit hash collision): give one of them another id")
            first[k] = p
    return pa.array(keys, pa.int64()).take(encoded.indices)


def tree_hash(folder: str | Path) -> str:
    """A stable id of a folder's contents: sha256 over (relative path, bytes) of every visible
    file, in path order; the first 16 hex digits. Two copies of a model folder get the same id,
    any changed weight or config a different one."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"not a folder: {folder}")
    digest = hashlib.sha256()
    files = sorted(p for p in folder.rglob("*") if p.is_file()
                   and not any(part.startswith(".") for part in p.relative_to(folder).parts))
    for path in files:
        rel = path.relative_to(folder).as_posix()
        digest.update(f"{rel}\0{path.stat().st_size}\0".encode())
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]
