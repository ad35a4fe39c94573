"""The named audits on the hand-countable store of tests/synthetic_store.py, via `rlhf audit`:
each answer counted by hand, from the raw rows (no rollups built) and from the stored rollups."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from typer.testing import CliRunner

import synthetic_store
from rlhf.cli.app import app
from rlhf.store.query import check_sql, list_audits

runner = CliRunner()


@pytest.fixture(scope="module", params=["raw rows", "rollups"])
def store(tmp_path_factory, request) -> Path:
    root = synthetic_store.build(tmp_path_factory.mktemp("a") / "store")
    if request.param == "rollups":
        built = runner.invoke(app, ["rollup", "--store", str(root)])
        assert built.exit_code == 0, built.output
    return root


def audit(store: Path, *args: str) -> list[dict]:
    result = runner.invoke(app, ["audit", *args, "--store", str(store), "--format", "jsonl"])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_every_audit_is_one_gated_select_with_a_summary():
    audits = {a.name: a for a in list_audits()}
    assert set(audits) == {"lineage", "sources", "rewards", "annotators", "rm", "schedule",
                           "economy"}
    for a in audits.values():
        check_sql(a.sql)  # the shipped SQL passes the same gate as a user's query
        assert a.summary and a.usage().startswith(f"rlhf audit {a.name}")
    assert [p.name for p in audits["lineage"].params] == ["checkpoint"]
    assert audits["rm"].usage() == "rlhf audit rm [WINDOW=100] [THRESHOLD=0.6]"


def test_sources(store):
    rows = {r["source_type"]: r for r in audit(store, "sources")}
    assert set(rows) == {"human", "user_query", "open_dataset", "(unknown)", "(not in pool)"}
    human = rows["human"]
    # kept p1 p2 p3, rejected 2; pool p1 p2; rollouts a1 a2 a3 b3 b4 = 1+3+5+2+4
    assert (human["kept"], human["rejected"], human["rejected_share"], human["in_pool"]) == (3, 2, 0.4, 2)
    assert (human["rollouts"], human["prompts_rolled_out"], human["reward_mean"]) == (5, 2, 3.0)
    assert (human["tier0_share"], human["tier1_share"], human["tier2_share"]) == (0.0, 0.6, 0.4)
    uq = rows["user_query"]  # p4: rewards 2.0 and 0.0
    assert (uq["kept"], uq["rejected"], uq["in_pool"], uq["rollouts"], uq["reward_mean"]) == (2, 0, 1, 2, 1.0)
    od = rows["open_dataset"]  # p6: one rollout, reused, no reward
    assert (od["kept"], od["rejected"], od["rollouts"], od["reward_mean"], od["tier0_share"]) == (1, 1, 1, None, 1.0)
    assert rows["(unknown)"]["rejected"] == 1 and rows["(unknown)"]["kept"] == 0
    assert rows["(not in pool)"]["rollouts"] == 1 and rows["(not in pool)"]["reward_mean"] == 1.0


def test_rewards(store):
    rows = audit(store, "rewards", "2")
    by_step = {(r["run_id"], r["step_from"], r["difficulty_bucket"]): (r["rollouts"], r["reward_mean"])
               for r in rows if r["breakdown"] == "bucket x step"}
    assert by_step == {
        ("a", 0, "low"): (1, 1.0), ("a", 0, "mid"): (1, 2.0),
        ("a", 2, "low"): (1, 5.0), ("a", 2, "high"): (1, 3.0), ("a", 2, "(unscored)"): (1, None),
        ("a", 4, "mid"): (1, 0.0),
        ("b", 2, "low"): (1, 2.0), ("b", 2, "(unscored)"): (1, 1.0), ("b", 4, "high"): (1, 4.0),
    }
    buckets = {(r["run_id"], r["difficulty_bucket"]): (r["rollouts"], r["scored"], r["reward_mean"])
               for r in rows if r["breakdown"] == "bucket"}
    assert buckets[("a", "low")] == (2, 2, 3.0) and buckets[("a", "mid")] == (2, 2, 1.0)
    assert buckets[("a", "(unscored)")] == (1, 0, None)
    topics = {(r["run_id"], r["topic_cluster"]): (r["rollouts"], r["reward_mean"])
              for r in rows if r["breakdown"] == "topic"}
    # run a, topic 0 = p1 (1, 5) + p4 (2, 0); topic 1 = p2 (3) + p6 (no reward)
    assert topics == {("a", 0): (4, 2.0), ("a", 1): (2, 3.0),
                      ("b", 0): (1, 2.0), ("b", 1): (1, 4.0), ("b", None): (1, 1.0)}
    stds = {(r["run_id"], r["topic_cluster"]): r["reward_std"] for r in rows if r["breakdown"] == "topic"}
    assert stds[("a", 0)] == 2.1602  # sample std of 1, 2, 5, 0 = sqrt(14 / 3)
    assert stds[("a", 1)] is None  # one scored rollout: no spread
    # The default window (100) folds every step of these short runs into one row per bucket.
    default = audit(store, "rewards")
    assert {r["step_from"] for r in default if r["breakdown"] == "bucket x step"} == {0}


def test_annotators_drift(store):
    rows = audit(store, "annotators")
    got = [(r["annotator_id"], r["period_start"][:10], r["labels"], r["labels_so_far"],
            r["mean_score"], r["drift"], r["vs_all"]) for r in rows]
    # ann1: 3.8, 3.8 on day one, 4.2, 4.4 on day two; ann2: 4.0 each day.
    assert got == [
        ("ann1", "2026-01-01", 2, 2, 3.8, 0.0, -0.0667),
        ("ann1", "2026-01-02", 2, 4, 4.3, 0.5, 0.1),
        ("ann2", "2026-01-01", 1, 1, 4.0, 0.0, 0.1333),
        ("ann2", "2026-01-02", 1, 2, 4.0, 0.0, -0.2),
    ]
    weekly = audit(store, "annotators", "week")
    assert [(r["annotator_id"], r["labels"], r["drift"]) for r in weekly] == [("ann1", 4, 0.0),
                                                                              ("ann2", 2, 0.0)]


def test_rm_confidence_and_escalations(store):
    rows = {(r["run_id"], r["rm_name"], r["rm_version"]): r for r in audit(store, "rm")}
    v1 = rows[("a", "light_rm", "v1")]  # confidences 0.9 and 0.5; one queued
    assert (v1["scored"], v1["confidence_mean"], v1["low_confidence_share"], v1["queued"]) == (2, 0.7, 0.5, 1)
    strong = rows[("a", "strong_rm", "s1")]
    assert (strong["escalated"], strong["escalated_share"]) == (1, 1.0)
    assert rows[("b", "light_rm", "v2")]["low_confidence_share"] == 0.0
    # The threshold is a parameter: at 0.5, a confidence of exactly 0.5 is no longer "low".
    low = {(r["run_id"], r["rm_name"], r["rm_version"]): r["low_confidence_share"]
           for r in audit(store, "rm", "100", "0.5")}
    assert low[("a", "light_rm", "v1")] == 0.0 and low[("a", "light_rm", "v2")] == 0.0
    per_step = audit(store, "rm", "1")
    assert sorted({(r["run_id"], r["step_from"]) for r in per_step}) == [
        ("a", 1), ("a", 2), ("a", 3), ("b", 3), ("b", 4)]


def test_lineage_of_a_forked_checkpoint(store):
    rows = audit(store, "lineage", "b-4")
    got = [(r["run_id"], r["started_from"], r["source_type"], r["first_step"], r["last_step"],
            r["rollouts"], r["prompts"], r["reward_mean"]) for r in rows]
    # b-4 forked from a-2: run a up to step 2, then run b; a's steps 3-4 did not train it.
    assert got == [
        ("a", None, "human", 1, 2, 2, 2, 2.0),
        ("a", None, "open_dataset", 2, 2, 1, 1, None),
        ("a", None, "user_query", 1, 1, 1, 1, 2.0),
        ("b", "a-2", "(not in pool)", 3, 3, 1, 1, 1.0),
        ("b", "a-2", "human", 3, 4, 2, 2, 3.0),
    ]
    assert {r["run_id"]: r["data_versions"] for r in rows} == {"a": ["v1"], "b": ["v2"]}
    assert {r["run_id"]: r["rm_versions"] for r in rows} == {
        "a": ["light_rm:v1", "strong_rm:s1"], "b": ["light_rm:v2", "strong_rm:s1"]}
    scorers = [(r["by_light_rm"], r["by_strong_rm"], r["reused"], r["other_scorer"]) for r in rows]
    assert scorers == [(1, 1, 0, 0), (0, 0, 1, 0), (1, 0, 0, 0), (1, 0, 0, 0), (1, 1, 0, 0)]


def test_lineage_within_one_run(store):
    rows = audit(store, "lineage", "a-4")
    assert {r["run_id"] for r in rows} == {"a"}
    assert sum(r["rollouts"] for r in rows) == 6  # every rollout of run a, steps 1-4
    assert "light_rm:v2" in rows[0]["rm_versions"]  # the RM version of step 3
    assert audit(store, "lineage", "no-such-checkpoint") == []


def test_economy_pruning_and_resampling_rates(tmp_path):
    """Issue 13: pruned / resampled rows by difficulty bucket and step window."""
    from rlhf.store.rollouts import RolloutWriter

    store = synthetic_store.build(tmp_path / "store")
    rows = [("c", 1, "p1", None, ["no_eos", "pruned"], 5), ("c", 1, "p1", 1.0, [], 20),
            ("c", 1, "p2", 2.0, ["resampled"], 30), ("c", 3, "p2", 0.5, [], 10),
            ("c", 3, "p6", None, ["pruned"], 5)]
    with RolloutWriter(store / "rollouts", "c", steps_per_bucket=2) as w:
        for i, (run, step, pid, reward, flags, gen) in enumerate(rows):
            row = synthetic_store.rollout_row(run, step, pid, reward, 1, "light_rm", i)
            w.write([{**row, "flags": flags, "generated_tokens": gen}])
    out = [r for r in audit(store, "economy", "2") if r["run_id"] == "c"]
    cells = {(r["breakdown"], r["step_from"], r["difficulty_bucket"]):
             (r["rollouts"], r["pruned"], r["resampled"], r["generated_tokens"], r["pruned_tokens"])
             for r in out}
    assert cells == {("bucket x step", 0, "low"): (2, 1, 0, 25, 5),
                     ("bucket x step", 0, "high"): (1, 0, 1, 30, 0),
                     ("bucket x step", 2, "high"): (1, 0, 0, 10, 0),
                     ("bucket x step", 2, "(unscored)"): (1, 1, 0, 5, 5),
                     ("bucket", None, "low"): (2, 1, 0, 25, 5),
                     ("bucket", None, "high"): (2, 0, 1, 40, 0),
                     ("bucket", None, "(unscored)"): (1, 1, 0, 5, 5)}
    low = [r for r in out if r["breakdown"] == "bucket" and r["difficulty_bucket"] == "low"][0]
    assert (low["pruned_rate"], low["reward_mean"]) == (0.5, 1.0)  # the pruned row: no reward


def test_audits_run_on_an_empty_store(tmp_path):
    """Tables of later stages may not exist yet: every audit still runs, on typed empty views."""
    (tmp_path / "store").mkdir()
    for args in (["sources"], ["rewards"], ["annotators"], ["rm"], ["lineage", "x"],
                 ["schedule"], ["economy"]):
        assert audit(tmp_path / "store", *args) == []


@pytest.mark.parametrize("args, needle", [
    (["lineage"], "needs CHECKPOINT"),
    (["rewards", "ten"], "window expects BIGINT"),
    (["rm", "1", "2", "3"], "takes 2 argument(s)"),
    (["nope"], "unknown audit 'nope'"),
])
def test_audit_argument_errors_are_clear(store, args, needle):
    result = runner.invoke(app, ["audit", *args, "--store", str(store)])
    assert result.exit_code == 2
    assert needle in result.output and "Traceback" not in result.output


def test_audit_list_and_sql():
    result = runner.invoke(app, ["audit"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for name in ("lineage", "sources", "rewards", "annotators", "rm", "economy"):
        assert f"rlhf audit {name}" in result.output
    sql = runner.invoke(app, ["audit", "lineage", "--sql"])
    assert sql.exit_code == 0 and "WITH RECURSIVE chain" in sql.output and "$checkpoint" in sql.output


def test_a_prompt_key_collision_in_the_pool_stops_the_audits(tmp_path):
    """Two pool prompts sharing a key (written around the store's own check, which refuses
    them) must make the audits fail with a clear error rather than merge the two prompts."""
    import pyarrow.parquet as pq

    store = synthetic_store.build(tmp_path / "store")
    path = store / "pool" / "part-00000.parquet"
    pool = pq.read_table(path)
    keys = pool.column("prompt_key").to_pylist()
    keys[1] = keys[0]  # p1 and p2 now share a key
    pq.write_table(pool.set_column(1, "prompt_key", pa.array(keys, pa.int64())), path)
    # every audit that reads the rollout rollups (they join rollouts to prompts by key)
    for args in (["sources"], ["rewards"], ["economy"], ["lineage", "b-4"], ["rm"]):
        result = runner.invoke(app, ["audit", *args, "--store", str(store)])
        assert result.exit_code == 2, (args, result.output)
        out = " ".join(result.output.split())  # rich wraps long lines
        assert "share one prompt_key" in out and "hash collision" in out and "Traceback" not in out
    assert audit(store, "annotators") is not None  # one that never joins by prompt still answers
