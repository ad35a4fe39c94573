"""Difficulty scores 0-10 per pool prompt, and the stratified batch sampler PPO draws batches with.

Seed 000 §4.2 layer three: the baseline (SFT) policy answers every pool prompt once; from the
response length (tokens), the standard deviation of its token log-probabilities and the reward
model's score, a weighted composite scaled to 0-10 is the prompt's difficulty, bucketed
low 0-3 / mid 4-6 / high 7-10. Seed 000 §3.1 level one: every rollout batch covers every
difficulty bucket and every topic cluster, as evenly as the pool allows (`StratifiedSampler`).

    rlhf difficulty --pool artifacts/store/pool --policy artifacts/models/sft \
        --reward-model artifacts/models/rm_strong --out artifacts/store/difficulty \
        --metrics artifacts/metrics/difficulty.json

The composite, the buckets and the sampler are pure (numpy only); the stage's `run` imports torch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

BUCKETS: tuple[str, ...] = ("low", "mid", "high")
FILL_MODES: tuple[str, ...] = ("even", "proportional")


@dataclass(frozen=True)
class DifficultyConfig:
    """params.yaml `difficulty`: weights of the composite and the baseline's generation."""

    w_length: float = 1.0  # weight of the response length (longer = harder)
    w_logprob_std: float = 1.0  # weight of the std of token log-probs (policy unsure = harder)
    w_rm: float = 1.0  # weight of the RM score (lower score = harder)
    clip_quantile: float = 0.05  # each feature is min-max scaled between its q and 1-q quantiles
    max_new_tokens: int = 48
    temperature: float = 1.0  # the baseline samples, so log-probs show its uncertainty
    top_p: float = 1.0
    batch_size: int = 64  # generation / scoring batch
    seed: int = 0
    sampler_batch_size: int = 16  # the sampler's default batch size in the coverage report

    def __post_init__(self):
        if min(self.w_length, self.w_logprob_std, self.w_rm) < 0:
            raise ValueError("weights must be >= 0")
        if self.w_length + self.w_logprob_std + self.w_rm <= 0:
            raise ValueError("at least one weight must be > 0")
        if not 0.0 <= self.clip_quantile < 0.5:
            raise ValueError("clip_quantile must be in [0, 0.5)")


# ---------------------------------------------------------------------------------------------
# The composite (pure)


