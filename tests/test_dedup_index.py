"""The dedup index path: close pairs from the faiss neighbour index, connected components, exact
linkage inside each (the same clusters as exact scipy linkage), the oversized-component fallback,
and the neighbour API the prompt scheduler uses."""

from __future__ import annotations

import numpy as np
import pytest
from rlhf.pipeline.ann import IndexParams, NeighbourIndex, components
from rlhf.pipeline.dedup import DedupConfig
from rlhf.pipeline.dedup_cluster import (
    cluster,
    component_labels,
    exact_labels,
    kept_agreement,
    planted_unit_vectors,
)


def _same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    pairs = set(zip(a.tolist(), b.tolist()))
    return len(pairs) == len(set(a.tolist())) == len(set(b.tolist()))


def _true_pairs(x: np.ndarray, threshold: float) -> set[tuple[int, int]]:
    i, j = np.nonzero(np.triu(x @ x.T >= 1.0 - threshold, k=1))
    return set(zip(i.tolist(), j.tolist()))


def test_flat_index_finds_exactly_the_pairs_within_the_threshold():
    x, _ = planted_unit_vectors(1500, seed=1)
    index = NeighbourIndex.build(x, IndexParams(exact_max_rows=5000))
    assert index.exact
    i, j, s = index.close_pairs(0.35)
    assert set(zip(i.tolist(), j.tolist())) == _true_pairs(x, 0.35)
    assert (i < j).all() and (s >= 0.65).all()


def test_ivf_index_recall_and_no_false_pairs():
    x, _ = planted_unit_vectors(6000, seed=2)
    truth = _true_pairs(x, 0.35)
    index = NeighbourIndex.build(x, IndexParams(exact_max_rows=0, list_size=32, probe=32))
    assert not index.exact
    i, j, _ = index.close_pairs(0.35)
    found = set(zip(i.tolist(), j.tolist()))
    assert found <= truth  # every reported pair is re-checked on the float vectors
    assert len(found) >= 0.99 * len(truth)
    # fewer probes, fewer pairs found: the probe count is what buys recall
    few = NeighbourIndex.build(x, IndexParams(exact_max_rows=0, list_size=32, probe=1))
    assert len(few.close_pairs(0.35)[0]) < len(found)


@pytest.mark.parametrize("linkage", ["complete", "average", "single"])
def test_components_then_exact_linkage_equals_global_exact_linkage(linkage):
    x, _ = planted_unit_vectors(2500, seed=3, max_spread=0.2)
    cfg = DedupConfig(exact_max_size=2, linkage=linkage)
    labels, info = cluster(x, cfg)
    assert info.path == "index" and info.components > 100 and info.fallback_components == 0
    assert _same_partition(labels, exact_labels(x, 0.35, linkage))


def test_ivf_path_agrees_with_exact_linkage():
    x, _ = planted_unit_vectors(8000, seed=4)
    cfg = DedupConfig(exact_max_size=2, ann_list_size=32, ann_probe=32)
    labels, _ = cluster(x, cfg)  # 8,000 rows: above the flat index's 4,096, an IVF index
    lengths = np.random.default_rng(0).integers(5, 200, len(x))
    assert kept_agreement(labels, exact_labels(x, 0.35, "complete"), lengths) >= 0.999


def test_an_oversized_component_falls_back_to_the_partitioned_path():
    # one chain of rows, each within 0.35 of the next: a single component of 300 rows, not a
    # clique (a clique is one cluster under every linkage and needs no linkage run)
    rng = np.random.default_rng(5)
    steps = rng.standard_normal((300, 64)).astype(np.float32) * 0.1
    x = np.cumsum(steps, axis=0) + rng.standard_normal(64).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    i, j, _ = NeighbourIndex.build(x).close_pairs(0.35)
    assert len(set(components(len(x), i, j).tolist())) == 1 and len(i) < 300 * 299 // 2
    cfg = DedupConfig(component_max_size=100, partition_size=50)
    labels, info = component_labels(x, i, j, cfg)
    assert info.fallback_components == 1 and info.largest_component == 300
    for c in np.unique(labels):  # still complete linkage: every cluster within the threshold
        m = x[labels == c]
        assert (1.0 - m @ m.T).max() <= 0.35 + 1e-5
    big = DedupConfig(component_max_size=1000)
    assert component_labels(x, i, j, big)[1].fallback_components == 0


def test_neighbour_search_returns_the_true_nearest_rows():
    x, groups = planted_unit_vectors(10_000, seed=6)
    index = NeighbourIndex.build(x, IndexParams(probe=32))
    q = np.flatnonzero(np.bincount(groups)[groups] > 1)[:200]
    sims, ids = index.search(x[q], k=3)
    assert ids.shape == (200, 3) and (ids[:, 0] == q).all()  # each row's nearest is itself
    assert (groups[ids[:, 1]] == groups[q]).mean() >= 0.98  # then a member of its group
    assert (np.diff(sims, axis=1) <= 1e-6).all()  # best first
    small = NeighbourIndex.build(x[:5])
    s, ids = small.search(x[:1], k=8)
    assert ids[0, 5:].tolist() == [-1, -1, -1] and np.isneginf(s[0, 5:]).all()


def test_index_params_are_checked():
    with pytest.raises(ValueError, match="probe"):
        IndexParams(probe=0)
    with pytest.raises(ValueError, match="ann_probe"):
        DedupConfig(ann_probe=0)


@pytest.mark.parametrize("exact_max_rows", [100_000, 0])
def test_neighbour_search_among_a_subset(exact_max_rows):
    x, _ = planted_unit_vectors(6000, seed=7)
    index = NeighbourIndex.build(x, IndexParams(exact_max_rows=exact_max_rows, probe=64))
    among = np.arange(0, 6000, 3)  # the rows with history
    q = np.arange(60)
    _, ids = index.search(x[q], k=5, among=among)
    assert np.isin(ids[ids >= 0], among).all()
    brute = among[np.argsort(-(x[q] @ x[among].T), axis=1)[:, :5]]
    # a query with a near-duplicate in the subset (itself included) gets it first
    near = (x[q] @ x[among].T).max(axis=1) >= 0.65
    assert near.sum() >= 20 and (ids[near, 0] == brute[near, 0]).all()
    if exact_max_rows:
        assert (ids == brute).all()  # a flat index: exactly the brute-force answer
