"""Near-duplicate clustering of unit vectors for the dedup stage (pure numpy / scipy / sklearn,
no text: bench/bench_dedup.py calls these directly): exact agglomerative linkage, the index path
(exact linkage inside the components of the close-pair graph of pipeline/ann.py's index), the
partitioned path with its boundary merge, the representatives, the topic clusters, and planted
test data. pipeline/dedup.py's docstring explains the paths and why their clusters agree.

    python -c "import rlhf.pipeline.dedup_cluster as c; print(c.planted_unit_vectors(100)[0].shape)"
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from rlhf.pipeline.dedup_embed import normalize

if TYPE_CHECKING:
    from rlhf.pipeline.dedup import DedupConfig


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


def first_appearance(labels: np.ndarray) -> np.ndarray:
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
    return first_appearance(fcluster(z, t=threshold, criterion="distance"))


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
    return first_appearance(labels), info


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
    return first_appearance(labels), info


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
    return first_appearance(km.fit_predict(x))


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
    return normalize(x), first_appearance(group)
