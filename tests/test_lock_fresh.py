"""The CI lock check (.ci/lock_fresh.py): a clean clone's missing outputs pass; a changed
dependency, param or command fails."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("lock_fresh", ROOT / ".ci" / "lock_fresh.py")
lock_fresh = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lock_fresh)


def test_clean_clone_missing_outputs_pass(monkeypatch):
    monkeypatch.chdir(ROOT)
    status = {"sft": [{"changed deps": {"artifacts/world/demonstrations.jsonl": "deleted"}},
                      {"changed outs": {"artifacts/models/sft": "not in cache",
                                        "artifacts/reports/sft.json": "deleted"}}]}
    assert lock_fresh.problems(status) == []


def test_real_data_beside_the_clone_missing_passes_changed_fails(monkeypatch):
    """../shared/realdata is a dependency of `preferences` that git does not track (DVC reports
    it absolute): absent on a clone without it beside, allowed; other bytes, a stale lock."""
    monkeypatch.chdir(ROOT)
    hh = str(ROOT.parent / "shared" / "realdata" / "hh-rlhf__harmless-base_test.jsonl.gz")
    assert lock_fresh.problems({"preferences": [{"changed deps": {hh: "deleted"}}]}) == []
    assert lock_fresh.problems({"preferences": [{"changed deps": {hh: "modified"}}]}) == [
        f"preferences: dep {hh} modified"]


def test_changed_code_params_and_command_fail(monkeypatch):
    monkeypatch.chdir(ROOT)
    status = {"sft": [{"changed deps": {"pipeline/sft.py": "modified",
                                        "params.yaml": {"sft.epochs": "modified"}}},
                      {"changed outs": {"artifacts/metrics/sft.json": "modified"}},
                      {"changed command": True}],
              "eval": ["always changed"],
              "ppo": [{"changed deps": {"pipeline/ppo/config.py": "deleted"}}]}  # tracked code
    assert lock_fresh.problems(status) == [
        "eval: always changed",
        "ppo: dep pipeline/ppo/config.py deleted",
        'sft: params params.yaml {"sft.epochs": "modified"}',
        "sft: dep pipeline/sft.py modified",
        "sft: out artifacts/metrics/sft.json modified",
        "sft: changed command true",
    ]
