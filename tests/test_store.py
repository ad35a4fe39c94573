from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
import unicodedata
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from rlhf.store import TABLES, content_hash
from rlhf.store.catalog import connect
from rlhf.store.hashing import PROMPT_KEY_SQL, keys_for, prompt_key
from rlhf.store.io import ShardWriter, read_dataset, read_table, remove_partials, shard_paths, write_shard


def _sample(tp: pa.DataType, i: int):
    if pa.types.is_string(tp) or pa.types.is_large_string(tp):
        return f"value {i} é"
    if pa.types.is_boolean(tp):
        return i % 2 == 0
    if pa.types.is_integer(tp):
        return i * 3
    if pa.types.is_floating(tp):
        return i + 0.5
    if pa.types.is_timestamp(tp):
        return dt.datetime(2026, 1, 1, 12, i, tzinfo=dt.timezone.utc)
    if pa.types.is_list(tp):
        return [_sample(tp.value_type, i), _sample(tp.value_type, i + 1)]
    if pa.types.is_struct(tp):
        return {f.name: _sample(f.type, i) for f in tp}
    raise NotImplementedError(f"no sample value for {tp}")


def _rows(schema: pa.Schema, n: int = 3) -> list[dict]:
    rows = [{f.name: _sample(f.type, i) for f in schema} for i in range(n)]
    for row in rows:
        if "prompt_key" in row:  # derived from the id, never free (store.io.to_arrow)
            row["prompt_key"] = prompt_key(row["prompt_id"])
    return rows


@pytest.mark.parametrize("table", sorted(TABLES))
def test_schema_round_trip(table, tmp_path):
    rows = _rows(TABLES[table])
    path = write_shard(table, rows, tmp_path / table / "part-00000.parquet")
    assert path.exists()
    back = read_table(table, tmp_path / table)
    assert back.schema.equals(TABLES[table], check_metadata=False)
    assert back.to_pylist() == rows
    assert read_dataset(table, tmp_path / table).num_rows == len(rows)


def test_write_rejects_rows_that_do_not_fit(tmp_path):
    with pytest.raises(ValueError, match="prompts"):
        write_shard("prompts", [{"prompt_id": "x", "bogus": 1}], tmp_path / "p.parquet")
    with pytest.raises(KeyError, match="known tables"):
        write_shard("no_such_table", [], tmp_path / "p.parquet")
    assert not list(tmp_path.iterdir())


