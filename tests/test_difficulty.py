"""The difficulty composite on hand-made inputs, the buckets, and the stratified sampler
(pipeline/samplers.py) whose coverage the stage reports."""

from __future__ import annotations

import json

import numpy as np
import pytest
from rlhf.pipeline.difficulty import bucket_of, difficulty_scores, scale_feature
from rlhf.pipeline.samplers import StratifiedSampler, coverage


def test_scale_feature_min_max_and_constant():
    assert scale_feature([2.0, 4.0, 6.0]).tolist() == [0.0, 0.5, 1.0]
    assert scale_feature([3.0, 3.0]).tolist() == [0.5, 0.5]


def test_composite_hand_made():
    # prompt 0: short, confident, high RM score -> easiest; prompt 2: long, unsure, low score.
    lengths = [10, 20, 30]
    stds = [0.5, 1.0, 1.5]
    rm = [2.0, 1.0, 0.0]
    s = difficulty_scores(lengths, stds, rm)
    assert s.tolist() == pytest.approx([0.0, 5.0, 10.0])
    assert [bucket_of(x) for x in s] == ["low", "mid", "high"]


def test_composite_weights_select_features():
    lengths = [10, 30, 20]
    stds = [1.5, 0.5, 1.0]
    rm = [0.0, 0.0, 0.0]  # constant: scaled to 0.5 for all, no influence on the ranking
    only_len = difficulty_scores(lengths, stds, rm, w_length=1, w_logprob_std=0, w_rm=0)
    only_std = difficulty_scores(lengths, stds, rm, w_length=0, w_logprob_std=1, w_rm=0)
    assert only_len.tolist() == pytest.approx([0.0, 10.0, 5.0])
    assert only_std.tolist() == pytest.approx([10.0, 0.0, 5.0])
    # equal weights on opposed features: length 0/1/.5 and std 1/0/.5 average to .5 each
    both = difficulty_scores(lengths, stds, rm, w_length=1, w_logprob_std=1, w_rm=0)
    assert both.tolist() == pytest.approx([5.0, 5.0, 5.0])
    # a 3:1 weight: composite = (3*len + std)/4 = .25, .75, .5 -> scaled 0, 10, 5
    mixed = difficulty_scores(lengths, stds, rm, w_length=3, w_logprob_std=1, w_rm=0)
    assert mixed.tolist() == pytest.approx([0.0, 10.0, 5.0])


def test_composite_rejects_bad_input():
    with pytest.raises(ValueError):
        difficulty_scores([1, 2], [1], [1, 2])
    with pytest.raises(ValueError):
        difficulty_scores([1], [1], [1], w_length=0, w_logprob_std=0, w_rm=0)


@pytest.mark.parametrize("score, bucket", [
    (0.0, "low"), (3.0, "low"), (3.49, "low"), (3.5, "mid"), (6.49, "mid"), (6.5, "high"),
    (10.0, "high"),
])
def test_bucket_edges(score, bucket):
    assert bucket_of(score) == bucket


def _pool(n_clusters=5, sizes=None, seed=0):
    rng = np.random.default_rng(seed)
    ids, buckets, clusters = [], [], []
    for c in range(n_clusters):
        for b in ("low", "mid", "high"):
            size = sizes[(b, c)] if sizes else int(rng.integers(2, 9))
            for k in range(size):
                ids.append(f"p{c}-{b}-{k}")
                buckets.append(b)
                clusters.append(c)
    return ids, buckets, clusters


def test_every_batch_covers_every_bucket_and_cluster():
    ids, buckets, clusters = _pool(n_clusters=5)
    by_b = dict(zip(ids, buckets))
    by_c = dict(zip(ids, clusters))
    sampler = StratifiedSampler(ids, buckets, clusters, batch_size=15, seed=1)
    for _ in range(20):
        batch = sampler.next_batch()
        assert len(batch) == 15 and len(set(batch)) == 15  # no repeat inside a batch
        cov = coverage(batch, by_b, by_c)
        assert set(cov["buckets"]) == {"low", "mid", "high"}
        assert set(cov["clusters"]) == set(range(5))
        # as even as possible: 15 = 3 x 5 per bucket, 3 per cluster
        assert sorted(cov["buckets"].values()) == [5, 5, 5]
        assert sorted(cov["clusters"].values()) == [3, 3, 3, 3, 3]


