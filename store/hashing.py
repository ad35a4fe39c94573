"""Stable content hashes for texts: sha256 over NFC-normalised UTF-8 (ARCHITECTURE: "The store").

    python -c "from rlhf.store.hashing import content_hash; print(content_hash('hello'))"
"""

from __future__ import annotations

import hashlib
import unicodedata


def content_hash(text: str) -> str:
    """Hex sha256 of the NFC-normalised UTF-8 bytes of `text`.

    NFC makes visually identical strings (composed "é" vs "e" + combining accent) hash the same,
    so a prompt keeps its id whichever editor or dataset wrote it.
    """
    if not isinstance(text, str):
        raise TypeError(f"content_hash expects str, got {type(text).__name__}")
    return hashlib.sha256(unicodedata.normalize("NFC", text).encode("utf-8")).hexdigest()
