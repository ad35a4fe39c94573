"""The dedup stage on a Ray cluster: `rlhf dedup --engine ray [--address HOST:PORT]`.

Embedding runs as Ray Data `map_batches` over the prompts to embed (each worker loads the
encoder once, as a stateful actor); the close-pair range search runs as one Ray task per block
of query rows against the index built once on the driver and shared through the object store.
Connected components and exact linkage then run on the driver, as in the single-process path,
over the same index and so the same pairs: the clusters are the default path's.

Without `--address`, a local cluster of `workers` CPUs is started for the run and shut down after.
Ray is in the `scale` extra: `pip install -e .[scale]`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Self

import numpy as np


class RayMissing(RuntimeError):
    """`ray` is not installed (the CLI prints the one-line message)."""


def _ray():
    try:
        import ray
    except ImportError:
        raise RayMissing("--engine ray needs Ray: pip install -e '.[scale]' (or pip install "
                         "'ray[data]')") from None
    return ray


class _Encoder:
    """A Ray Data actor: the sentence encoder loaded once per worker."""

    def __init__(self, model: str, batch_size: int):
        import os

        os.environ.setdefault("OMP_NUM_THREADS", "1")
        from rlhf.pipeline.dedup_embed import encode

        self.model, self.batch_size, self.encode = model, batch_size, encode

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        vecs = self.encode([str(t) for t in batch["text"]], self.model, self.batch_size)
        return {"row": batch["row"], "embedding": vecs}


def _pairs_task(state: dict, x: np.ndarray, rows: np.ndarray,
                threshold: float) -> tuple[np.ndarray, np.ndarray]:
    from rlhf.pipeline.ann import NeighbourIndex

    index = NeighbourIndex.from_state(state, x)
    i, j, _ = index.pairs_of(rows, threshold)
    return i, j


@dataclass
class RayEngine:
    address: str | None = None  # None: a local cluster for this run
    workers: int = 2  # embedding actors and search tasks in flight
    rows_per_task: int = 50_000
    stats: dict[str, Any] | None = None

    def __enter__(self) -> Self:
        ray = _ray()
        self._started = not ray.is_initialized()
        if self._started:
            kwargs: dict[str, Any] = {"address": self.address} if self.address else {
                "num_cpus": self.workers, "include_dashboard": False}
            ray.init(log_to_driver=False, configure_logging=False, **kwargs)
        self.stats = {"engine": "ray", "workers": self.workers,
                      "address": self.address or "local"}
        return self

    def __exit__(self, *exc: object) -> None:
        if self._started:
            _ray().shutdown()

    def encode(self, texts: list[str], cfg: Any,
               on_progress: Callable[[int], None] | None = None) -> np.ndarray:
        """Embeddings of `texts`, in order, from `workers` encoder actors."""
        import time

        import ray.data

        t0 = time.perf_counter()
        ds = ray.data.from_items([{"row": i, "text": t} for i, t in enumerate(texts)],
                                 override_num_blocks=max(self.workers, len(texts) // 2048 + 1))
        out = ds.map_batches(_Encoder, fn_constructor_args=(cfg.model, cfg.batch_size),
                             batch_size=max(cfg.batch_size * 16, 64), concurrency=self.workers,
                             num_cpus=1, batch_format="numpy")
        rows, vecs = [], []
        for batch in out.iter_batches(batch_format="numpy", batch_size=4096):
            rows.append(batch["row"])
            vecs.append(np.asarray(batch["embedding"], np.float32))
            if on_progress:
                on_progress(len(batch["row"]))
        x = np.empty((len(texts), vecs[0].shape[1] if vecs else 0), np.float32)
        if vecs:
            x[np.concatenate(rows)] = np.concatenate(vecs)
        wall = time.perf_counter() - t0
        self.stats.update({"embedded": len(texts), "embed_s": round(wall, 2),
                           "embed_per_worker_per_s": round(len(texts) / wall / self.workers, 1)
                           if wall else 0.0})
        return x

    def close_pairs(self, x: np.ndarray, cfg: Any) -> tuple[np.ndarray, np.ndarray]:
        """The pairs the single-process path finds: the same index (built here, once), searched
        by one task per block of rows."""
        ray = _ray()
        from rlhf.pipeline.ann import NeighbourIndex, _unique_pairs
        from rlhf.pipeline.dedup_cluster import index_params

        index = NeighbourIndex.build(x, index_params(cfg))
        state, xs = ray.put(index.state()), ray.put(index.x)
        task = ray.remote(num_cpus=1)(_pairs_task)
        blocks = [np.arange(a, min(len(x), a + self.rows_per_task))
                  for a in range(0, len(x), self.rows_per_task)]
        got = ray.get([task.remote(state, xs, rows, cfg.distance_threshold)
                       for rows in blocks])
        i = np.concatenate([g[0] for g in got]) if got else np.zeros(0, np.int64)
        j = np.concatenate([g[1] for g in got]) if got else np.zeros(0, np.int64)
        i, j, _ = _unique_pairs(i, j, np.zeros(len(i), np.float32))
        self.stats.update({"search_tasks": len(blocks)})
        return i, j
