"""The prompt-embedding rollout scheduler (pipeline/ppo/features/prompt_scheduler.py; seed 001 §4.3):
the 7-of-10 rule and the high-uncertainty mark on hand-made embeddings and histories, the
exploration probability, the scale, then on the real trainer and a tiny Llama: a constant batch
refilled from the sampler, `schedule` rows that match what was rolled out, exact resume with the
schedule rows, and identical decisions on two processes (torchrun)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ppo_tiny
from rlhf.pipeline.config import ConfigError, build
from rlhf.pipeline.ppo.config import PPOConfig, features_on, plain
from rlhf.pipeline.ppo.features.prompt_scheduler import PromptScheduler, explore_probability, uniform
from rlhf.store.io import read_table, write_shard

# no exploration unless a test asks for it: a rule skip stays a skip
RAW = {"schedule_on": True, "schedule_scale": "raw", "schedule_explore_base": 0.0,
       "schedule_explore_horizon": 10 ** 6}


def cfg(**kw) -> PPOConfig:
    return build(PPOConfig, {**RAW, **kw}, "ppo")


def space(n: int = 12):
    """Prompt c (p00) at the origin direction, p01..p(n-1) ever further from it."""
    ids = [f"p{i:02d}" for i in range(n)]
    angles = np.linspace(0, 1.2, n)
    x = np.stack([np.cos(angles), np.sin(angles)], 1)
    return ids, x


def with_history(sched: PromptScheduler, histories: dict[str, list[float]], step: int = 1):
    """Feed histories through the observer, one reward per step (the trainer's only path)."""
    depth = max(len(v) for v in histories.values())
    for k in range(depth):
        rows = [{"prompt_id": p, "reward": v[k]} for p, v in histories.items() if k < len(v)]
        sched.observe(step + k, rows, {})
    return step + depth


def test_seven_of_ten_neighbours_below_low_skip_six_do_not():
    ids, x = space(12)
    flat, wild = [1.0, 1.1], [0.0, 3.0]  # raw variances 0.005 and 4.5
    # p00 (itself, the nearest) + p01..p06 flat = 7 of its 10 nearest; p07..p09 wild; p10, p11
    # are further than the 10 nearest and flat (must not count)
    hist = {p: (flat if i <= 6 or i >= 10 else wild) for i, p in enumerate(ids)}
    s = PromptScheduler(cfg(), ids, x, clusters={p: 3 for p in ids})
    step = with_history(s, hist)
    row = s.decide(step, "p00")
    assert row["decision"] == "skip" and row["reason"] == "low_variance"
    assert row["n_neighbours"] == 10 and row["n_low"] == 7
    assert row["neighbour_ids"] == ids[:10]  # itself first, then nearest first
    # the estimate: the neighbours' mean reward (mean of their window means, RM units)
    assert row["neighbour_mean"] == pytest.approx((7 * 1.05 + 3 * 1.5) / 10)
    assert row["neighbour_var"] == pytest.approx((7 * 0.005 + 3 * 4.5) / 10)

    hist["p06"] = wild  # now 6 of 10
    s2 = PromptScheduler(cfg(), ids, x)
    step = with_history(s2, hist)
    row = s2.decide(step, "p00")
    assert row["decision"] == "rollout" and row["n_low"] == 6
    # a neighbour with one reward has no variance: never "low"
    hist["p06"] = [1.0]
    s3 = PromptScheduler(cfg(), ids, x)
    row = s3.decide(with_history(s3, hist), "p00")
    assert row["n_low"] == 6 and row["decision"] == "rollout"


def test_high_variance_neighbourhood_rolls_out_and_marks_its_cluster():
    ids, x = space(12)
    s = PromptScheduler(cfg(schedule_high=0.8), ids, x,
                        clusters={p: (5 if i < 6 else 2) for i, p in enumerate(ids)})
    step = with_history(s, {p: [0.0, 2.0] for p in ids})  # variance 2 everywhere
    assert s.high_uncertainty_clusters() == []
    row = s.decide(step, "p00")
    assert row["decision"] == "rollout" and row["reason"] == "high_uncertainty"
    assert row["high_uncertainty"] and row["topic_cluster"] == 5
    assert s.high_uncertainty_clusters() == [5]
    assert s.high_uncertainty_clusters(since_step=step + 1) == []
    # the mark is in the checkpointed state
    s2 = PromptScheduler(cfg(), ids, x)
    s2.load_state_dict(json.loads(json.dumps(s.state_dict())))
    assert s2.high_uncertainty_clusters() == [5]


def test_cold_start_and_too_little_history_roll_out():
    ids, x = space(12)
    s = PromptScheduler(cfg(), ids, x)
    assert s.decide(1, "p00")["reason"] == "cold_start"  # nothing at all yet
    step = with_history(s, {p: [1.0, 1.0] for p in ids[:9]})  # 9 historical prompts < 10
    assert s.decide(step, "p00")["reason"] == "few_history"
    step = with_history(s, {"p09": [1.0, 1.0]}, step)
    assert s.decide(step, "p00")["decision"] == "skip"
    assert s.decide(step, "p11")["reason"] == "cold_start"  # never rolled out itself
    s.observe(step, [{"prompt_id": "p11", "reward": None}], {})  # a fallback: no reward
    assert s.decide(step + 1, "p11")["reason"] == "cold_start"


def test_exploration_probability_grows_with_steps_since_the_last_rollout():
    assert explore_probability(0, 0.05, 50) == pytest.approx(0.05)
    assert explore_probability(10, 0.05, 50) == pytest.approx(0.25)
    assert explore_probability(100, 0.05, 50) == 1.0
    ids, x = space(12)
    c = cfg(schedule_explore_base=0.1, schedule_explore_horizon=20)
    s = PromptScheduler(c, ids, x)
    last = with_history(s, {p: [1.0, 1.0] for p in ids}) - 1  # every prompt last rolled then
    for gap, p in ((1, 0.15), (10, 0.6), (25, 1.0)):
        rows = [s.decide(last + gap + 1000 * k, "p00") for k in range(1)]
        assert rows[0]["explore_p"] == pytest.approx(explore_probability(gap, 0.1, 20))
        assert rows[0]["explore_p"] == pytest.approx(p)
    # the retry rate over many (step, prompt) draws is the probability: 0.15 at a gap of 1
    retried = 0
    n = 0
    for i in range(400):
        s.last_rollout = {p: 10 * i for p in ids}
        for p in ids:
            r = s.decide(10 * i + 1, p)
            n += 1
            retried += r["reason"] == "explore"
    assert abs(retried / n - 0.15) < 0.03
    # the draw is a function of (seed, step, prompt) alone: what makes every process agree
    assert uniform(0, 7, "p03") == uniform(0, 7, "p03") != uniform(1, 7, "p03")


def test_standardised_variances_mean_the_same_for_any_rm_scale():
    ids, x = space(12)
    rng = np.random.default_rng(0)
    hist = {p: list(rng.normal(0, 1 if i % 3 else 0.2, 4)) for i, p in enumerate(ids)}
    scaled = {p: [5 * r + 40 for r in v] for p, v in hist.items()}
    std = dict(schedule_scale="standardised", schedule_neighbours=4, schedule_min_low=2)

    def decisions(h, **kw):
        s = PromptScheduler(cfg(**kw), ids, x)
        step = with_history(s, h)
        return [(r["decision"], r["n_low"]) for r in (s.decide(step, p) for p in ids)]

    assert decisions(hist, **std) == decisions(scaled, **std)
    raw = dict(schedule_neighbours=4, schedule_min_low=2)
    assert decisions(hist, **raw) != decisions(scaled, **raw)


def _pool(n: int, seed: int):
    """n unit prompts in 32-d with near-duplicate groups, and a reward history for each."""
    from rlhf.pipeline.dedup_cluster import planted_unit_vectors

    x, _ = planted_unit_vectors(n, dim=32, dup_share=0.5, seed=seed)
    rng = np.random.default_rng(seed)
    ids = [f"q{i:05d}" for i in range(n)]
    hist = {p: list(rng.normal(2.0, rng.choice([0.1, 1.5]), int(rng.integers(1, 4))))
            for p in ids}
    return ids, x, hist


@pytest.mark.parametrize("scale", ["raw", "standardised"])
def test_the_index_path_takes_the_brute_forces_decisions_where_its_recall_is_exact(scale):
    # 600 prompts: a flat (exact) index, so the neighbours must be the brute force's, in order
    ids, x, hist = _pool(600, seed=1)
    c = cfg(schedule_scale=scale, schedule_explore_base=0.2, schedule_explore_horizon=5)
    brute = PromptScheduler(c, ids, x)
    indexed = PromptScheduler(c, ids, x, index_min_history=0)
    step = with_history(brute, hist)
    assert with_history(indexed, hist) == step
    assert indexed._stats().get("indexed") and not brute._stats().get("indexed")
    cand = [(p, "") for p in ids[::3]] + [("unknown", "")]
    assert indexed.select(step, cand) == brute.select(step, cand)
    a, b = indexed.table_rows(step)["schedule"], brute.table_rows(step)["schedule"]
    assert [r["neighbour_ids"] for r in a] == [r["neighbour_ids"] for r in b]
    assert sum(r["decision"] == "skip" for r in a) >= 5
    for ra, rb in zip(a, b):
        assert {k: v for k, v in ra.items() if not isinstance(v, float)} == \
            {k: v for k, v in rb.items() if not isinstance(v, float)}
        for k, v in ra.items():
            if isinstance(v, float):
                assert v == pytest.approx(rb[k], rel=1e-9, nan_ok=True)
    # the checkpointed state is the same objects; a restored scheduler rebuilds its statistics
    assert indexed.state_dict() == brute.state_dict()
    restored = PromptScheduler(c, ids, x, index_min_history=0)
    restored.load_state_dict(indexed.state_dict())
    assert [restored.decide(step, p)["neighbour_ids"] for p in ids[:50]] == \
        [brute.decide(step, p)["neighbour_ids"] for p in ids[:50]]


def test_the_inverted_file_finds_nearly_every_brute_force_neighbour():
    # 6,000 prompts: above the flat index's 4,096 rows, an approximate inverted file
    ids, x, hist = _pool(6000, seed=2)
    brute = PromptScheduler(cfg(), ids, x)
    indexed = PromptScheduler(cfg(), ids, x, index_min_history=0)
    step = with_history(brute, hist)
    with_history(indexed, hist)
    asked = ids[::60]
    got = [set(r["neighbour_ids"]) for r in (indexed.decide(step, p) for p in asked)]
    want = [set(r["neighbour_ids"]) for r in (brute.decide(step, p) for p in asked)]
    assert all(len(g) == 10 for g in got)
    assert sum(len(g & w) for g, w in zip(got, want)) >= 0.9 * 10 * len(asked)


def test_config_validation_names_the_key_and_plain_ppo_has_it_off():
    with pytest.raises(ConfigError, match="ppo.schedule_min_low"):
        PPOConfig(schedule_neighbours=5, schedule_min_low=7)
    with pytest.raises(ConfigError, match="ppo.schedule_low"):
        PPOConfig(schedule_low=0.0)
    with pytest.raises(ConfigError, match="ppo.schedule_low must be < 1"):
        PPOConfig(schedule_low=1.5, schedule_high=2.0)
    with pytest.raises(ConfigError, match="ppo.schedule_high"):
        PPOConfig(schedule_low=0.3, schedule_high=0.2)
    with pytest.raises(ConfigError, match="ppo.schedule_explore_base"):
        PPOConfig(schedule_explore_base=1.5)
    with pytest.raises(ConfigError, match="ppo.schedule_window"):
        PPOConfig(schedule_window=1)
    assert PPOConfig().schedule_on is False
    on = PPOConfig(schedule_on=True)
    assert features_on(on) == {"schedule_on": True} and plain(on).schedule_on is False


# --------------------------------------------------------------------------- on the trainer
# skip as soon as 2 of a prompt's 3 nearest have two rewards in a narrow band (raw 10: every
# variance of the word scorer's rewards in [0, 1]), retried with probability 0.3 + gap / 1000
TRAIN = {"schedule_on": True, "schedule_scale": "raw", "schedule_low": 0.9,
         "schedule_high": 0.95, "schedule_neighbours": 3, "schedule_min_low": 2,
         "schedule_window": 2, "schedule_explore_base": 0.3, "schedule_explore_horizon": 1000}


def tiny_space():
    ids = [f"p{i:02d}" for i in range(len(ppo_tiny.PROMPTS))]
    x = np.random.default_rng(3).normal(size=(len(ids), 8)).astype(np.float32)
    return ids, x / np.linalg.norm(x, axis=1, keepdims=True)


def write_embeddings(folder: Path) -> Path:
    ids, x = tiny_space()
    write_shard("pool_embeddings", [{"prompt_id": p, "model_id": "test", "embedding": v.tolist()}
                                    for p, v in zip(ids, x)], folder / "part-00000.parquet")
    return folder


def schedule_rows(folder: Path) -> list[dict]:
    return sorted(read_table("schedule", folder).to_pylist(),
                  key=lambda r: (r["step"], r["prompt_id"], r["decision"], r["reason"]))


def check_rows_match_rollouts(sched: list[dict], rollouts: list[dict], steps: int, per_step: int):
    for step in range(1, steps + 1):
        rolled = sorted(r["prompt_id"] for r in rollouts if r["step"] == step)
        decided = sorted(r["prompt_id"] for r in sched
                         if r["step"] == step and r["decision"] == "rollout")
        assert len(rolled) == per_step and rolled == decided, step


@pytest.mark.usefixtures("one_torch_thread")
def test_skipped_prompts_are_refilled_to_a_constant_batch_and_every_decision_is_a_row(tmp_path):
    from rlhf.pipeline.ppo.trainer import PPOTrainer, RunPaths, hooks_for

    tok = ppo_tiny.tokenizer()
    c = build(PPOConfig, {**ppo_tiny.PARAMS, **TRAIN, "total_steps": 10}, "ppo")
    prompts = [(f"p{i:02d}", p) for i, p in enumerate(ppo_tiny.PROMPTS)]
    paths = RunPaths(tmp_path / "run", tmp_path / "rollouts", "sched",
                     tables={"schedule": tmp_path / "schedule"})
    hooks = hooks_for(c, None, tiny_space())
    gate = hooks.gates[0]
    assert hooks.observers == [gate] and gate.name == "prompt_scheduler"
    tr = PPOTrainer(c, ppo_tiny.policy(tok), ppo_tiny.policy(tok), tok, ppo_tiny.WordScorer(),
                    prompts, paths, hooks=hooks)
    tr.train()
    metrics = [json.loads(x) for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert [m["rollouts_started"] for m in metrics] == [4] * 10  # always a full batch
    rows = schedule_rows(tmp_path / "schedule")
    skips = [r for r in rows if r["decision"] == "skip"]
    assert skips and sum(m["prompts_screened"] for m in metrics) == len(skips)
    assert all(r["reason"] == "low_variance" and r["neighbour_mean"] is not None
               and r["n_low"] >= 2 and 0.3 <= r["explore_p"] < 1 for r in skips)
    assert any(r["reason"] == "explore" for r in rows)
    assert rows[0]["reason"] == "cold_start" and rows[0]["run_id"] == "sched"
    check_rows_match_rollouts(rows, read_table("rollouts", tmp_path / "rollouts").to_pylist(),
                              10, 4)
    state = json.loads((tmp_path / "run/checkpoints/step-000010/trainer_state.json").read_text())
    assert state["hooks"]["prompt_scheduler"] == json.loads(json.dumps(gate.state_dict()))


@pytest.mark.usefixtures("one_torch_thread")
def test_resume_from_a_checkpoint_redoes_the_same_decisions_and_schedule_rows(tmp_path):
    from rlhf.pipeline.ppo.trainer import run

    world = ppo_tiny.build_world(tmp_path / "world")
    emb = write_embeddings(tmp_path / "emb")
    c = build(PPOConfig, {**ppo_tiny.PARAMS, **TRAIN, "total_steps": 8, "checkpoint_every": 3},
              "ppo")
    a = tmp_path / "a"
    kw = dict(run_id="run", progress=False, inputs={"embeddings": emb})
    run(c, world["policy"], world["reward"], world["prompts"], a, tmp_path / "rows_a",
        tables={"schedule": tmp_path / "sched_a", "human_labels": tmp_path / "labels_a"}, **kw)
    sched_a = schedule_rows(tmp_path / "sched_a")
    # the human queue is off: its declared folder holds a note (DVC warns of an empty folder)
    # and reads as an empty table; the scheduler's, on, holds its shards and no note
    from rlhf.pipeline.ppo.trainer import NO_ROWS

    assert "human_labels_per_step" in (tmp_path / "labels_a" / NO_ROWS).read_text()
    assert read_table("human_labels", tmp_path / "labels_a").num_rows == 0
    assert not (tmp_path / "sched_a" / NO_ROWS).exists()
    rows_a = read_table("rollouts", tmp_path / "rows_a").to_pylist()
    assert any(r["decision"] == "skip" and r["step"] > 3 for r in sched_a)
    # the same run "killed" after checkpoint 3: its folders as they were, latest -> step 3
    b = tmp_path / "b"
    shutil.copytree(a, b)
    shutil.copytree(tmp_path / "rows_a", tmp_path / "rows_b")
    shutil.copytree(tmp_path / "sched_a", tmp_path / "sched_b")
    (b / "checkpoints" / "latest").write_text("step-000003")
    run(c, world["policy"], world["reward"], world["prompts"], b, tmp_path / "rows_b",
        tables={"schedule": tmp_path / "sched_b"}, resume=True, **kw)
    assert schedule_rows(tmp_path / "sched_b") == sched_a
    strip = [{k: v for k, v in r.items() if k != "created_at"} for r in rows_a]
    assert sorted(({k: v for k, v in r.items() if k != "created_at"}
                   for r in read_table("rollouts", tmp_path / "rows_b").to_pylist()),
                  key=lambda r: (r["step"], r["prompt_id"], r["response_key"])) == \
        sorted(strip, key=lambda r: (r["step"], r["prompt_id"], r["response_key"]))
    assert (b / "weights-rank0.sha256").read_text() == (a / "weights-rank0.sha256").read_text()


@pytest.mark.slow
def test_two_processes_take_identical_decisions_under_torchrun(tmp_path):
    world = ppo_tiny.build_world(tmp_path / "world")
    emb = write_embeddings(tmp_path / "emb")
    params = ppo_tiny.write_params(tmp_path / "params.yaml", total_steps=8, batch_size=2,
                                   checkpoint_every=4, **TRAIN)
    torchrun = Path(sys.executable).with_name("torchrun")
    rlhf = Path(sys.executable).with_name("rlhf")
    cmd = [str(torchrun), "--nproc_per_node", "2", "--master_port",
           str(29100 + os.getpid() % 700), "-m", "rlhf.cli.app", "ppo",
           "--policy", str(world["policy"]), "--reward", str(world["reward"]),
           "--prompts", str(world["prompts"]), "--out", str(tmp_path / "dp"),
           "--rollouts", str(tmp_path / "rows"), "--params", str(params), "--run-id", "run",
           "--embeddings", str(emb), "--schedule", str(tmp_path / "sched")]
    assert rlhf.exists()
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONHASHSEED="0")
    env.pop("WORLD_SIZE", None)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    sched = schedule_rows(tmp_path / "sched")
    assert any(r["decision"] == "skip" for r in sched)
    # rank 1 rolled out its share of its *own* decisions, rank 0 wrote its own: equal only if
    # both processes decided alike, on every step
    check_rows_match_rollouts(sched, read_table("rollouts", tmp_path / "rows").to_pylist(), 8, 4)
    assert (tmp_path / "dp/weights-rank0.sha256").read_text() == \
        (tmp_path / "dp/weights-rank1.sha256").read_text()
    assert math.isfinite(json.loads((tmp_path / "dp/summary.json").read_text())["steps"])


def test_audit_schedule_counts_skips_by_window_bucket_and_cluster(tmp_path):
    from typer.testing import CliRunner

    from rlhf.cli.app import app

    store = tmp_path / "store"

    def row(step, pid, decision, cluster, reason="varied"):
        return {"run_id": "r", "step": step, "prompt_id": pid, "topic_cluster": cluster,
                "decision": decision, "reason": reason, "own_rollouts": 2,
                "steps_since_rollout": 3, "n_neighbours": 10, "n_low": 7,
                "neighbour_mean": 1.0 if decision == "skip" else None, "neighbour_var": 0.1,
                "reward_var": 1.0, "explore_p": None, "high_uncertainty": False,
                "neighbour_ids": []}

    rows = [row(1, "a", "rollout", 0), row(1, "b", "skip", 0), row(2, "a", "skip", 0),
            row(2, "c", "rollout", 1, "explore"), row(3, "c", "unused", 1), row(3, "b", "skip", 0)]
    write_shard("schedule", rows, store / "schedule" / "run_id=r" / "step_bucket=0"
                / "part-000000001-000000003.parquet")
    diff = [{"prompt_id": p, "text": p, "split": "ppo", "topic_cluster": 0, "length": 1,
             "logprob_std": 0.1, "rm_score": 0.0, "score": s, "bucket": b}
            for p, s, b in (("a", 1.0, "low"), ("b", 8.0, "high"))]
    write_shard("difficulty", diff, store / "difficulty" / "part-00000.parquet")
    res = CliRunner().invoke(app, ["audit", "schedule", "2", "--store", str(store),
                                   "--format", "jsonl"])
    assert res.exit_code == 0, res.output
    out = [json.loads(x) for x in res.stdout.splitlines()]
    run = [r for r in out if r["breakdown"] == "run"][0]
    assert (run["decisions"], run["skips"], run["skip_rate"], run["explored"]) == (5, 3, 0.6, 1)
    assert run["trigger_rate"] == 0.4 and run["skip_estimate_mean"] == 1.0
    win = {r["step_from"]: (r["decisions"], r["skips"]) for r in out
           if r["breakdown"] == "step window"}
    assert win == {1: (4, 2), 3: (1, 1)}
    buckets = {r["bucket"]: r["skip_rate"] for r in out if r["breakdown"] == "difficulty bucket"}
    assert buckets == {"low": 0.5, "high": 1.0, "(unscored)": 0.0}
    clusters = {r["topic_cluster"]: r["skips"] for r in out if r["breakdown"] == "topic cluster"}
    assert clusters == {0: 3, 1: 0}