def test_uneven_pool_still_covers_and_balances():
    # the high bucket exists only in cluster 0; cluster 3 has only low prompts
    sizes = {(b, c): 0 for b in ("low", "mid", "high") for c in range(4)}
    sizes.update({("low", 0): 5, ("mid", 0): 5, ("high", 0): 2, ("low", 1): 9, ("mid", 1): 9,
                  ("low", 2): 6, ("mid", 2): 1, ("low", 3): 4})
    ids, buckets, clusters = _pool(n_clusters=4, sizes=sizes)
    by_b = dict(zip(ids, buckets))
    by_c = dict(zip(ids, clusters))
    sampler = StratifiedSampler(ids, buckets, clusters, batch_size=6, seed=0)  # = 3 + 4 - 1
    for _ in range(30):
        batch = sampler.next_batch()
        assert len(set(batch)) == 6
        cov = coverage(batch, by_b, by_c)
        assert set(cov["buckets"]) == {"low", "mid", "high"}
        assert set(cov["clusters"]) == {0, 1, 2, 3}
        # as even as this pool allows: two per bucket (both "high" prompts every time)
        assert sorted(cov["buckets"].values()) == [2, 2, 2]
    # "proportional" still covers everything, and past coverage every prompt gets its turn
    prop = StratifiedSampler(ids, buckets, clusters, batch_size=6, seed=0, fill="proportional")
    seen = set()
    for _ in range(40):
        batch = prop.next_batch()
        cov = coverage(batch, by_b, by_c)
        assert set(cov["buckets"]) == {"low", "mid", "high"}
        assert set(cov["clusters"]) == {0, 1, 2, 3}
        seen.update(batch)
    assert seen == set(ids)


def test_small_batches_rotate_clusters():
    ids, buckets, clusters = _pool(n_clusters=6, seed=3)
    sampler = StratifiedSampler(ids, buckets, clusters, batch_size=3, seed=0)
    by_c = dict(zip(ids, clusters))
    by_b = dict(zip(ids, buckets))
    counts = {c: 0 for c in range(6)}
    for _ in range(12):
        batch = sampler.next_batch()
        assert {by_b[p] for p in batch} == {"low", "mid", "high"}
        for p in batch:
            counts[by_c[p]] += 1
    assert set(counts.values()) == {6}  # 36 slots spread evenly over 6 clusters


def test_batch_larger_than_pool_repeats_only_when_needed():
    sampler = StratifiedSampler(["a", "b", "c"], ["low", "mid", "high"], [0, 0, 1], batch_size=5)
    batch = sampler.next_batch()
    assert len(batch) == 5 and set(batch) == {"a", "b", "c"}


def test_state_roundtrip_continues_the_same_sequence():
    ids, buckets, clusters = _pool(n_clusters=4, seed=5)
    a = StratifiedSampler(ids, buckets, clusters, batch_size=8, seed=7)
    for _ in range(3):
        a.next_batch()
    state = json.loads(json.dumps(a.state_dict()))  # it must survive a JSON checkpoint
    expected = [a.next_batch() for _ in range(5)]
    b = StratifiedSampler(ids, buckets, clusters, batch_size=8, seed=999)
    b.load_state_dict(state)
    assert [b.next_batch() for _ in range(5)] == expected
    other = StratifiedSampler(ids[:-1], buckets[:-1], clusters[:-1], batch_size=8)
    with pytest.raises(ValueError, match="different pool"):
        other.load_state_dict(state)


def test_same_seed_same_batches_different_seed_differs():
    ids, buckets, clusters = _pool(n_clusters=3, seed=2)
    first = [StratifiedSampler(ids, buckets, clusters, 9, seed=4).next_batch() for _ in range(2)]
    assert first[0] == first[1]
    assert StratifiedSampler(ids, buckets, clusters, 9, seed=5).next_batch() != first[0]


@pytest.mark.parametrize("seed", range(8))
def test_random_pools_covered_at_the_documented_batch_size(seed):
    rng = np.random.default_rng(seed)
    n_clusters = int(rng.integers(2, 8))
    sizes = {(b, c): int(rng.integers(0, 4)) for b in ("low", "mid", "high")
             for c in range(n_clusters)}
    ids, buckets, clusters = _pool(n_clusters=n_clusters, sizes=sizes)
    if not ids:
        return
    by_b = dict(zip(ids, buckets))
    by_c = dict(zip(ids, clusters))
    n_b, n_c = len(set(buckets)), len(set(clusters))
    for fill in ("even", "proportional"):
        sampler = StratifiedSampler(ids, buckets, clusters, n_b + n_c - 1, seed=seed, fill=fill)
        for _ in range(10):
            cov = coverage(sampler.next_batch(), by_b, by_c)
            assert len(cov["buckets"]) == n_b and len(cov["clusters"]) == n_c
