"""`rlhf dedup --engine ray`: embedding as Ray Data map_batches and the range search as Ray tasks
on a local 2-worker cluster give the same pool and similar library as the single-process path."""

from __future__ import annotations

import pytest
from rlhf.cli.app import app
from rlhf.pipeline.dedup import DedupConfig, run_dedup
from rlhf.pipeline.ingest import IngestConfig, run_ingest
from rlhf.store.io import read_table
from test_ingest import write_world_sources
from typer.testing import CliRunner


def _tables(store):
    pool = read_table("pool", store / "pool").to_pylist()
    similar = read_table("similar", store / "similar").to_pylist()
    return (sorted((r["prompt_id"], r["dedup_cluster"], r["cluster_size"]) for r in pool),
            sorted((r["prompt_id"], r["representative_id"]) for r in similar))


@pytest.mark.slow
def test_ray_engine_gives_the_default_paths_clusters(tmp_path):
    pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[scale]')")
    from rlhf.pipeline.dedup_ray import RayEngine

    sources, _, _ = write_world_sources(tmp_path / "world", seed=5, n_lines=400)
    stores = {}
    for name in ("local", "ray"):
        stores[name] = tmp_path / name / "store"
        run_ingest([sources], stores[name], IngestConfig())
    cfg = DedupConfig(exact_max_size=2)  # the index path, whatever the size
    local = run_dedup(stores["local"], cfg, tmp_path / "local" / "cache")
    with RayEngine(workers=2, rows_per_task=100) as engine:
        remote = run_dedup(stores["ray"], cfg, tmp_path / "ray" / "cache", engine=engine)
        stats = dict(engine.stats)
    assert local.info.path == remote.info.path == "index"
    assert local.similar > 0 and local.info.close_pairs == remote.info.close_pairs
    assert _tables(stores["local"]) == _tables(stores["ray"])
    assert stats["embedded"] == remote.unique_texts and stats["search_tasks"] > 1
    assert stats["embed_per_worker_per_s"] > 0


def test_cli_engine_errors_are_one_line(tmp_path):
    out = CliRunner().invoke(app, ["dedup", "--store", str(tmp_path), "--engine", "spark"])
    assert out.exit_code == 2 and "--engine must be local or ray" in out.output
    assert "Traceback" not in out.output


def test_cli_engine_ray_without_ray_names_the_extra(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    out = CliRunner().invoke(app, ["dedup", "--store", str(tmp_path), "--engine", "ray"])
    assert out.exit_code == 2 and "pip install -e '.[scale]'" in out.output
    assert "Traceback" not in out.output and len(out.output.strip().splitlines()) == 1
