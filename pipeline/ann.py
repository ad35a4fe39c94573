"""A nearest-neighbour index over unit embeddings (faiss): close pairs for dedup, neighbours for
the prompt scheduler.

    index = NeighbourIndex.build(x)            # (n, d) float32 unit rows
    sims, ids = index.search(q, k=8)           # cosine similarity, row ids (-1: none)
    i, j, sim = index.close_pairs(0.35)        # every pair found within cosine distance 0.35

Small sets (up to `exact_max_rows`) get a flat index: every search is exact. Larger ones get an
inverted file over a reduced space:

1. the rows are projected on their `dim` leading principal axes (faiss PCAMatrix, trained on a
   sample) and renormalised: what the index compares is the cosine in that space;
2. k-means (faiss, spherical, trained on a sample) gives about n / list_size lists; every row
   lives in the list of its nearest centre and *probes* its `probe` nearest lists;
3. close pairs come list by list: the rows that probe a list against the rows living in it, one
   matrix product each (faiss's flat range search: BLAS), kept when their reduced cosine is at
   least 1 - t - `margin`; every kept pair's cosine is then recomputed on the float rows, so no
   pair beyond t is ever reported.

A pair within t is therefore found when either member probes the other's list and the
projection moved its cosine by less than `margin`: the recall is a property of the data and of
(list_size, probe, dim, margin), measured by bench/bench_dedup.py. Why list by list rather than
faiss's own IVF range search: that scans each query's lists one query at a time, reading every
probed list from memory again (memory-bound: at 1M rows and 32 probes, ~8e9 row reads); grouped
by list, each list is read once and the work is a BLAS product (bench/data/dedup_*.json).
Why the reduced space: on 1M rows the products cost n²·probe·dim / list_size multiply-adds, and
64 of 384 dimensions cut that by 6 while a pair at cosine 0.65 moves by ~0.07 (1 sigma) in it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

QUERY_BLOCK = 65_536
PCA_SAMPLE = 65_536  # rows the projection is trained on


def _faiss():
    try:
        import faiss
    except ImportError:
        raise ImportError("the neighbour index needs faiss-cpu: pip install faiss-cpu") from None
    return faiss


@dataclass(frozen=True)
class IndexParams:
    list_size: int = 256  # target rows per inverted list
    probe: int = 32  # lists each row probes
    dim: int = 64  # dimensions the index compares in (PCA); 0 or >= d: the rows' own
    margin: float = 0.15  # cosine slack in that space before the float re-check
    train_per_list: int = 16  # k-means training rows per list (a sample of the rows)
    train_iterations: int = 6
    exact_max_rows: int = 4_096  # up to this many rows, a flat (exact) index
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.list_size, self.probe, self.train_per_list, self.train_iterations) < 1:
            raise ValueError("list_size, probe, train_per_list and train_iterations must be >= 1")
        if self.exact_max_rows < 0 or self.dim < 0 or not 0.0 <= self.margin < 2.0:
            raise ValueError("exact_max_rows >= 0, dim >= 0 and margin in [0, 2)")


class NeighbourIndex:
    """Inner-product (cosine, for unit rows) index over a fixed set of rows."""

    def __init__(self, x: np.ndarray, params: IndexParams, exact: bool, y: np.ndarray | None = None,
                 centres: np.ndarray | None = None, top: np.ndarray | None = None,
                 pca: tuple[np.ndarray, np.ndarray] | None = None):
        self.x = x  # (n, d) float32 unit rows
        self.params = params
        self.exact = exact
        self.y = y  # (n, dim) the rows in the index's space (None: x itself)
        self.centres = centres  # (lists, dim)
        self.top = top  # (n, probe) int32: each row's nearest lists, nearest first
        self.pca = pca  # (mean (d,), matrix (dim, d)) or None
        self._faiss_index = None  # for search(): built on first use

    @classmethod
    def build(cls, x: np.ndarray, params: IndexParams | None = None) -> NeighbourIndex:
        faiss = _faiss()
        params = params or IndexParams()
        x = np.ascontiguousarray(x, dtype=np.float32)
        n, d = x.shape
        if n <= params.exact_max_rows:
            return cls(x, params, exact=True)
        rng = np.random.default_rng(params.seed)
        pca = None
        if 0 < params.dim < d:
            mat = faiss.PCAMatrix(d, params.dim)
            mat.train(x[np.sort(rng.choice(n, size=min(n, PCA_SAMPLE), replace=False))])
            pca = (faiss.vector_to_array(mat.mean).astype(np.float32).reshape(-1) if mat.mean.size()
                   else np.zeros(d, np.float32),
                   faiss.vector_to_array(mat.A).astype(np.float32).reshape(params.dim, d))
        index = cls(x, params, exact=False, pca=pca)
        y = index._project(x)
        nlist = max(1, math.ceil(n / params.list_size))
        km = faiss.Kmeans(y.shape[1], nlist, niter=params.train_iterations, seed=params.seed,
                          spherical=True, max_points_per_centroid=params.train_per_list,
                          min_points_per_centroid=1, verbose=False)  # a sample, on purpose
        m = min(n, max(nlist, params.train_per_list * nlist))
        km.train(y[np.sort(rng.choice(n, size=m, replace=False))])
        quantizer = faiss.IndexFlatIP(y.shape[1])
        quantizer.add(km.centroids)
        p = min(params.probe, nlist)
        top = np.empty((n, p), np.int32)
        for a in range(0, n, QUERY_BLOCK):
            top[a:a + QUERY_BLOCK] = quantizer.search(y[a:a + QUERY_BLOCK], p)[1]
        index.y, index.centres, index.top = y, km.centroids, top
        return index

    def _project(self, x: np.ndarray) -> np.ndarray:
        """Rows in the index's space: projected on the leading axes, renormalised."""
        if self.pca is None:
            return np.ascontiguousarray(x, dtype=np.float32)
        mean, mat = self.pca
        out = np.empty((len(x), mat.shape[0]), np.float32)
        for a in range(0, len(x), QUERY_BLOCK):
            out[a:a + QUERY_BLOCK] = (x[a:a + QUERY_BLOCK] - mean) @ mat.T
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)

    def __len__(self) -> int:
        return len(self.x)

    # ----------------------------------------------------------------- k nearest (scheduler)
    def _search_index(self):
        faiss = _faiss()
        if self._faiss_index is None:
            if self.exact:
                index = faiss.IndexFlatIP(self.x.shape[1])
                index.add(self.x)
            else:
                quantizer = faiss.IndexFlatIP(self.y.shape[1])
                quantizer.add(self.centres)
                index = faiss.IndexIVFFlat(quantizer, self.y.shape[1], len(self.centres),
                                           faiss.METRIC_INNER_PRODUCT)
                index.is_trained = True
                own = np.ascontiguousarray(self.top[:, 0], dtype=np.int64)
                index.add_core(len(self.y), faiss.swig_ptr(self.y), None, faiss.swig_ptr(own))
                index.nprobe = self.top.shape[1]
                self._quantizer = quantizer  # the index does not own it: keep it alive
            self._faiss_index = index
        return self._faiss_index

    def search(self, q: np.ndarray, k: int, among: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """(similarities, row ids), each (len(q), k), best first; id -1 where fewer were found.
        `among` (row ids) restricts the answer to those rows (the scheduler's prompts that have
        a reward history), filtered inside the index's scan. The inverted file proposes
        4k candidates in its space; they are ranked by their float cosine."""
        faiss = _faiss()
        if k < 1:
            raise ValueError("k must be >= 1")
        q = np.ascontiguousarray(np.atleast_2d(q), dtype=np.float32)
        index = self._search_index()
        kk = min(k if self.exact else max(4 * k, 32), len(self))
        kwargs = {}
        if among is not None:
            sel = faiss.IDSelectorBatch(np.ascontiguousarray(among, dtype=np.int64))
            kwargs["params"] = (faiss.SearchParameters(sel=sel) if self.exact else
                                faiss.SearchParametersIVF(sel=sel, nprobe=index.nprobe))
        sims, ids = index.search(q if self.exact else self._project(q), kk, **kwargs)
        ids = ids.astype(np.int64)
        if not self.exact:  # rank the candidates by their float cosine
            cand = np.where(ids >= 0, ids, 0)
            sims = np.where(ids >= 0, np.einsum("qd,qkd->qk", q, self.x[cand]), -np.inf)
            order = np.lexsort((ids, -sims), axis=1)[:, :k]  # ties by row id
            sims = np.take_along_axis(sims, order, 1).astype(np.float32)
            ids = np.where(np.isfinite(sims), np.take_along_axis(ids, order, 1), -1)
        if ids.shape[1] < k:
            pad = k - ids.shape[1]
            sims = np.pad(sims, ((0, 0), (0, pad)), constant_values=-np.inf)
            ids = np.pad(ids, ((0, 0), (0, pad)), constant_values=-1)
        return sims, ids

    # ----------------------------------------------------------------- close pairs (dedup)
    def pairs_of(self, rows: np.ndarray, threshold: float) -> tuple[np.ndarray, ...]:
        """Pairs (i, j, similarity), i < j, within cosine distance t, found by the probes of
        `rows` (one of the two is in `rows`; a pair may come twice: `close_pairs` keeps each
        once)."""
        faiss = _faiss()
        min_sim = 1.0 - threshold
        rows = np.asarray(rows, np.int64)
        if self.exact:
            src_all, dst_all = [], []
            index = self._search_index()
            for a in range(0, len(rows), QUERY_BLOCK):
                qi = rows[a:a + QUERY_BLOCK]
                lims, _, found = index.range_search(self.x[qi], min_sim - 1e-4)
                src_all.append(np.repeat(qi, np.diff(lims).astype(np.int64)))
                dst_all.append(found.astype(np.int64))
            return self._recheck(np.concatenate(src_all), np.concatenate(dst_all), min_sim)
        sub_min = min_sim - self.params.margin
        own = self.top[:, 0]
        members = np.argsort(own, kind="stable")
        m_bounds = np.searchsorted(own[members], np.arange(len(self.centres) + 1))
        probed = self.top[rows].ravel()  # (len(rows) * probe,) lists, row-major
        order = np.argsort(probed, kind="stable")
        askers = rows[order // self.top.shape[1]]
        a_bounds = np.searchsorted(probed[order], np.arange(len(self.centres) + 1))
        dim = self.y.shape[1]
        out = [], [], []
        for lst in range(len(self.centres)):
            mem = members[m_bounds[lst]:m_bounds[lst + 1]]
            ask = askers[a_bounds[lst]:a_bounds[lst + 1]]
            if len(mem) == 0 or len(ask) == 0:
                continue
            # one product per list, thresholded in blocks inside faiss (its flat range search
            # measured faster here than numpy's product and a mask over the whole result)
            flat = faiss.IndexFlatIP(dim)
            flat.add(self.y[mem])
            lims, _, hit = flat.range_search(self.y[ask], sub_min)
            src = np.repeat(ask, np.diff(lims).astype(np.int64))
            for part, got in zip(out, self._recheck(src, mem[hit.astype(np.int64)], min_sim)):
                part.append(got)
        if not out[0]:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32)
        return tuple(np.concatenate(p) for p in out)

    def _recheck(self, src: np.ndarray, dst: np.ndarray, min_sim: float) -> tuple[np.ndarray, ...]:
        """(i < j, float cosine) of the candidate pairs within the threshold, self-pairs out."""
        keep = src != dst
        src, dst = src[keep], dst[keep]
        sim = np.einsum("ij,ij->i", self.x[src], self.x[dst])  # exact, float32
        ok = sim >= min_sim
        return np.minimum(src[ok], dst[ok]), np.maximum(src[ok], dst[ok]), sim[ok]

    def close_pairs(self, threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every pair (i < j) of indexed rows the index finds within cosine distance `threshold`."""
        i, j, s = self.pairs_of(np.arange(len(self)), threshold)
        return _unique_pairs(i, j, s)

    # The index travels to other processes (Ray workers) as plain arrays.
    def state(self) -> dict:
        return {"params": self.params, "exact": self.exact, "y": self.y, "centres": self.centres,
                "top": self.top, "pca": self.pca}

    @classmethod
    def from_state(cls, state: dict, x: np.ndarray) -> NeighbourIndex:
        return cls(x, state["params"], state["exact"], state["y"], state["centres"], state["top"],
                   state["pca"])


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
