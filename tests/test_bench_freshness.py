"""BENCHMARKS.md's figures were made from `make run`'s artifacts (bench/economy/freshness.py): the
inputs bench/dvc.lock records (SFT policy, light RM, pool, difficulty, ...) are the hashes
dvc.lock records. A relock that changes one (another SFT policy, another RM) fails here until
`make bench` reruns the arms on it."""

import yaml

from bench.economy.freshness import REPO, committed, stale_inputs


def test_the_benchmark_read_the_artifacts_the_pipeline_locks():
    assert stale_inputs() == []


def _copies(tmp_path):
    """Both locks as committed, outside git (so read from disk): this checkout's dvc.lock may be
    another CPU model's `make run`."""
    bench, root = tmp_path / "bench.lock", tmp_path / "dvc.lock"
    bench.write_text(committed(REPO / "bench" / "dvc.lock"))
    root.write_text(committed(REPO / "dvc.lock"))
    return bench, root


def test_another_sft_policy_in_dvc_lock_is_a_stale_input(tmp_path):
    bench, root = _copies(tmp_path)
    lock = yaml.safe_load(root.read_text())
    for stage in lock["stages"].values():
        for out in stage.get("outs", []):
            if out["path"] == "artifacts/models/sft":
                out["md5"] = "0" * 32 + ".dir"
    root.write_text(yaml.safe_dump(lock))
    stale = stale_inputs(bench, root)
    assert len(stale) == 1 and stale[0].startswith("artifacts/models/sft: bench read ")


def test_a_bench_lock_that_ran_nothing_is_stale(tmp_path):
    bench, root = _copies(tmp_path)
    bench.write_text(yaml.safe_dump({"schema": "2.0", "stages": {}}))
    assert "make bench has not run" in stale_inputs(bench, root)[0]
    assert "make bench has not run" in stale_inputs(tmp_path / "absent.lock", root)[0]
