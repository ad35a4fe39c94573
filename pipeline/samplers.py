"""Where PPO's prompts come from: the prompt list, and the samplers that draw each step's batch
(the difficulty stage reports the stratified sampler's coverage; the trainer draws from them).

`PromptSampler`: deterministic shuffled epochs. `StratifiedSampler` (pure, numpy only): batches
that cover every difficulty bucket and topic cluster (seed 000 §3.1 prompt diversity, §4.2),
built from the `difficulty` table by `StratifiedPromptSampler`. Every sampler's state is small
JSON that goes into the checkpoint, so a resumed run draws the same batches.

    python -c "from rlhf.pipeline.samplers import StratifiedSampler as S; \
print(S(list('abcdef'), ['low', 'mid', 'high'] * 2, [0, 1, 0, 1, 0, 1], 3).next_batch())"
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlhf.store.hashing import content_hash
from rlhf.store.io import read_table

FILL_MODES: tuple[str, ...] = ("even", "proportional")


def load_prompts(path: str | Path, split: str = "ppo") -> list[tuple[str, str]]:
    """(prompt_id, text) pairs from a `pool` table folder (rows of `split`) or a JSONL file of
    {"prompt_id"?, "text"} objects (prompt_id defaults to the text's content hash)."""
    path = Path(path)
    if path.is_dir():
        table = read_table("pool", path).to_pylist()
        rows = [(r["prompt_id"], r["text"]) for r in table if r["split"] == split]
    else:
        rows = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                obj = json.loads(line)
                rows.append((obj.get("prompt_id") or content_hash(obj["text"]), obj["text"]))
    if not rows:
        raise ValueError(f"no prompts in {path}" + (f" (split {split!r})" if path.is_dir() else ""))
    return sorted(rows)


@dataclass
class PromptSampler:
    """Deterministic epochs of shuffled prompts; its state is two integers (checkpointed)."""

    prompts: list[tuple[str, str]]
    seed: int
    epoch: int = 0
    position: int = 0

    def _order(self) -> list[int]:
        order = list(range(len(self.prompts)))
        random.Random(self.seed * 100_003 + self.epoch).shuffle(order)
        return order

    def next_batch(self, n: int) -> list[tuple[str, str]]:
        out, order = [], self._order()
        while len(out) < n:
            if self.position >= len(order):
                self.epoch, self.position = self.epoch + 1, 0
                order = self._order()
            out.append(self.prompts[order[self.position]])
            self.position += 1
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


class StratifiedPromptSampler:
    """Batches from the difficulty stage's sampler (pipeline/difficulty.py): every batch covers
    every difficulty bucket and topic cluster as evenly as the prompts allow (seed 000 §3.1
    prompt diversity, §4.2), as (prompt_id, text) pairs. Its state (JSON) goes into the checkpoint."""

    def __init__(self, prompts: list[tuple[str, str]], difficulty_rows: list[dict],
                 batch_size: int, seed: int):
        self.text = dict(prompts)
        rows = [r for r in difficulty_rows if r["prompt_id"] in self.text]
        missing = len(self.text) - len({r["prompt_id"] for r in rows})
        if missing:
            raise ValueError(f"{missing} of {len(self.text)} prompts have no row in the "
                             f"difficulty table: rerun the difficulty stage on this pool")
        self.sampler = sampler_from_table(rows, batch_size, seed)

    def next_batch(self, n: int) -> list[tuple[str, str]]:
        if n != self.sampler.batch_size:
            raise ValueError(f"the stratified sampler draws batches of {self.sampler.batch_size}")
        return [(pid, self.text[pid]) for pid in self.sampler.next_batch()]

    def state_dict(self) -> dict:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)


def strata(pool: str | Path, difficulty: str | Path) -> list[dict]:
    """(prompt_id, bucket, topic_cluster) per pool prompt: the topic cluster from the `pool`
    table (dedup stage), the difficulty bucket from the `difficulty` table (difficulty stage)."""
    if not Path(pool).is_dir():
        raise ValueError("stratified batches need --prompts to be a pool table folder")
    buckets = {r["prompt_id"]: r["bucket"] for r in
               read_table("difficulty", difficulty).select(["prompt_id", "bucket"]).to_pylist()}
    if not buckets:
        raise ValueError(f"no difficulty rows in {difficulty}")
    return [{"prompt_id": r["prompt_id"], "topic_cluster": r["topic_cluster"],
             "bucket": buckets[r["prompt_id"]]}
            for r in read_table("pool", pool).select(["prompt_id", "topic_cluster"]).to_pylist()
            if r["prompt_id"] in buckets]


