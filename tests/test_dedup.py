"""Dedup: exact and partitioned agglomerative clustering, representatives, the similar library,
the embedding cache, topics and splits, on planted vectors, the world and real hh-rlhf prompts."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from rlhf.cli.app import app
from rlhf.pipeline.config import ConfigError, build
from rlhf.pipeline.dedup import DedupConfig, DedupError, run_dedup, split_of
from rlhf.pipeline.dedup_cluster import (
    cluster,
    condensed_cosine,
    exact_labels,
    kept_agreement,
    partitioned_labels,
    planted_unit_vectors,
    representatives,
    topic_clusters,
)
from rlhf.pipeline.ingest import IngestConfig, run_ingest
from rlhf.store import content_hash
from rlhf.store.io import read_table
from test_ingest import write_world_sources
from typer.testing import CliRunner


def _same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    """Two labelings describe the same clusters (up to renaming)."""
    pairs = set(zip(a.tolist(), b.tolist()))
    return len(pairs) == len(set(a.tolist())) == len(set(b.tolist()))


# ---------------------------------------------------------------------------------------------
# Clustering on planted unit vectors (no model).

def test_condensed_matches_scipy_pdist():
    from scipy.spatial.distance import pdist

    x, _ = planted_unit_vectors(300, dim=32, seed=2)
    ref = pdist(x.astype(np.float64), "cosine")
    assert np.abs(condensed_cosine(x) - ref).max() < 1e-5
    assert np.abs(condensed_cosine(x, block=7)[: len(ref)] - ref).max() < 1e-5


def test_exact_linkage_recovers_planted_groups():
    x, groups = planted_unit_vectors(800, seed=3)
    labels = exact_labels(x, 0.35, "complete")
    assert _same_partition(labels, groups)
    assert len(set(groups.tolist())) < 800  # there were near-duplicates to find
    # complete linkage: no two members of a cluster further apart than the threshold
    for c in np.flatnonzero(np.bincount(labels) > 1)[:50]:
        m = x[labels == c]
        assert (1.0 - m @ m.T).max() <= 0.35 + 1e-6


def test_partitioned_agrees_with_exact_and_merges_split_groups():
    x, _ = planted_unit_vectors(3000, seed=4)
    lengths = np.random.default_rng(0).integers(5, 200, len(x))
    exact = exact_labels(x, 0.35, "complete")
    part, info = partitioned_labels(x, 0.35, "complete", partition_size=200, merge_partitions=3,
                                    seed=0)
    assert info.partitions >= 10 and info.largest_partition <= 400  # memory: no n x n matrix
    assert info.merges > 0  # some planted groups were split by a partition boundary ...
    no_merge, _ = partitioned_labels(x, 0.35, "complete", 200, merge_partitions=0, seed=0)
    agree = kept_agreement(exact, part, lengths)
    agree_without = kept_agreement(exact, no_merge, lengths)
    print(f"kept/dropped agreement with exact linkage on 3,000 planted vectors: {agree:.4f} "
          f"(without the merge step {agree_without:.4f})")
    assert agree >= 0.99
    assert agree > agree_without  # ... and the merge step put them back together


def test_cluster_switches_path_at_exact_max_size():
    x, _ = planted_unit_vectors(600, seed=5)
    small = DedupConfig(exact_max_size=1000)
    big = DedupConfig(exact_max_size=100)
    la, ia = cluster(x, small)
    lb, ib = cluster(x, big)
    assert (ia.path, ib.path) == ("exact", "index") and ib.components > 1
    assert _same_partition(la, lb)  # 600 rows: a flat (exact) index finds every close pair


def test_representative_is_the_median_length_member():
    labels = np.array([0, 0, 0, 1, 1, 2])
    lengths = np.array([5, 1, 9, 4, 2, 7])
    # cluster 0: lengths 1, 5, 9 -> the 5 (row 0); cluster 1: 2, 4 -> lower median 2 (row 4)
    assert representatives(labels, lengths).tolist() == [0, 4, 5]
    keys = np.array(["b", "a", "c", "z", "y", "q"])
    tie = np.array([3, 3, 3, 3, 3, 3])
    assert representatives(labels, tie, keys).tolist() == [0, 4, 5]  # ties broken by key


def test_split_is_stable_and_follows_fractions():
    fr = {"reward": 0.3, "ppo": 0.5, "eval": 0.2}
    ids = [content_hash(str(i)) for i in range(6000)]
    splits = [split_of(i, fr, "s") for i in ids]
    assert splits == [split_of(i, fr, "s") for i in ids]
    share = Counter(splits)
    for name, f in fr.items():
        assert abs(share[name] / len(ids) - f) < 0.03
    assert splits != [split_of(i, fr, "other salt") for i in ids]
    assert {split_of(i, {"reward": 0.0, "ppo": 1.0}, "s") for i in ids[:100]} == {"ppo"}


def test_topic_clusters_find_separated_topics():
    rng = np.random.default_rng(0)
    centres = np.eye(16, dtype=np.float32)[:3]
    x = np.repeat(centres, 20, axis=0) + 0.05 * rng.standard_normal((60, 16), dtype=np.float32)
    topics = topic_clusters(x, k=3, seed=0)
    assert _same_partition(topics, np.repeat(np.arange(3), 20))
    assert topic_clusters(x[:2], k=8, seed=0).tolist() == [0, 1]  # k capped at n


def test_config_rejects_bad_fractions_and_linkage():
    with pytest.raises(ConfigError, match="sum to 1"):
        build(DedupConfig, {"split_fractions": {"reward": 0.5, "ppo": 0.6}}, "dedup")
    with pytest.raises(ConfigError, match="linkage"):
        build(DedupConfig, {"linkage": "ward"}, "dedup")


# ---------------------------------------------------------------------------------------------
# The stage, with the real MiniLM encoder on a few hundred short prompts.

PROMPTS = [
    "How do I bake sourdough bread at home?",
    "What's the best way to bake sourdough bread at home?",
    "How can I bake a loaf of sourdough bread at home?",
    "How do I bake sourdough bread at home?",  # an exact duplicate
    "Explain how photosynthesis works.",
    "Can you explain the process of photosynthesis?",
    "What is the capital of Australia?",
    "Write a short poem about the sea.",
    "List three uses of copper in electronics.",
]


def _store_with(tmp_path: Path, texts: list[str]) -> Path:
    src = tmp_path / "src" / "human.jsonl"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text("".join(json.dumps({"text": t, "source_type": "human", "writer_id": "w",
                                       "written_at": "2026-01-02"}) + "\n" for t in texts))
    run_ingest([src.parent], tmp_path / "store", IngestConfig())
    return tmp_path / "store"


def _tables(store: Path) -> tuple[list[dict], list[dict]]:
    return (read_table("pool", store / "pool").to_pylist(),
            read_table("similar", store / "similar").to_pylist())


def test_run_dedup_pool_similar_cache_and_rerun(tmp_path):
    store = _store_with(tmp_path, PROMPTS)
    cache = tmp_path / "cache"
    cfg = DedupConfig(topic_clusters=3)
    res = run_dedup(store, cfg, cache)
    pool, similar = _tables(store)
    assert len(pool) + len(similar) == len(PROMPTS) == res.input_prompts
    assert res.embed["embedded_new"] == len(set(PROMPTS)) and res.unique_texts == len(PROMPTS) - 1
    by_text = {r["text"]: r for r in pool + similar}
    bread = {by_text[t]["dedup_cluster"] for t in PROMPTS[:4]}
    photo = {by_text[t]["dedup_cluster"] for t in PROMPTS[4:6]}
    assert len(bread) == 1 and len(photo) == 1 and bread != photo
    assert len({by_text[t]["dedup_cluster"] for t in PROMPTS[6:]}) == 3
    pool_ids = {r["prompt_id"] for r in pool}
    rep = next(r for r in pool if r["dedup_cluster"] in bread)
    assert rep["cluster_size"] == 4
    # median length of the 4 bread prompts (lower median), the exact duplicate counted twice
    lengths = sorted(len(t) for t in PROMPTS[:4])
    assert len(rep["text"]) == lengths[1]
    for s in similar:
        assert s["representative_id"] in pool_ids and 0.0 <= s["distance"] <= 0.35
    assert {r["split"] for r in pool} <= {"reward", "ppo", "eval"}
    assert {r["topic_cluster"] for r in pool} <= {0, 1, 2}
    first = (pool, similar)

    again = run_dedup(store, cfg, cache)  # everything from the cache, same tables
    assert again.embed["embedded_new"] == 0 and again.embed["embedded_cached"] == len(set(PROMPTS))
    assert _tables(store) == first
    store = _store_with(tmp_path, PROMPTS + ["Why is the sky blue during the day?"])
    third = run_dedup(store, cfg, cache)
    assert third.embed["embedded_new"] == 1  # only the new prompt is embedded
    assert len(list(cache.glob("*.parquet"))) == 2


def test_world_duplicates_collapse_and_nothing_is_lost(tmp_path):
    sources, truth, counts = write_world_sources(tmp_path / "world", seed=3, n_lines=700)
    run_ingest([sources], tmp_path / "store", IngestConfig())
    res = run_dedup(tmp_path / "store", DedupConfig(), None)
    pool, similar = _tables(tmp_path / "store")
    assert len(pool) + len(similar) == counts["clean_rows"] == res.input_prompts
    cluster_of = {(r["source_file"], r["source_line"]): r["dedup_cluster"] for r in pool + similar}
    found = Counter()
    for t in truth:
        if t["dup_of"]:
            same = cluster_of[(t["file"], t["line"])] == cluster_of[(t["dup_of"]["file"],
                                                                   t["dup_of"]["line"])]
            found[(t["dup_kind"], same)] += 1
    print(f"world duplicates in their original's cluster: {dict(found)}")
    assert found[("exact", False)] == 0 and found[("exact", True)] > 0
    assert found[("paraphrase", True)] >= 0.97 * (found[("paraphrase", True)]
                                                   + found[("paraphrase", False)])
    # distinct questions stay apart: few clusters hold two different original questions
    originals = {(t["file"], t["line"]) for t in truth if not t["expected"] and not t["dup_of"]}
    mixed = Counter(cluster_of[k] for k in originals)
    n_mixed = sum(n > 1 for n in mixed.values())
    print(f"world: {n_mixed} of {len(mixed)} clusters hold two or more distinct questions")
    assert n_mixed <= 0.03 * len(originals)  # the world keeps distinct questions > 0.35 apart


def test_cli_dedup_and_clean_errors(tmp_path):
    store = _store_with(tmp_path, PROMPTS[:5])
    metrics, report = tmp_path / "m" / "dedup.json", tmp_path / "r" / "dedup.json"
    out = CliRunner().invoke(app, ["dedup", "--store", str(store), "--cache", str(tmp_path / "c"),
                                   "--metrics", str(metrics), "--report", str(report)])
    assert out.exit_code == 0, out.output
    m = json.loads(metrics.read_text())  # the headline figures
    assert m["input_prompts"] == m["kept"] + m["similar"] == 5 and m["invariant_holds"]
    assert "path" not in m and json.loads(report.read_text())["path"] == "exact"
    assert m["clusters"] == m["kept"]
    bad = CliRunner().invoke(app, ["dedup", "--store", str(tmp_path / "nowhere")])
    assert bad.exit_code == 2 and "no prompts table" in bad.output
    assert "Traceback" not in bad.output
    with pytest.raises(DedupError):
        run_dedup(tmp_path / "nowhere", DedupConfig(), None)


# ---------------------------------------------------------------------------------------------
# Real data: hh-rlhf's many repeated first questions.

def test_realdata_hh_repeats_collapse_no_prompt_lost(realdata, tmp_path):
    # the first 1,000 dialogues plus every dialogue whose first question repeats (keeps the test
    # to ~1,000 embeddings; the full file is in bench/bench_dedup.py --real)
    import gzip

    from rlhf.pipeline.ingest import split_dialogue

    with gzip.open(realdata / "hh-rlhf__harmless-base_test.jsonl.gz") as fh:
        lines = fh.read().splitlines()
    first = [split_dialogue(json.loads(line)["chosen"])[0][1] for line in lines]
    count = Counter(first)
    keep = [line for i, line in enumerate(lines) if i < 1000 or count[first[i]] > 1]
    root = tmp_path
    (root / "hh.jsonl.gz").write_bytes(gzip.compress(b"\n".join(keep) + b"\n"))
    ingest = run_ingest([root / "hh.jsonl.gz"], root / "store", IngestConfig())
    assert ingest.input_rows == len(keep) == ingest.kept + ingest.rejected
    store = root / "store"
    res = run_dedup(store, DedupConfig(), root / "cache")
    pool, similar = _tables(store)
    assert len(pool) + len(similar) == ingest.kept == res.input_prompts  # no prompt lost
    texts = read_table("prompts", store / "prompts").column("text").to_pylist()
    repeated = [t for t, n in Counter(texts).items() if n > 1]
    assert len(repeated) > 50  # hh-rlhf asks the same first question many times
    cluster_of: dict[str, set[int]] = {}
    for r in pool + similar:
        cluster_of.setdefault(r["text"], set()).add(r["dedup_cluster"])
    assert all(len(cluster_of[t]) == 1 for t in repeated)  # every repeat in one cluster
    assert res.multi_member_clusters > len(repeated)  # and paraphrased repeats join them too
    print(f"hh-rlhf: {res.input_prompts} prompts ({res.unique_texts} distinct) -> pool "
          f"{res.kept} + similar {res.similar}; {res.multi_member_clusters} clusters")

    # the scalable path agrees with exact linkage on these real embeddings
    from rlhf.pipeline.dedup_embed import load_cache, resolve_model

    cached = load_cache(root / "cache", resolve_model(DedupConfig().model)[1])
    uniq = list(dict.fromkeys(texts))
    x = np.stack([cached[content_hash(t)] for t in uniq])
    lengths = np.array([len(t) for t in uniq])
    exact = exact_labels(x, 0.35, "complete")
    part, info = partitioned_labels(x, 0.35, "complete", partition_size=150, merge_partitions=3,
                                    seed=0)
    agree = kept_agreement(exact, part, lengths)
    print(f"hh-rlhf scalable vs exact: {agree:.4f} of {len(uniq)} prompts in the same kept/dropped "
          f"state ({info.partitions} partitions, {info.merges} boundary merges)")
    assert info.partitions >= 5 and agree >= 0.99


def test_pool_embeddings_are_the_clustered_vectors_and_can_be_rewritten_alone(tmp_path):
    """The PPO rollout scheduler's prompt space: one unit vector per pool prompt,
    the same from the stage and from `--pool-embeddings-only` (one cache, one code path)."""
    import shutil

    from rlhf.pipeline.dedup import load_pool_embeddings, write_pool_embeddings
    from rlhf.pipeline.dedup_embed import encode

    store = _store_with(tmp_path, PROMPTS)
    cache = tmp_path / "cache"
    cfg = DedupConfig(topic_clusters=3)
    run_dedup(store, cfg, cache)
    pool, _ = _tables(store)
    ids, x = load_pool_embeddings(store / "pool_embeddings")
    assert sorted(ids) == sorted(r["prompt_id"] for r in pool)
    assert np.allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)
    fresh = encode([next(r["text"] for r in pool if r["prompt_id"] == ids[0])], cfg.model, 8)
    assert float(fresh[0] @ x[0]) > 0.9999
    shutil.rmtree(store / "pool_embeddings")
    assert write_pool_embeddings(store, cfg, cache) == len(pool)
    ids2, x2 = load_pool_embeddings(store / "pool_embeddings")
    order = [ids2.index(p) for p in ids]
    assert np.allclose(x2[order], x, atol=1e-6)
