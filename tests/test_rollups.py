"""The rollups (store/rollup.py): the audits read per-step sums, and their answers are those of
reading every raw row, whether the stored rollups are fresh, stale or absent.

The reference is tests/data/raw_audits/: the audits as they were before the rollups, reading
every rollout and RM score row (their own tests in test_audits.py count their answers by hand).
"""

from __future__ import annotations

import datetime as dt
import json
import random
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import synthetic_store
from rlhf.cli.app import app
from rlhf.store import rollup
from rlhf.store.catalog import connect
from rlhf.store.hashing import content_hash
from rlhf.store.io import write_shard
from rlhf.store.query import get_audit, list_audits
from rlhf.store.rollouts import RolloutWriter, StepShardWriter

runner = CliRunner()
RAW = Path(__file__).parent / "data" / "raw_audits"
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
FLAGS = ["pruned", "resampled", "no_eos", "l2_confidence", "l2_low_score", "l2_high_risk",
         "l2_uncertain_cluster"]
# (audit, arguments): every audit that reads a rollup, with windows that cut runs mid-way
CASES = [("sources", []), ("rewards", ["7"]), ("economy", ["7"]), ("lineage", ["b-50"]),
         ("lineage", ["a-40"]), ("lineage", ["c-10"]), ("rm", ["7", "0.5"]), ("rm", [])]


def history_store(root: Path, seed: int = 0) -> Path:
    """120 pool prompts (3 source types, 7 topics, 100 with a difficulty row) and 20 outside the
    pool; 3 runs (b forks a at step 20, c from SFT) with random tiers, rewards, flags and tokens;
    the light RM's score for every scored rollout and the strong RM's for a Level-2 one, its
    version changing at step 25; a few human labels."""
    rng = random.Random(seed)
    ids = [content_hash(f"prompt {i}") for i in range(140)]
    sources = ["human", "user_query", "open_dataset"]
    pool = [{"prompt_id": p, "text": f"prompt {i}", "source_type": sources[i % 3],
             "source_file": "f", "source_line": i, "dedup_cluster": i, "cluster_size": 1,
             "topic_cluster": i % 7, "n_tokens": 3, "split": "ppo"} for i, p in enumerate(ids[:120])]
    write_shard("pool", pool, root / "pool" / "part-00000.parquet")
    write_shard("prompts", [{"prompt_id": r["prompt_id"], "text": r["text"],
                             "source_type": r["source_type"], "source_file": "f",
                             "source_line": r["source_line"], "provenance": None,
                             "created_at": None, "n_tokens": 3} for r in pool],
                root / "prompts" / "part-00000.parquet")
    write_shard("difficulty", [{"prompt_id": p, "text": "t", "split": "ppo", "topic_cluster": 0,
                                "length": 1, "logprob_std": 0.1, "rm_score": 0.0, "score": 5.0,
                                "bucket": ("low", "mid", "high")[i % 3]}
                               for i, p in enumerate(ids[:100])],
                root / "difficulty" / "part-00000.parquet")
    checkpoints, labels = [], []
    for run, first, last, parent in (("a", 1, 40, None), ("b", 21, 50, "a-20"), ("c", 1, 30, None)):
        with RolloutWriter(root / "rollouts", run, steps_per_bucket=16, rows_per_shard=50,
                           row_group_size=16) as w, \
             StepShardWriter("rm_scores", root / "rm_scores", run, steps_per_bucket=16) as m:
            for step in range(first, last + 1):
                rows, scores = [], []
                version = "v1" if step < 25 else "v2"
                for i in range(rng.randint(3, 9)):
                    tier = rng.choice([0, 1, 1, 1, 2])
                    prompt = rng.choice(ids)
                    reward = None if tier == 0 or rng.random() < 0.1 else round(rng.gauss(1, 1), 3)
                    row = synthetic_store.rollout_row(run, step, prompt, reward, tier,
                                                      ("reused", "light_rm", "strong_rm")[tier], i)
                    row["flags"] = rng.sample(FLAGS, rng.choice([0, 0, 0, 1, 2, 3]))
                    row["generated_tokens"] = rng.randint(1, 40)
                    rows.append(row)
                    for rm in ("light_rm", "strong_rm")[:tier]:
                        conf = round(rng.random(), 3)
                        scores.append({"run_id": run, "step": step, "prompt_id": prompt,
                                       "response_hash": content_hash(f"{run}{step}{i}"),
                                       "rm_name": rm, "rm_version": version,
                                       "score": rng.gauss(0, 1), "confidence": conf,
                                       "escalated": tier == 2, "queued": conf < 0.6,
                                       "scored_at": T0})
                    if tier == 2 and rng.random() < 0.5:
                        labels.append({"run_id": run, "step": step, "prompt_id": prompt,
                                       "prompt_hash": "h", "response_hash": "r",
                                       "annotator_id": "ann01", "labeled_at": T0, "score": 3.0,
                                       "light_score": None, "triggers": ["l2_confidence"]})
                w.write(rows)
                if scores:
                    m.write(scores)
        prev = parent
        for step in range(first + 9, last + 1, 10):
            checkpoints.append({"checkpoint_id": f"{run}-{step}", "run_id": run, "step": step,
                                "parent_id": prev, "data_version": "v", "params_hash": None,
                                "path": None, "created_at": T0})
            prev = f"{run}-{step}"
    write_shard("checkpoints", checkpoints, root / "checkpoints" / "part-00000.parquet")
    write_shard("human_labels", labels, root / "human_labels" / "part-00000.parquet")
    return root