class StratifiedSampler:
    """Batches of prompt ids that cover every difficulty bucket and every topic cluster.

    Each (bucket, cluster) cell of the pool keeps its own shuffled queue (a new shuffle each time
    it runs out). A batch is filled slot by slot with the next prompt of the best cell:

    1. coverage first: among the cells of the bucket or cluster not yet in the batch that has
       the fewest open cells, the one covering the most buckets/clusters not yet in the batch;
    2. `fill="even"` (default): the cell keeping this batch's bucket and cluster counts closest
       to even (count / fair share), then the counts over all batches so far (so clusters rotate
       when a batch is smaller than the number of clusters);
       `fill="proportional"`: the cell drawn least relative to its size, so that past coverage
       the batch mirrors the pool and every prompt is drawn at the same rate;
    3. the cell drawn least relative to its size, then a seeded random tie-break.

    Full coverage of every bucket and cluster present in the pool is reached whenever
    batch_size >= n_buckets + n_clusters - 1 (each slot covers at least one new one). "Even"
    is as even as the pool allows: a bucket with two prompts in all is drawn twice in every batch
    of six, so a rare bucket's prompts repeat across batches (use "proportional" to avoid that).
    No prompt repeats inside a batch unless the batch is larger than the pool.
    `state_dict()` / `load_state_dict()` make it resumable (JSON-serialisable).
    """

    def __init__(self, ids: Sequence[str], buckets: Sequence[str], clusters: Sequence[int],
                 batch_size: int, seed: int = 0, fill: str = "even"):
        if fill not in FILL_MODES:
            raise ValueError(f"fill must be one of {FILL_MODES}, got {fill!r}")
        self.fill = fill
        if not (len(ids) == len(buckets) == len(clusters)):
            raise ValueError("ids, buckets and clusters must have the same length")
        if len(ids) == 0:
            raise ValueError("the sampler needs at least one prompt")
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.ids = list(ids)
        self.batch_size = int(batch_size)
        self.seed = seed
        cells: dict[tuple[str, int], list[int]] = {}
        for i, (b, c) in enumerate(zip(buckets, clusters)):
            cells.setdefault((str(b), int(c)), []).append(i)
        self._keys = sorted(cells)
        self._members = [cells[k] for k in self._keys]
        self.buckets = sorted({k[0] for k in self._keys})
        self.clusters = sorted({k[1] for k in self._keys})
        self._rng = np.random.default_rng(seed)
        self._orders = [[int(x) for x in self._rng.permutation(m)] for m in self._members]
        self._pos = [0] * len(self._keys)
        self._cell_use = [0] * len(self._keys)
        self._bucket_use = {b: 0 for b in self.buckets}
        self._cluster_use = {c: 0 for c in self.clusters}
        self.batches_drawn = 0

    # -- drawing --------------------------------------------------------------------------

    def _take(self, cell: int, exclude: set[int]) -> int:
        """The cell's next prompt that is not in `exclude` (the cell must have one)."""
        for _ in range(2):
            order, pos = self._orders[cell], self._pos[cell]
            j = next((j for j in range(pos, len(order)) if order[j] not in exclude), None)
            if j is not None:
                order[pos], order[j] = order[j], order[pos]
                self._pos[cell] = pos + 1
                return int(order[pos])
            # the rest of this epoch is all in the batch: start the cell's next epoch
            self._orders[cell] = [int(x) for x in self._rng.permutation(self._members[cell])]
            self._pos[cell] = 0
        raise RuntimeError("cell has no prompt outside the batch")  # guarded by the caller

    def next_batch(self) -> list[str]:
        """The next batch of prompt ids."""
        size = self.batch_size
        share_b = size / len(self.buckets)
        share_c = size / len(self.clusters)
        in_batch: set[int] = set()
        used = [0] * len(self._keys)  # members of each cell already in this batch
        count_b = {b: 0 for b in self.buckets}
        count_c = {c: 0 for c in self.clusters}
        batch: list[int] = []
        noise = self._rng.random((size, len(self._keys)))
        for slot in range(size):
            open_cells = [k for k in range(len(self._keys)) if used[k] < len(self._members[k])]
            if not open_cells:  # the batch is larger than the pool: start over, repeats allowed
                in_batch.clear()
                used = [0] * len(self._keys)
                open_cells = list(range(len(self._keys)))

            def rank(cell: int) -> tuple:
                b, c = self._keys[cell]
                covers = (count_b[b] == 0) + (count_c[c] == 0)
                drawn = self._cell_use[cell] / len(self._members[cell])  # epochs of the cell
                if self.fill == "proportional":
                    return (-covers, round(drawn, 9), noise[slot, cell])
                load = count_b[b] / share_b + count_c[c] / share_c
                history = self._bucket_use[b] / share_b + self._cluster_use[c] / share_c
                return (-covers, round(load, 9), round(history, 9), round(drawn, 9),
                        noise[slot, cell])

            # coverage: serve the most constrained uncovered bucket or cluster first (the one with
            # the fewest open cells), so a scarce bucket is not left without a slot
            need: dict[tuple[str, Any], list[int]] = {}
            for k in open_cells:
                b, c = self._keys[k]
                if count_b[b] == 0:
                    need.setdefault(("b", b), []).append(k)
                if count_c[c] == 0:
                    need.setdefault(("c", c), []).append(k)
            if need:
                slots_left = size - slot

                def urgency(item: tuple[tuple[str, Any], list[int]]) -> tuple:
                    (kind, v), cells = item
                    use = (self._bucket_use[v] / share_b if kind == "b"
                           else self._cluster_use[v] / share_c)
                    # scarcity matters only while every uncovered one can still get a slot;
                    # otherwise (batch smaller than the pool's variety) the least used rotates in
                    scarce = len(cells) if slots_left >= len(need) else 0
                    return (scarce, round(use, 9), kind, str(v))

                open_cells = min(need.items(), key=urgency)[1]
            best = min(open_cells, key=rank)
            item = self._take(best, in_batch)
            b, c = self._keys[best]
            count_b[b] += 1
            count_c[c] += 1
            used[best] += 1
            self._cell_use[best] += 1
            self._bucket_use[b] += 1
            self._cluster_use[c] += 1
            in_batch.add(item)
            batch.append(item)
        self.batches_drawn += 1
        return [self.ids[i] for i in batch]

    def __iter__(self):
        while True:
            yield self.next_batch()

    # -- checkpointing --------------------------------------------------------------------

    def _signature(self) -> str:
        h = hashlib.sha256()
        for key, members in zip(self._keys, self._members):
            h.update(json.dumps([key[0], key[1], [self.ids[m] for m in members]]).encode())
        return h.hexdigest()

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the same sequence of batches (JSON-serialisable)."""
        return {
            "signature": self._signature(),
            "batch_size": self.batch_size,
            "rng": self._rng.bit_generator.state,
            "orders": [[int(x) for x in o] for o in self._orders],
            "positions": list(self._pos),
            "cell_use": list(self._cell_use),
            "bucket_use": dict(self._bucket_use),
            "cluster_use": {str(k): v for k, v in self._cluster_use.items()},
            "batches_drawn": self.batches_drawn,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a `state_dict()`; the pool (ids, buckets, clusters) must be the same."""
        if state.get("signature") != self._signature():
            raise ValueError("sampler state was saved for a different pool (ids/buckets/clusters)")
        self.batch_size = int(state["batch_size"])
        self._rng.bit_generator.state = state["rng"]
        self._orders = [list(o) for o in state["orders"]]
        self._pos = list(state["positions"])
        self._cell_use = list(state["cell_use"])
        self._bucket_use = dict(state["bucket_use"])
        self._cluster_use = {int(k): v for k, v in state["cluster_use"].items()}
        self.batches_drawn = int(state["batches_drawn"])


def coverage(batch_ids: Sequence[str], bucket_by_id: dict[str, str],
             cluster_by_id: dict[str, int]) -> dict[str, Any]:
    """Which buckets and clusters a batch covers, and its per-bucket / per-cluster counts."""
    bc: dict[str, int] = {}
    cc: dict[int, int] = {}
    for pid in batch_ids:
        bc[bucket_by_id[pid]] = bc.get(bucket_by_id[pid], 0) + 1
        cc[cluster_by_id[pid]] = cc.get(cluster_by_id[pid], 0) + 1
    return {"buckets": bc, "clusters": cc}


def sampler_from_table(rows: Sequence[dict[str, Any]], batch_size: int, seed: int = 0,
                       fill: str = "even") -> StratifiedSampler:
    """A sampler over rows of the `difficulty` table (prompt_id, bucket, topic_cluster)."""
    rows = sorted(rows, key=lambda r: r["prompt_id"])
    return StratifiedSampler([r["prompt_id"] for r in rows], [r["bucket"] for r in rows],
                             [int(r["topic_cluster"]) for r in rows], batch_size, seed, fill)
