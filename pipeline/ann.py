"""A nearest-neighbour index over unit embeddings (faiss): close pairs for dedup, neighbours for
the prompt scheduler.

    index = NeighbourIndex.build(x)            # (n, d) float32 unit rows
    sims, ids = index.search(q, k=8)           # cosine similarity, row ids (-1: none)
    i, j, sim = index.close_pairs(0.35)        # every pair found within cosine distance 0.35

Small sets (up to `exact_max_rows`) get a flat index: every search is exact. Larger ones get an
inverted-file index (faiss IVF-Flat): rows are bucketed by their nearest of about n / list_size
k-means centres (a flat quantizer: finding them costs n / list_size dot products a query), and a
search scans the `probe` buckets nearest the query. A pair is found when either member's probed
buckets hold the other, so the recall is a property of the data and (list_size, probe): the
dedup benchmark measures it (bench/bench_dedup.py). Every reported pair's similarity is recomputed
from the float vectors, so a pair within the threshold is never a false one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

QUERY_BLOCK = 65_536


def _faiss():
    try:
        import faiss
    except ImportError:
        raise ImportError("the neighbour index needs faiss-cpu: pip install faiss-cpu") from None
    return faiss


@dataclass(frozen=True)
class IndexParams:
    list_size: int = 32  # target rows per inverted list
    probe: int = 16  # lists scanned per query
    train_per_list: int = 16  # k-means training rows per list (a sample of the rows)
    train_iterations: int = 6
    exact_max_rows: int = 4_096  # up to this many rows, a flat (exact) index
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.list_size, self.probe, self.train_per_list, self.train_iterations) < 1:
            raise ValueError("list_size, probe, train_per_list and train_iterations must be >= 1")
        if self.exact_max_rows < 0:
            raise ValueError("exact_max_rows must be >= 0")


class NeighbourIndex:
    """Inner-product (cosine, for unit rows) index over a fixed set of rows."""

    def __init__(self, index, x: np.ndarray, params: IndexParams, exact: bool):
        self.index = index
        self.x = x
        self.params = params
        self.exact = exact

    @classmethod
    def build(cls, x: np.ndarray, params: IndexParams | None = None) -> NeighbourIndex:
        faiss = _faiss()
        params = params or IndexParams()
        x = np.ascontiguousarray(x, dtype=np.float32)
        n, d = x.shape
        if n <= params.exact_max_rows:
            index = faiss.IndexFlatIP(d)
            index.add(x)
            return cls(index, x, params, exact=True)
        nlist = max(1, math.ceil(n / params.list_size))
        # a flat quantizer: its batched searches are one BLAS product (an HNSW graph over the
        # centres measured 0.5 ms a query at 3,125 lists, slower than the product)
        quantizer = faiss.IndexFlatIP(d)
        index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
        index.cp.niter = params.train_iterations
        index.cp.max_points_per_centroid = params.train_per_list
        index.cp.seed = params.seed
        index.verbose = False
        rng = np.random.default_rng(params.seed)
        m = min(n, max(nlist, params.train_per_list * nlist))
        index.train(x[np.sort(rng.choice(n, size=m, replace=False))])
        index.add(x)
        index.nprobe = min(params.probe, nlist)
        return cls(index, x, params, exact=False)

    def __len__(self) -> int:
        return len(self.x)

    def search(self, q: np.ndarray, k: int, among: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """(similarities, row ids), each (len(q), k), best first; id -1 where fewer were found.
        `among` (row ids) restricts the answer to those rows (the scheduler's prompts that have
        a reward history), filtered inside the index's scan."""
        faiss = _faiss()
        if k < 1:
            raise ValueError("k must be >= 1")
        q = np.ascontiguousarray(np.atleast_2d(q), dtype=np.float32)
        kwargs = {}
        if among is not None:
            sel = faiss.IDSelectorBatch(np.ascontiguousarray(among, dtype=np.int64))
            kwargs["params"] = (faiss.SearchParameters(sel=sel) if self.exact else
                                faiss.SearchParametersIVF(sel=sel, nprobe=self.index.nprobe))
        sims, ids = self.index.search(q, min(k, len(self)), **kwargs)
        if k > len(self):
            pad = k - len(self)
            sims = np.pad(sims, ((0, 0), (0, pad)), constant_values=-np.inf)
            ids = np.pad(ids, ((0, 0), (0, pad)), constant_values=-1)
        return sims, ids.astype(np.int64)

    def pairs_of(self, rows: np.ndarray, threshold: float) -> tuple[np.ndarray, ...]:
        """Pairs (i, j, similarity), i < j, within cosine distance t, found by querying `rows`
        (one of the two is in `rows`; a pair may come twice: `close_pairs` keeps each once)."""
        min_sim = 1.0 - threshold
        out_i, out_j, out_s = [], [], []
        for a in range(0, len(rows), QUERY_BLOCK):
            qi = rows[a:a + QUERY_BLOCK]
            lims, _, found = self.index.range_search(self.x[qi], min_sim - 1e-4)
            src = np.repeat(qi, np.diff(lims).astype(np.int64))
            keep = src != found
            src, found = src[keep], found[keep].astype(np.int64)
            sim = np.einsum("ij,ij->i", self.x[src], self.x[found])  # exact, float32
            ok = sim >= min_sim
            # either member's probes may find the pair: both directions count
            out_i.append(np.minimum(src[ok], found[ok]))
            out_j.append(np.maximum(src[ok], found[ok]))
            out_s.append(sim[ok])
        if not out_i:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32)
        return np.concatenate(out_i), np.concatenate(out_j), np.concatenate(out_s)

    def close_pairs(self, threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every pair (i < j) of indexed rows the index finds within cosine distance `threshold`."""
        i, j, s = self.pairs_of(np.arange(len(self)), threshold)
        return _unique_pairs(i, j, s)

    # The index travels to other processes (Ray workers) as bytes.
    def to_bytes(self) -> np.ndarray:
        return _faiss().serialize_index(self.index)

    @classmethod
    def from_bytes(cls, blob: np.ndarray, x: np.ndarray, params: IndexParams) -> NeighbourIndex:
        faiss = _faiss()
        index = faiss.deserialize_index(blob)
        return cls(index, x, params, exact=len(x) <= params.exact_max_rows)


def _unique_pairs(i: np.ndarray, j: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, ...]:
    """Pairs sorted by (i, j), each once."""
    if len(i) == 0:
        return i, j, s
    code = i * (int(max(i.max(), j.max())) + 1) + j
    _, first = np.unique(code, return_index=True)
    return i[first], j[first], s[first]


def components(n: int, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """Connected-component label of each of n rows in the graph of pairs (i, j)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    graph = coo_matrix((np.ones(len(i), np.int8), (i, j)), shape=(n, n))
    return connected_components(graph, directed=False)[1].astype(np.int64)