def scale_feature(values: Sequence[float], clip_quantile: float = 0.0) -> np.ndarray:
    """Min-max scale to [0, 1] between the q and 1-q quantiles (clipped); constant -> 0.5."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return x
    lo, hi = np.quantile(x, [clip_quantile, 1.0 - clip_quantile])
    if hi - lo <= 1e-12:
        return np.full_like(x, 0.5)
    return np.clip((x - lo) / (hi - lo), 0.0, 1.0)


def difficulty_scores(lengths: Sequence[float], logprob_stds: Sequence[float],
                      rm_scores: Sequence[float], w_length: float = 1.0,
                      w_logprob_std: float = 1.0, w_rm: float = 1.0,
                      clip_quantile: float = 0.0) -> np.ndarray:
    """Difficulty in [0, 10] per prompt: 10 * weighted mean of the scaled features.

    Long responses, spread-out token log-probs (the policy is unsure) and a low RM score all make
    a prompt harder, so the RM score enters as 1 - scaled score. The composite is then min-max
    scaled over the pool, so the easiest prompt scores 0 and the hardest 10 (seed 000 §4.2: 0-10).
    """
    n = len(lengths)
    if not (len(logprob_stds) == len(rm_scores) == n):
        raise ValueError("lengths, logprob_stds and rm_scores must have the same length")
    if n == 0:
        return np.zeros(0)
    weights = np.array([w_length, w_logprob_std, w_rm], dtype=np.float64)
    if (weights < 0).any() or weights.sum() <= 0:
        raise ValueError("weights must be >= 0 with a positive sum")
    feats = np.stack([
        scale_feature(lengths, clip_quantile),
        scale_feature(logprob_stds, clip_quantile),
        1.0 - scale_feature(rm_scores, clip_quantile),
    ])
    composite = weights @ feats / weights.sum()
    return 10.0 * scale_feature(composite, 0.0) if np.ptp(composite) > 1e-12 else np.full(n, 5.0)


def bucket_of(score: float) -> str:
    """low 0-3, mid 4-6, high 7-10 (seed 000 §4.2), on the score rounded half up to an integer."""
    level = int(np.floor(float(score) + 0.5))
    if level <= 3:
        return "low"
    if level <= 6:
        return "mid"
    return "high"


# ---------------------------------------------------------------------------------------------
# The stratified batch sampler (pure)


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


# ---------------------------------------------------------------------------------------------
# The stage


def _pool_rows(pool_dir, demos_path) -> tuple[list[dict[str, Any]], str]:
    """Pool prompts (prompt_id, text, split, topic_cluster), or the demonstrations' prompts with
    their topic as the cluster when there is no pool."""
    if pool_dir is not None and Path(pool_dir).is_dir():
        from rlhf.store.io import read_table

        rows = read_table("pool", pool_dir).select(
            ["prompt_id", "text", "split", "topic_cluster"]).to_pylist()
        return sorted(rows, key=lambda r: r["prompt_id"]), "pool"
    if demos_path is None:
        raise ValueError("give --pool (a pool table folder) or --demos")
    from rlhf.pipeline.sft import read_demonstrations
    from rlhf.pipeline.text import clean
    from rlhf.store.hashing import content_hash

    topic_of: dict[str, str] = {}
    for r in read_demonstrations(demos_path):
        topic_of.setdefault(clean(r["prompt"]), str(r.get("topic", "")))
    topics = sorted(set(topic_of.values()))
    rows = [{"prompt_id": content_hash(t), "text": t, "split": "demonstrations",
             "topic_cluster": topics.index(topic)} for t, topic in topic_of.items()]
    return sorted(rows, key=lambda r: r["prompt_id"]), "demonstrations"


def run(cfg: DifficultyConfig, policy_dir: str | Path, reward_model: str | Path,
        out_dir: str | Path, pool_dir: str | Path | None = None,
        demos_path: str | Path | None = None, metrics_path: str | Path | None = None,
        progress=None) -> dict[str, Any]:
    """The `difficulty` stage: one baseline response per prompt, the composite, the buckets."""
    from rlhf.pipeline.policy import load_policy, quiet_hf, sample
    from rlhf.pipeline.reward.scorer import load_scorer
    from rlhf.store.io import staged_folders, write_shard, write_text_atomic

    quiet_hf()
    rows, source = _pool_rows(pool_dir, demos_path)
    if not rows:
        raise ValueError("no prompts to score")
    model, tok = load_policy(policy_dir)
    texts = [r["text"] for r in rows]
    outs = sample(model, tok, texts, n=1, max_new_tokens=cfg.max_new_tokens,
                  temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed,
                  batch_size=cfg.batch_size, progress=progress)
    samples = [o[0] for o in outs]
    scorer = load_scorer(reward_model, batch_size=cfg.batch_size)
    rm, _ = scorer(texts, [s.response for s in samples])
    lengths = [s.n_tokens for s in samples]
    stds = [s.logprob_std for s in samples]
    scores = difficulty_scores(lengths, stds, rm.tolist(), cfg.w_length, cfg.w_logprob_std,
                               cfg.w_rm, cfg.clip_quantile)
    table = []
    for r, n, sd, q, sc in zip(rows, lengths, stds, rm.tolist(), scores.tolist()):
        table.append({"prompt_id": r["prompt_id"], "text": r["text"], "split": r["split"],
                      "topic_cluster": int(r["topic_cluster"]), "length": int(n),
                      "logprob_std": float(sd), "rm_score": float(q), "score": float(sc),
                      "bucket": bucket_of(sc)})
    out_dir = Path(out_dir)
    with staged_folders([out_dir]) as staged:  # the old table stays whole until the new one is
        write_shard("difficulty", table, staged[out_dir] / "part-00000.parquet")

    bucket_counts = {b: sum(t["bucket"] == b for t in table) for b in BUCKETS}
    sampler = sampler_from_table(table, cfg.sampler_batch_size, cfg.seed)
    by_b = {t["prompt_id"]: t["bucket"] for t in table}
    by_c = {t["prompt_id"]: t["topic_cluster"] for t in table}
    n_b = sum(v > 0 for v in bucket_counts.values())
    n_c = len(set(by_c.values()))
    full = 0
    n_batches = 20
    for _ in range(n_batches):
        cov = coverage(sampler.next_batch(), by_b, by_c)
        full += len(cov["buckets"]) == n_b and len(cov["clusters"]) == n_c
    corr = np.corrcoef(np.array([lengths, stds, rm.tolist()]), scores) if len(table) > 2 else None
    metrics = {
        "prompt_source": source,
        "n_prompts": len(table),
        "bucket_counts": bucket_counts,
        "n_topic_clusters": n_c,
        "mean_score": float(np.mean(scores)),
        "mean_length": float(np.mean(lengths)),
        "mean_logprob_std": float(np.mean(stds)),
        "mean_rm_score": float(rm.mean()),
        "corr_score_length": float(corr[0, 3]) if corr is not None else None,
        "corr_score_logprob_std": float(corr[1, 3]) if corr is not None else None,
        "corr_score_rm": float(corr[2, 3]) if corr is not None else None,
        "sampler_batch_size": cfg.sampler_batch_size,
        "sampler_full_coverage_share": full / n_batches,
    }
    metrics = {k: (None if isinstance(v, float) and v != v else v) for k, v in metrics.items()}
    if metrics_path:
        write_text_atomic(metrics_path, json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    return metrics
