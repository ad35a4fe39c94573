"""SIGKILL at a random point of `rlhf ingest`, `rlhf dedup`, `rlhf preferences`, `rlhf difficulty`
and `rlhf eval`, then the same command again: after each kill nothing half-written is visible
(every visible table or folder, and the metrics file, equals an uninterrupted run's), and the
rerun's outputs equal the uninterrupted run's, with no staging folder, journal or temporary file
left behind. `rlhf reward`'s kills (the longest, by far) are in tests/test_stage_kill_reward.py,
a file of its own so that `make test`'s workers (a file each at a time) run it beside these.

Real subprocesses of the `rlhf` console script, as in tests/test_ppo_resume.py. Each stage is
killed three times into the same output folder before the rerun: once a random moment after it
began writing (its first hidden staging folder appeared), then at random moments of an
uninterrupted run's duration; at least one kill must land while it writes. Inputs are tiny, so
each test takes well under a minute.

    python -m pytest -q -n 0 tests/test_stage_kill.py
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from params_file import write_params
from rlhf.store.io import read_table

pytestmark = pytest.mark.slow

TRIALS = 3
MID_WRITE_TRIES = 4


def _rlhf() -> str:
    exe = Path(sys.executable).with_name("rlhf")
    return str(exe) if exe.exists() else shutil.which("rlhf")


def _env(workers: int = 1) -> dict:
    """The stage's environment: its jobs inline (`workers` 1), or in `workers` processes as
    `make run` runs them. Inline by default: what a kill test proves (nothing half-written
    visible, the rerun's bytes) does not depend on where a stage's jobs ran, since only the
    stage's own process writes its outputs, and every worker process spawned costs a run some
    seconds (difficulty's kills took 79 s with 2 workers against 40 s inline). The jobs' bytes
    in workers equal the inline ones (tests/test_workers.py, test_eval.py,
    test_reward_ensemble.py); workers killed with their stage: tests/test_stage_kill_reward.py."""
    import os

    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1",
                RLHF_WORKERS=str(workers),
                TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
                PYTHONHASHSEED="0")


def _run(cmd: list[str], cwd: Path) -> float:
    t0 = time.monotonic()
    out = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600,
                         check=False)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return time.monotonic() - t0


def _kill(cmd: list[str], cwd: Path, delay: float, started: Callable[[], bool] | None) -> None:
    """Start `cmd`, SIGKILL it `delay` s after `started()` turns true (or after it starts)."""
    if isinstance(started, _TableStaged):
        started.arm()
    proc = subprocess.Popen(cmd, cwd=cwd, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while started is not None and not started() and proc.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def _hidden(root: Path) -> list[str]:
    """Staging / old folders, swap journals and temporary files under `root`."""
    return sorted(str(p.relative_to(root)) for p in root.rglob(".*")
                  if ".staging-" in p.name or ".old-" in p.name or p.name.startswith(".swap-")
                  or p.name.endswith(".tmp"))


def _kill_then_rerun(cmd: list[str], ref_seconds: float, cwd: Path, started: Callable[[], bool],
                     check_visible: Callable[[], None], seed: int, first_delay: float,
                     trials: int = TRIALS) -> None:
    """Kill `cmd` `trials` times into `cwd`: first up to `first_delay` s after `started()` (the
    stage is writing its outputs), then at random moments of `ref_seconds`; check what is
    visible after each kill; then run it to the end. At least one kill must have interrupted
    the writing (left a hidden staging folder), or the test would prove nothing: a write of a
    few ms can end before the kill lands, so the first kill is tried up to `MID_WRITE_TRIES`
    times (each a whole run up to the write) until one does."""
    rng = random.Random(seed)
    mid_write = 0
    for trial in range(trials):
        for _ in range(MID_WRITE_TRIES if trial == 0 else 1):
            if trial == 0:
                _kill(cmd, cwd, rng.uniform(0.0, first_delay), started)
            else:
                _kill(cmd, cwd, rng.uniform(0.2, 1.0) * ref_seconds, None)
            landed = any(".staging-" in h for h in _hidden(cwd))
            check_visible()  # whatever the kill interrupted, nothing half-written is visible
            if landed:
                break
        mid_write += landed
    assert mid_write >= 1, "no kill landed while the stage was writing: nothing was tested"
    _run(cmd, cwd)
    assert _hidden(cwd) == []  # the rerun removed what the killed runs left


def _same_table(table: str, got: Path, want: Path) -> None:
    assert read_table(table, got).equals(read_table(table, want)), table


def _metrics_equal(got: Path, want: Path, timing: tuple[str, ...] = ()) -> None:
    def clean(d):
        if isinstance(d, dict):
            return {k: clean(v) for k, v in d.items()
                    if not any(t in k for t in timing)}
        return d

    assert clean(json.loads(got.read_text())) == clean(json.loads(want.read_text()))


# --- ingest ---------------------------------------------------------------------------------

INGEST_PARAMS = {"ingest": {"rows_per_shard": 40, "batch_rows": 80}}
INGEST_TABLES = ("prompts", "rejected", "external_pairs")


def test_ingest_killed_at_random_points_then_rerun(tmp_path):
    from test_ingest import write_world_sources

    sources, _, _ = write_world_sources(tmp_path / "world", seed=3, n_lines=3000)
    write_params(tmp_path / "params.yaml", **INGEST_PARAMS)
    cmd = [_rlhf(), "ingest", "--sources", str(sources), "--out-store", "store",
           "--params", str(tmp_path / "params.yaml"), "--metrics", "metrics/ingest.json"]
    ref, work = tmp_path / "ref", tmp_path / "work"
    ref.mkdir()
    work.mkdir()
    seconds = _run(cmd, ref)
    assert len(list((ref / "store" / "prompts").glob("*.parquet"))) > 10  # many shards

    def visible() -> None:
        for t in INGEST_TABLES:
            if (work / "store" / t).exists():
                _same_table(t, work / "store" / t, ref / "store" / t)
        if (work / "metrics" / "ingest.json").exists():
            _metrics_equal(work / "metrics" / "ingest.json", ref / "metrics" / "ingest.json")

    def started() -> bool:
        return (work / "store").is_dir() and any(".staging-" in p.name
                                                 for p in (work / "store").iterdir())

    _kill_then_rerun(cmd, seconds, work, started, visible, seed=17, first_delay=0.3)
    for t in INGEST_TABLES:
        _same_table(t, work / "store" / t, ref / "store" / t)
    _metrics_equal(work / "metrics" / "ingest.json", ref / "metrics" / "ingest.json")


# --- dedup ----------------------------------------------------------------------------------

DEDUP_TABLES = ("pool", "similar")


def test_dedup_killed_at_random_points_then_rerun(tmp_path):
    from rlhf.pipeline.ingest import IngestConfig, run_ingest
    from test_ingest import write_world_sources

    sources, _, _ = write_world_sources(tmp_path / "world", seed=5, n_lines=300)
    ref, work = tmp_path / "ref", tmp_path / "work"
    run_ingest([sources], ref / "store", IngestConfig())
    shutil.copytree(ref / "store", work / "store")
    write_params(tmp_path / "params.yaml", dedup={"rows_per_shard": 5})
    cmd = [_rlhf(), "dedup", "--store", "store", "--cache", "cache", "--params",
           str(tmp_path / "params.yaml"), "--metrics", "metrics/dedup.json"]
    seconds = _run(cmd, ref)

    def visible() -> None:
        for t in DEDUP_TABLES:
            if (work / "store" / t).exists():
                _same_table(t, work / "store" / t, ref / "store" / t)
        if (work / "cache").exists():  # the cache holds whole shards of right embeddings
            got = read_table("embeddings", work / "cache").to_pylist()
            want = {r["content_hash"]: r for r in read_table("embeddings", ref / "cache")
                    .to_pylist()}
            assert all(want[r["content_hash"]] == r for r in got)
        if (work / "metrics" / "dedup.json").exists():
            _metrics_equal(work / "metrics" / "dedup.json", ref / "metrics" / "dedup.json",
                           timing=("embedded_",))

    def started() -> bool:  # writing pool / similar (shards of 5 rows: dozens of them)
        return any(".staging-" in p.name for p in (work / "store").iterdir())

    _kill_then_rerun(cmd, seconds, work, started, visible, seed=18, first_delay=0.02)
    for t in DEDUP_TABLES:
        _same_table(t, work / "store" / t, ref / "store" / t)
    cache = read_table("embeddings", work / "cache").to_pylist()
    assert len(cache) == len({r["content_hash"] for r in cache})  # nothing embedded twice
    assert sorted(r["content_hash"] for r in cache) == sorted(
        r["content_hash"] for r in read_table("embeddings", ref / "cache").to_pylist())
    # embedded_new / embedded_cached depend on where the kills fell; everything else is equal
    _metrics_equal(work / "metrics" / "dedup.json", ref / "metrics" / "dedup.json",
                   timing=("embedded_",))


# --- preferences (the tiny config of tests/test_stage_kill_reward.py, through `rlhf`) ------

PREFERENCES_PARAMS = {"preferences": {
    "k": 4, "max_new_tokens": 16, "heldout_fraction": 0.3,
    "annotators": {"n_annotators": 3, "drift_per_day": 0.5, "noise_std": 0.0,
                   "labels_per_day": 10}}}


class _TableStaged:
    """`started` for a stage that writes its one table at the end, in some ms (a shard or two,
    each fsynced): true once the table's staging folder shows under `root / store`, or a new
    table folder was swapped in (a write this watch missed: its inode is not the one an earlier
    run left, which `arm` notes before each run). The store folder appears first
    (`staged_folders` makes it just before the writing), so from then on this watches without
    sleeping, or `_kill`'s polling could miss the whole write."""

    def __init__(self, root: Path, table: str) -> None:
        self.store, self.table, self.before = root / "store", table, None

    def _inode(self) -> int | None:
        try:
            return (self.store / self.table).stat().st_ino
        except FileNotFoundError:
            return None

    def arm(self) -> None:
        self.before = self._inode()

    def __call__(self) -> bool:
        if not self.store.is_dir():
            return False
        # a store left by an earlier run shows from the start: watch up to the write then
        deadline = time.monotonic() + (2.0 if self.before is None else 60.0)
        while (not any(".staging-" in p.name for p in self.store.iterdir())
               and self._inode() == self.before and time.monotonic() < deadline):
            pass
        return True


def test_preferences_killed_at_random_points_then_rerun(tmp_path_factory, tmp_path):
    from tiny_world import trained_policy, write_pool

    _, sft = trained_policy(tmp_path_factory)
    pool = write_pool(tmp_path / "pool", n=160)
    write_params(tmp_path / "params.yaml", **PREFERENCES_PARAMS)
    # the simulated annotators and gold judge are the world's (the command has no test hook)
    cmd = [_rlhf(), "preferences", "--pool", str(pool), "--policy", str(sft),
           "--out", "store/preferences", "--params", str(tmp_path / "params.yaml"),
           "--metrics", "metrics/preferences.json"]
    ref, work = tmp_path / "ref", tmp_path / "work"
    ref.mkdir()
    work.mkdir()
    seconds = _run(cmd, ref)
    assert len(read_table("preferences", ref / "store" / "preferences")) == 4 * json.loads(
        (ref / "metrics" / "preferences.json").read_text())["n_prompts"] > 0

    def visible() -> None:
        if (work / "store" / "preferences").exists():
            _same_table("preferences", work / "store" / "preferences",
                        ref / "store" / "preferences")
        if (work / "metrics" / "preferences.json").exists():
            _metrics_equal(work / "metrics" / "preferences.json",
                           ref / "metrics" / "preferences.json")

    # the table (two shards) is written after all the sampling and annotating
    _kill_then_rerun(cmd, seconds, work, _TableStaged(work, "preferences"), visible, seed=20,
                     first_delay=0.005)
    _same_table("preferences", work / "store" / "preferences", ref / "store" / "preferences")
    _metrics_equal(work / "metrics" / "preferences.json", ref / "metrics" / "preferences.json")


# --- difficulty (the SFT policy above and a tiny seeded one-member RM) ----------------------

DIFFICULTY_PARAMS = {"difficulty": {"max_new_tokens": 16}}


def _tiny_scorer(folder: Path, tokenizer_from: Path) -> Path:
    """A reward-stage scorer folder of one untrained (seeded) member: difficulty only needs
    RM scores, not good ones, and training one would cost the reward stage's minute."""
    import torch
    from rlhf.pipeline.reward.scorer import save_scorer
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    tok = AutoTokenizer.from_pretrained(tokenizer_from)
    torch.manual_seed(0)
    member = LlamaForSequenceClassification(LlamaConfig(
        vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, pad_token_id=0, num_labels=1))
    member.save_pretrained(folder / "member_0")
    tok.save_pretrained(folder / "member_0")
    save_scorer(folder, ["member_0"], [0.0], 1.0, "mean", 64)
    return folder


def test_difficulty_killed_at_random_points_then_rerun(tmp_path_factory, tmp_path):
    from tiny_world import trained_policy, write_pool

    _, sft = trained_policy(tmp_path_factory)
    pool = write_pool(tmp_path / "pool", n=160)
    rm = _tiny_scorer(tmp_path / "rm", sft)
    write_params(tmp_path / "params.yaml", **DIFFICULTY_PARAMS)
    cmd = [_rlhf(), "difficulty", "--pool", str(pool), "--policy", str(sft),
           "--reward-model", str(rm), "--out", "store/difficulty",
           "--params", str(tmp_path / "params.yaml"), "--metrics", "metrics/difficulty.json"]
    ref, work = tmp_path / "ref", tmp_path / "work"
    ref.mkdir()
    work.mkdir()
    seconds = _run(cmd, ref)
    assert len(read_table("difficulty", ref / "store" / "difficulty")) == 160

    def visible() -> None:
        if (work / "store" / "difficulty").exists():
            _same_table("difficulty", work / "store" / "difficulty", ref / "store" / "difficulty")
        if (work / "metrics" / "difficulty.json").exists():
            _metrics_equal(work / "metrics" / "difficulty.json",
                           ref / "metrics" / "difficulty.json")

    # one shard, written after the sampling and the scoring
    _kill_then_rerun(cmd, seconds, work, _TableStaged(work, "difficulty"), visible, seed=21,
                     first_delay=0.005)
    _same_table("difficulty", work / "store" / "difficulty", ref / "store" / "difficulty")
    _metrics_equal(work / "metrics" / "difficulty.json", ref / "metrics" / "difficulty.json")


# --- eval ------------------------------------------------------------------------------------

EVAL_FILES = ("curves.csv", "samples.jsonl", "report.md", "gold_proxy_vs_kl.png",
              "metrics_sft_vs_ppo.png")


def test_eval_killed_at_random_points_then_rerun(tmp_path):
    from test_eval import _params, _world

    paths, ppo = _world(tmp_path / "inputs")
    params = _params(tmp_path / "inputs")
    cmd = [_rlhf(), "eval", "--sft", str(paths["policy"]), "--ppo", str(ppo),
           "--light-rm", str(paths["reward"]), "--strong-rm", str(paths["reward"]),
           "--prompts", str(paths["prompts"]), "--out", "eval/run", "--params", str(params),
           "--metrics", "metrics/eval.json"]
    ref, work = tmp_path / "ref", tmp_path / "work"
    ref.mkdir()
    work.mkdir()
    seconds = _run(cmd, ref)
    assert sorted(p.name for p in (ref / "eval" / "run").iterdir()) == sorted(EVAL_FILES)

    def same_folder() -> None:
        got = work / "eval" / "run"
        if got.exists():  # whole, and the uninterrupted run's bytes (plots included)
            assert sorted(p.name for p in got.iterdir()) == sorted(EVAL_FILES)
            for name in EVAL_FILES:
                assert (got / name).read_bytes() == (ref / "eval" / "run" / name).read_bytes(), \
                    name
        if (work / "metrics" / "eval.json").exists():
            _metrics_equal(work / "metrics" / "eval.json", ref / "metrics" / "eval.json")

    def staged() -> bool:
        folder = work / "eval"
        return folder.exists() and any(".staging-" in p.name for p in folder.iterdir())

    # the folder is written after every policy is sampled and judged: the first kill lands
    # some ms after its staging sibling appears, the others anywhere in the run
    _kill_then_rerun(cmd, seconds, work, staged, same_folder, seed=31, first_delay=0.01)
    same_folder()
    assert (work / "eval" / "run").exists() and (work / "metrics" / "eval.json").exists()
