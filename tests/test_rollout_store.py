"""The rollout store layout (store/rollouts.py): partitions, sorted whole-step shards, resume."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from rlhf.store.catalog import connect
from rlhf.store.hashing import prompt_key
from rlhf.store.io import shard_paths
from rlhf.store.rollouts import RolloutWriter, StepShardWriter, run_shards
from rlhf.store.schemas import TABLES
from synthetic_store import rollout_row


def _step_rows(run: str, step: int, n: int = 3, tiers: bool = False) -> list[dict]:
    """n rows of a step; `tiers`: of tiers 2, 1, 0 in turn (else all tier 1)."""
    return [rollout_row(run, step, f"p{i}", float(step), (step + 2 * i) % 3 if tiers else 1,
                        "light_rm", i=i) for i in range(n)]


def test_layout_is_partitioned_sorted_and_whole_steps(tmp_path):
    root = tmp_path / "rollouts"
    with RolloutWriter(root, "run-1", steps_per_bucket=10, rows_per_shard=7,
                       row_group_size=4) as w:
        for step in range(25):
            w.write(_step_rows("run-1", step, tiers=True))
    shards = run_shards(root, "run-1")
    assert {p.parent.name for _, _, p in shards} == {"step_bucket=0", "step_bucket=1", "step_bucket=2"}
    covered = []
    for first, last, path in shards:
        table = pq.read_table(path)
        steps = table.column("step").to_pylist()
        assert (min(steps), max(steps)) == (first, last)
        assert path.parent.name == f"step_bucket={first // 10}" and first // 10 == last // 10
        assert len(steps) == 3 * (last - first + 1)  # whole steps only
        meta = pq.ParquetFile(path).metadata
        sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        assert all(n <= 4 for n in sizes)
        # Each row group is a contiguous step range (the shard, read group by group, is sorted
        # by step): row-group min/max of step never overlap, what lets a step filter skip groups.
        col = table.column_names.index("step")
        bounds = [(meta.row_group(i).column(col).statistics.min,
                   meta.row_group(i).column(col).statistics.max) for i in range(meta.num_row_groups)]
        assert all(a[1] <= b[0] for a, b in zip(bounds, bounds[1:]))
        # Inside a row group rows are ordered by tier (the rm audit reads tier 2), then by
        # prompt_key (what the audits group and join by).
        keys = list(zip(table.column("tier").to_pylist(), table.column("prompt_key").to_pylist()))
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        for lo, n in zip(starts, sizes):
            assert keys[lo:lo + n] == sorted(keys[lo:lo + n])
            ids = table.column("prompt_id").to_pylist()[lo:lo + n]
            assert [k for _, k in keys[lo:lo + n]] == [prompt_key(p) for p in ids]
        covered += range(first, last + 1)
    assert covered == list(range(25))


def test_a_step_is_never_stored_twice(tmp_path):
    root = tmp_path / "rollouts"
    with RolloutWriter(root, "r", steps_per_bucket=5) as w:
        w.write(_step_rows("r", 1))
        w.write(_step_rows("r", 1, n=2))  # the same step in two batches: one shard
        w.write(_step_rows("r", 2))
        with pytest.raises(ValueError, match="backwards"):
            w.write(_step_rows("r", 1))
        with pytest.raises(ValueError, match="another run"):
            w.write(_step_rows("other", 3))
    assert [(f, la) for f, la, _ in run_shards(root, "r")] == [(1, 2)]
    again = RolloutWriter(root, "r")
    with pytest.raises(ValueError, match="already stored"):
        again.write(_step_rows("r", 2))
    again.write(_step_rows("r", 3))
    again.close()
    con = connect(tmp_path)
    assert con.execute("SELECT step, count(*) FROM rollouts GROUP BY step ORDER BY step").fetchall() == [
        (1, 5), (2, 3), (3, 3)]


def test_resume_after_drops_the_steps_to_redo(tmp_path):
    root = tmp_path / "rollouts"
    with RolloutWriter(root, "r", steps_per_bucket=100, rows_per_shard=6) as w:
        for step in range(1, 9):  # shards of two steps: 1-2, 3-4, 5-6, 7-8
            w.write(_step_rows("r", step))
    assert [(f, la) for f, la, _ in run_shards(root, "r")] == [(1, 2), (3, 4), (5, 6), (7, 8)]
    # Checkpoint at step 5: steps 6-8 are redone; the 5-6 shard is trimmed to 5-5.
    with RolloutWriter(root, "r", steps_per_bucket=100, resume_after=5) as w:
        assert w.last_written_step == 5
        for step in range(6, 10):
            w.write(_step_rows("r", step, n=2))
    con = connect(tmp_path)
    counts = dict(con.execute("SELECT step, count(*) FROM rollouts GROUP BY step").fetchall())
    assert counts == {1: 3, 2: 3, 3: 3, 4: 3, 5: 3, 6: 2, 7: 2, 8: 2, 9: 2}
    assert not list(root.rglob(".*.tmp"))


def test_run_id_must_be_a_safe_folder_name(tmp_path):
    for bad in ("../escape", "a/b", "", "run id"):
        with pytest.raises(ValueError, match="run_id"):
            RolloutWriter(tmp_path, bad)
    with pytest.raises(ValueError, match="run_id and step"):
        StepShardWriter("prompts", tmp_path, "r")


def test_view_keeps_the_schema_and_the_run_id_type(tmp_path):
    with RolloutWriter(tmp_path / "rollouts", "0042", steps_per_bucket=2) as w:
        for step in range(4):
            w.write(_step_rows("0042", step, n=1))
    assert len(shard_paths(tmp_path / "rollouts")) == 2
    con = connect(tmp_path, locked=True)
    described = con.execute("DESCRIBE rollouts").fetchall()
    assert [r[0] for r in described] == TABLES["rollouts"].names  # no step_bucket column
    assert dict((r[0], r[1]) for r in described)["run_id"] == "VARCHAR"
    assert con.execute("SELECT DISTINCT run_id FROM rollouts").fetchall() == [("0042",)]


# --- schema evolution: shards an older version wrote, without the per-row draft counts
DRAFT_COLUMNS = ("drafted", "accepted")


def _as_before_the_draft_columns(root) -> None:
    """Rewrite every shard under `root` as an older writer left it: no drafted / accepted."""
    for path in root.rglob("*.parquet"):
        data = pq.read_table(path)
        pq.write_table(data.drop_columns(list(DRAFT_COLUMNS)), path)


def test_old_shards_read_the_draft_columns_as_null(tmp_path):
    """A store written before `drafted` / `accepted` existed still answers: the views, `rlhf
    query`, the audits and `read_table` read the two columns as null (not 0: unknown), alone
    and next to a newer run's shards."""
    from rlhf.cli.app import app
    from rlhf.store.io import read_table
    from typer.testing import CliRunner

    root = tmp_path / "store" / "rollouts"
    with RolloutWriter(root, "old", steps_per_bucket=2) as w:
        for step in range(1, 4):
            w.write(_step_rows("old", step))
    _as_before_the_draft_columns(root)
    assert all(c not in pq.read_schema(p).names for p in root.rglob("*.parquet")
               for c in DRAFT_COLUMNS)
    con = connect(tmp_path / "store", locked=True)
    assert [r[0] for r in con.execute("DESCRIBE rollouts").fetchall()] == \
        TABLES["rollouts"].names
    assert con.execute("SELECT count(*), count(drafted), count(accepted) FROM rollouts"
                       ).fetchall() == [(9, 0, 0)]
    runner = CliRunner()
    for args in (["query", "SELECT step, sum(drafted) AS d FROM rollouts GROUP BY ALL"],
                 ["audit", "economy"], ["audit", "rewards"], ["tables"]):
        res = runner.invoke(app, [*args, "--store", str(tmp_path / "store")])
        assert res.exit_code == 0 and "Traceback" not in res.output, (args, res.output)
    # a newer run beside it: its counts, and still null in the old rows
    with RolloutWriter(root, "new", steps_per_bucket=2) as w:
        w.write([{**row, "drafted": 4, "accepted": 3} for row in _step_rows("new", 1)])
    con = connect(tmp_path / "store", locked=True)
    got = con.execute("SELECT run_id, count(*), sum(drafted), sum(accepted) FROM rollouts "
                      "GROUP BY ALL ORDER BY 1").fetchall()
    assert got == [("new", 3, 12, 9), ("old", 9, None, None)]
    rows = read_table("rollouts", root).to_pylist()
    assert {(r["run_id"], r["drafted"]) for r in rows} == {("old", None), ("new", 4)}


def test_a_resumed_run_trims_an_old_shard(tmp_path):
    """A run written before the draft columns, resumed after: its writer trims the old shard
    (the draft columns null in the rows kept) and writes the redone steps with them."""
    root = tmp_path / "rollouts"
    with RolloutWriter(root, "r", steps_per_bucket=100) as w:
        for step in range(1, 4):
            w.write(_step_rows("r", step))
    _as_before_the_draft_columns(root)
    with RolloutWriter(root, "r", steps_per_bucket=100, resume_after=2) as w:
        w.write([{**row, "drafted": 2, "accepted": 1} for row in _step_rows("r", 3)])
    got = connect(tmp_path).execute("SELECT step, count(*), sum(drafted) FROM rollouts "
                                    "GROUP BY ALL ORDER BY 1").fetchall()
    assert got == [(1, 3, None), (2, 3, None), (3, 3, 6)]