def _rows(con, sql: str, params: dict) -> list[tuple]:
    return con.execute(sql, params).fetchall()


def _approx(answers: dict) -> dict:
    """`answers` with every float compared to 1e-4 (sums in another order round the same)."""
    return {case: [tuple(pytest.approx(v, abs=1e-4) if isinstance(v, float) else v for v in row)
                   for row in rows] for case, rows in answers.items()}


def _answers(store: Path, raw: bool = False) -> dict:
    """Every case's rows: from the raw-row reference SQL, or from the audit as shipped."""
    out = {}
    for name, args in CASES:
        audit = get_audit(name)
        params = audit.bind(args)
        con = connect(store, with_rollups=not raw)
        con.execute("SET threads = 1")
        sql = (RAW / f"{name}.sql").read_text() if raw else audit.sql
        out[(name, *args)] = _rows(con, sql, params)
    return out


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> Path:
    return history_store(tmp_path_factory.mktemp("h") / "store")


def test_every_audit_that_reads_a_rollup_gives_the_raw_rows_answer(history, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(history, store)
    want = _answers(store, raw=True)
    assert all(len(rows) >= 2 for rows in want.values()), want
    flagged = {r[0] for r in want[("economy", "7")] if r[5] or r[7]}  # pruned or resampled rows
    assert flagged and any(r[14] for r in want[("rm", "7", "0.5")] if r[14] is not None)
    assert rollup.state(store) == "absent"
    assert _answers(store) == _approx(want)  # the rollups' SQL over the raw tables
    rows = rollup.build(store)
    assert {r["rollup"] for r in rows} == {r.name for r in rollup.list_rollups()}
    assert rollup.state(store) == "fresh"
    assert _answers(store) == _approx(want)  # the stored rollups


def test_every_rollup_is_read_by_an_audit_and_no_audit_reads_every_rollout_row():
    names = {r.name for r in rollup.list_rollups()}
    assert {n for a in list_audits() for n in names if n in a.sql} == names
    for audit in list_audits():
        assert "FROM rollouts" not in audit.sql and "JOIN rollouts" not in audit.sql, audit.name


def test_a_new_shard_makes_the_rollups_stale_and_the_audits_still_count_it(history, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(history, store)
    rollup.build(store)
    before = _answers(store)
    with RolloutWriter(store / "rollouts", "c", steps_per_bucket=16) as w:
        w.write([synthetic_store.rollout_row("c", 31, content_hash("prompt 3"), 2.0, 1, "light_rm")])
    assert rollup.state(store) == "stale"
    want = _answers(store, raw=True)
    assert _answers(store) == _approx(want) and before != _approx(want)
    result = runner.invoke(app, ["audit", "economy", "--store", str(store), "--format", "jsonl"])
    assert result.exit_code == 0 and "rollups are stale" in result.stderr
    assert "rlhf rollup --store" in result.stderr and "rollups" not in result.stdout
    other = runner.invoke(app, ["audit", "annotators", "--store", str(store)])
    assert other.exit_code == 0 and other.stderr == ""  # it reads no rollup
    # the check has teeth: the stored (old) rollups read as if fresh would miss the new row
    con = connect(store, with_rollups=False)
    for r in rollup.list_rollups():
        path = (store / "rollups" / f"{r.name}.parquet").as_posix()
        con.execute(f"CREATE VIEW {r.name} AS FROM read_parquet('{path}')")
    audit = get_audit("economy")
    assert _rows(con, audit.sql, audit.bind(["7"])) != _approx(want)[("economy", "7")]
    rollup.build(store)
    assert rollup.state(store) == "fresh" and _answers(store) == _approx(want)


def test_a_copy_with_new_file_times_stays_fresh_and_a_rewritten_shard_does_not(history, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(history, store)
    rollup.build(store)
    moved = tmp_path / "moved"
    shutil.copytree(store, moved, copy_function=shutil.copyfile)  # new mtimes, same bytes
    assert rollup.state(moved) == "fresh"
    # A rewrite of the same size: only the footer (the new maximum in its statistics) tells.
    shard = sorted((moved / "rm_scores").rglob("*.parquet"))[0]
    table = pq.read_table(shard)
    plain = {"compression": "NONE", "use_dictionary": False}
    pq.write_table(table, shard, **plain)
    rollup.build(moved)
    size = shard.stat().st_size
    scores = table.column("score").to_pylist()
    scores[0] = max(scores) + 1.0
    i = table.schema.get_field_index("score")
    pq.write_table(table.set_column(i, table.schema.field(i), pa.array(scores, pa.float32())),
                   shard, **plain)
    assert shard.stat().st_size == size
    assert rollup.state(moved) == "stale"


def test_an_edited_rollup_or_a_lost_file_or_a_broken_manifest_is_not_fresh(history, tmp_path,
                                                                             monkeypatch):
    store = tmp_path / "store"
    shutil.copytree(history, store)
    rollup.build(store)
    (store / "rollups" / "rm_steps.parquet").unlink()
    assert rollup.state(store) == "stale"
    assert _answers(store) == _approx(_answers(store, raw=True))
    rollup.build(store)
    (store / "rollups" / "manifest.json").write_text("{not json")
    assert rollup.state(store) == "absent"
    rollup.build(store)
    edited = tmp_path / "sql"
    shutil.copytree(rollup.ROLLUPS_DIR, edited)
    path = edited / "run_prompts.sql"
    path.write_text(path.read_text() + "-- edited\n")
    monkeypatch.setattr(rollup, "ROLLUPS_DIR", edited)
    assert rollup.state(store) == "stale"


def test_rollup_cli_check_build_and_errors(history, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(history, store)
    check = runner.invoke(app, ["rollup", "--store", str(store), "--check"])
    assert check.exit_code == 1 and "absent" in check.stdout
    metrics, report = tmp_path / "m.json", tmp_path / "r.json"
    built = runner.invoke(app, ["rollup", "--store", str(store), "--metrics", str(metrics),
                                "--report", str(report)], env={"COLUMNS": "120"})
    assert built.exit_code == 0, built.output
    assert "rollout_steps" in built.stdout and "fresh" in built.stdout
    rollouts = connect(store).execute("SELECT count(*) FROM rollouts").fetchone()[0]
    head, full = json.loads(metrics.read_text()), json.loads(report.read_text())
    assert head["rollout_rows"] == full["rollout_rows"] == rollouts > 100
    assert set(head["rows"]) == {r.name for r in rollup.list_rollups()} == set(full["bytes"])
    assert "seconds" not in full  # wall-clock: in the unversioned timings file only
    manifest = json.loads((store / "rollups" / "manifest.json").read_text())
    assert manifest["fingerprint"] == rollup.fingerprint(store)
    assert all("seconds" not in r for r in manifest["rollups"])
    # a rebuild writes the same bytes, manifest included: the stage's output hash stays
    first = {p.name: p.read_bytes() for p in (store / "rollups").iterdir()}
    rollup.build(store)
    assert {p.name: p.read_bytes() for p in (store / "rollups").iterdir()} == first
    assert runner.invoke(app, ["rollup", "--store", str(store), "--check"]).exit_code == 0
    quiet = runner.invoke(app, ["audit", "rewards", "--store", str(store), "--format", "jsonl"])
    assert quiet.exit_code == 0 and quiet.stderr == ""
    missing = runner.invoke(app, ["rollup", "--store", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "store folder not found" in missing.output


def test_rollup_of_a_store_with_a_prompt_key_collision_fails_clearly(tmp_path):
    store = synthetic_store.build(tmp_path / "store")
    path = store / "pool" / "part-00000.parquet"
    pool = pq.read_table(path)
    keys = pool.column("prompt_key").to_pylist()
    keys[1] = keys[0]
    pq.write_table(pool.set_column(1, "prompt_key", pa.array(keys, pa.int64())), path)
    result = runner.invoke(app, ["rollup", "--store", str(store)])
    out = " ".join(result.output.split())
    assert result.exit_code == 2 and "share one prompt_key" in out and "Traceback" not in out
    assert rollup.state(store) == "absent"  # nothing half-built is taken for fresh


def test_the_audits_group_by_prompt_key_as_they_would_by_prompt_id(history):
    """The rollups and audits join by the 8-byte key: the same answers as by the id itself."""
    sql_of = {r.name: r.sql for r in rollup.list_rollups()}
    assert any("prompt_key" in sql for sql in sql_of.values())

    def answers(column: str) -> dict:
        out = {}
        for name, args in CASES:
            con = connect(history, with_rollups=False)
            con.execute("SET threads = 1")
            for view, sql in sql_of.items():
                con.execute(f"CREATE VIEW {view} AS {sql.replace('prompt_key', column)}")
            audit = get_audit(name)
            out[(name, *args)] = _rows(con, audit.sql.replace("prompt_key", column),
                                       audit.bind(args))
        return out

    by_key = answers("prompt_key")
    assert answers("prompt_id") == _approx(by_key)
    assert "(not in pool)" in [r[0] for r in by_key[("sources",)]]