def test_content_hash_is_nfc_stable_sha256():
    composed = "caf\u00e9"
    decomposed = unicodedata.normalize("NFD", composed)
    assert composed != decomposed
    assert content_hash(composed) == content_hash(decomposed)
    # sha256("abc"), FIPS 180-2 test vector
    assert content_hash("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_prompt_key_is_64_bits_of_the_ids_sha256_in_python_and_sql():
    ids = ["p1", content_hash("abc"), "café", ""] + [str(i) for i in range(300)]
    keys = [prompt_key(p) for p in ids]
    # sha256("p1") = f64551fcd6f07823...: its first 8 bytes as a signed (two's complement) int64
    assert keys[0] == int("f64551fcd6f07823", 16) - 2**64
    assert min(keys) < 0 < max(keys) and len(set(keys)) == len(keys)
    con = duckdb.connect()
    assert [con.execute(f"SELECT {PROMPT_KEY_SQL.format(id='$1')}", [p]).fetchone()[0]
            for p in ids] == keys
    arr = pa.array(ids + ids[:5] + [None])
    assert keys_for(arr).to_pylist() == keys + keys[:5] + [None]


def test_store_derives_prompt_key_and_refuses_a_wrong_one(tmp_path):
    row = _rows(TABLES["pool"], 1)[0]
    del row["prompt_key"]
    path = write_shard("pool", [row], tmp_path / "pool" / "part-00000.parquet")
    assert read_table("pool", path.parent).column("prompt_key").to_pylist() == [prompt_key(row["prompt_id"])]
    with pytest.raises(ValueError, match="prompt_key of row 0 is not"):
        write_shard("pool", [{**row, "prompt_key": 7}], tmp_path / "x.parquet")
    table = read_table("pool", path.parent)
    with pytest.raises(ValueError, match="prompt_key of row 0 is not"):
        write_shard("pool", table.set_column(1, "prompt_key", pa.array([7], pa.int64())),
                    tmp_path / "x.parquet")
    assert write_shard("pool", table.drop(["prompt_key"]), tmp_path / "y.parquet").exists()
    assert not (tmp_path / "x.parquet").exists()


def test_a_key_collision_within_a_write_is_refused(monkeypatch, tmp_path):
    import rlhf.store.hashing as hashing

    monkeypatch.setattr(hashing, "prompt_key", lambda pid: 42)  # every id collides
    rows = _rows(TABLES["pool"], 2)
    for r in rows:
        del r["prompt_key"]
    with pytest.raises(ValueError, match="share prompt_key 42"):
        write_shard("pool", rows, tmp_path / "p.parquet")
    assert write_shard("pool", rows[:1] * 2, tmp_path / "p.parquet").exists()  # same id twice: fine


def test_shard_writer_numbers_shards_and_resumes(tmp_path):
    rows = _rows(TABLES["similar"], 7)
    with ShardWriter("similar", tmp_path, rows_per_shard=3) as w:
        w.extend(rows)
    assert [p.name for p in shard_paths(tmp_path)] == [
        "part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    again = ShardWriter("similar", tmp_path, rows_per_shard=3)
    again.extend(rows[:2])
    again.close()
    assert shard_paths(tmp_path)[-1].name == "part-00003.parquet"
    assert read_table("similar", tmp_path).num_rows == 9


def test_empty_writer_leaves_one_typed_empty_shard(tmp_path):
    ShardWriter("rejected", tmp_path).close()
    assert len(shard_paths(tmp_path)) == 1
    assert read_table("rejected", tmp_path).num_rows == 0


_CHILD = r"""
import os, sys, time
import pyarrow as pa
from rlhf.store.io import write_shard
mode, out = sys.argv[1], sys.argv[2]
n = 3_000_000 if mode == "big" else 10
rows = pa.table({
    "prompt_id": pa.array([f"{i:064d}" for i in range(n)]),
    "text": pa.array([f"text number {i} " * 4 for i in range(n)]),
    "source_file": pa.array(["sources/human.jsonl"] * n),
    "source_line": pa.array(range(1, n + 1), pa.int64()),
    "representative_id": pa.array(["r"] * n),
    "dedup_cluster": pa.array(range(n), pa.int64()),
    "distance": pa.array([0.1] * n, pa.float32()),
})
if mode == "stall":
    real = os.fsync
    def slow_fsync(fd):
        print("in-fsync", flush=True)
        time.sleep(60)
        real(fd)
    os.fsync = slow_fsync
print("writing", flush=True)
write_shard("similar", rows, out)
print("done", flush=True)
"""


@pytest.mark.parametrize("mode", ["stall", "big"])
def test_sigkill_mid_write_leaves_no_visible_shard(mode, tmp_path):
    out = tmp_path / "similar" / "part-00000.parquet"
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, mode, str(out)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
        deadline = time.monotonic() + 60
        # Kill as soon as the temporary file exists: mid-write ("big") or before the rename ("stall").
        folder = tmp_path / "similar"
        while not (folder.is_dir() and list(folder.glob(".*.tmp"))):
            assert proc.poll() is None, "writer finished before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.001)
        if mode == "stall":
            assert proc.stdout.readline().strip() == "in-fsync"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        proc.stdout.close()  # the pipe of a killed child is ours to close
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists()
    assert shard_paths(tmp_path / "similar") == []
    assert read_table("similar", tmp_path / "similar").num_rows == 0
    assert remove_partials(tmp_path / "similar") == 1
    assert list((tmp_path / "similar").iterdir()) == []


def test_catalog_has_a_typed_view_per_table(tmp_path):
    write_shard("prompts", _rows(TABLES["prompts"], 4), tmp_path / "prompts" / "part-00000.parquet")
    con = connect(tmp_path)
    views = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    assert set(TABLES) <= views
    assert con.execute("SELECT count(*) FROM prompts").fetchone()[0] == 4
    assert con.execute("SELECT count(*) FROM rejected").fetchone()[0] == 0
    cols = [r[0] for r in con.execute("DESCRIBE rejected").fetchall()]
    assert cols == TABLES["rejected"].names


# --- whole folders swapped in together, and what a killed run leaves -------------

def _dead_pid() -> int:
    import subprocess

    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def test_staged_folders_swap_in_together_and_keep_old_ones_on_failure(tmp_path):
    from rlhf.store.io import staged_folders

    a, b = tmp_path / "a", tmp_path / "b"
    with staged_folders([a, b]) as st:
        (st[a] / "x").parent.mkdir(parents=True)
        (st[a] / "x").write_text("1")
        (st[b] / "y").parent.mkdir(parents=True)
        (st[b] / "y").write_text("1")
        assert not a.exists() and not b.exists()  # nothing visible before the swap
    assert (a / "x").read_text() == (b / "y").read_text() == "1"
    with pytest.raises(RuntimeError), staged_folders([a, b]) as st:
        st[a].mkdir()
        (st[a] / "x").write_text("2")
        raise RuntimeError("the stage failed")
    assert (a / "x").read_text() == "1"  # the previous folder stays whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]  # no staging left


@pytest.mark.parametrize("cut", ["before_any", "after_rename_old", "after_first_table"])
def test_a_swap_killed_half_way_is_finished_by_the_next_run(tmp_path, cut):
    """A journal of a dead process: each folder is old or new, never half; recover_swaps makes
    them all new and removes every leftover."""
    from rlhf.store.io import recover_swaps

    pid = _dead_pid()
    for name in ("prompts", "rejected"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "part-0.parquet").write_text("old")
        staging = tmp_path / f".{name}.staging-{pid}"
        staging.mkdir()
        (staging / "part-0.parquet").write_text("new")
    journal = tmp_path / f".swap-{pid}.json"
    journal.write_text(json.dumps([[str(tmp_path / f".{n}.staging-{pid}"), str(tmp_path / n)]
                                   for n in ("prompts", "rejected")]))
    if cut in ("after_rename_old", "after_first_table"):
        (tmp_path / "prompts").rename(tmp_path / f".prompts.old-{pid}")
    if cut == "after_first_table":
        (tmp_path / f".prompts.staging-{pid}").rename(tmp_path / "prompts")
    (tmp_path / f".leftover.staging-{pid}").mkdir()  # a dead run's staging, no journal
    (tmp_path / f".m.json.{pid}.tmp").write_text("half")
    assert recover_swaps([tmp_path / "prompts"]) == 1
    for name in ("prompts", "rejected"):
        assert _tree(tmp_path / name) == {"part-0.parquet": b"new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prompts", "rejected"]


def test_a_live_process_staging_is_left_alone(tmp_path):
    import os

    from rlhf.store.io import recover_swaps

    (tmp_path / f".prompts.staging-{os.getppid()}").mkdir()  # the parent process is alive
    recover_swaps([tmp_path / "prompts"])
    assert (tmp_path / f".prompts.staging-{os.getppid()}").is_dir()


def test_write_text_atomic_replaces_whole(tmp_path):
    from rlhf.store.io import write_text_atomic

    p = write_text_atomic(tmp_path / "m" / "x.json", '{"a": 1}\n')
    write_text_atomic(p, '{"a": 2}\n')
    assert json.loads(p.read_text()) == {"a": 2}
    assert [q.name for q in p.parent.iterdir()] == ["x.json"]


def test_writers_remove_what_killed_writers_left_but_not_live_ones(tmp_path):
    import os

    dead, live = _dead_pid(), os.getppid()
    d = tmp_path / "t"
    d.mkdir()
    (d / f".part-00000.parquet.{dead}.tmp").write_bytes(b"half")
    (d / f".part-00001.parquet.{live}.tmp").write_bytes(b"being written")
    ShardWriter("prompts", d).close()
    assert sorted(p.name for p in d.iterdir()) == [f".part-00001.parquet.{live}.tmp",
                                                   "part-00000.parquet"]
    from rlhf.store.io import write_text_atomic

    (tmp_path / f".m.json.{dead}.tmp").write_text("{")
    write_text_atomic(tmp_path / "m.json", "{}\n")
    assert not (tmp_path / f".m.json.{dead}.tmp").exists()
