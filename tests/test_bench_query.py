"""bench/bench_query.py's synthetic history at a small size: it is written through the trainer's
own RolloutWriter (so a new rollout column breaks it here, not in the next benchmark run), its
runs carry the per-row draft counts, and every named audit runs over it and adds up."""

from __future__ import annotations

import sys

import pyarrow.dataset as ds
import pytest
from conftest import REPO
from rlhf.store.catalog import connect
from rlhf.store.query import list_audits, run_sql

sys.path.insert(0, str(REPO / "bench"))
import bench_query  # noqa: E402

ROWS = 20_000  # two rollouts a step over the bench's 10,000 steps


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench_store")
    bench_query.generate(root, ROWS)
    return root


def test_the_history_has_the_rows_asked_for_and_every_rollout_column(store):
    table = ds.dataset(store / "rollouts", format="parquet", partitioning="hive").to_table()
    assert table.num_rows == ROWS
    cols = bench_query.column_bytes(store / "rollouts")
    assert {"drafted", "accepted", "response_key", "prompt_key"} <= set(cols)
    by_run = table.group_by("run_id").aggregate([("drafted", "sum"), ("accepted", "sum")])
    sums = {r["run_id"]: (r["drafted_sum"], r["accepted_sum"]) for r in by_run.to_pylist()}
    assert sums["r1"] == sums["r2"] == (0, 0)  # no drafter
    for run in ("r3", "r4"):  # a drafter: proposals, some accepted, never more than proposed
        drafted, accepted = sums[run]
        assert drafted > 0 and 0 < accepted < drafted
    assert (table["accepted"].to_numpy() <= table["drafted"].to_numpy()).all()


def test_every_named_audit_runs_on_it_and_counts_add_up(store):
    con = connect(store, locked=True)
    out = {}
    for audit in list_audits():
        params = audit.bind(bench_query.AUDIT_ARGS.get(audit.name, []))
        cur = run_sql(con, audit.sql, params)
        names = [d[0] for d in cur.description]
        out[audit.name] = [dict(zip(names, row)) for row in cur.fetchall()]
    # economy and rewards: the per-bucket rows of every run hold every rollout once
    for name in ("economy", "rewards"):
        total = sum(r["rollouts"] for r in out[name] if r["breakdown"] == "bucket")
        assert total == ROWS, name
    assert sum(r["rollouts"] for r in out["sources"]) == ROWS
    # lineage of r3-6000: r1's steps to 2000, r2's to 4000, r3's to 6000 (two rows a step)
    lineage = {}
    for r in out["lineage"]:
        lineage[r["run_id"]] = lineage.get(r["run_id"], 0) + r["rollouts"]
    assert lineage == {"r1": 2 * 2000, "r2": 2 * 2000, "r3": 2 * 2000}
    assert out["rm"] and out["annotators"]
