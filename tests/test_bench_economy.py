"""bench/economy: the report's arithmetic on hand-made curves, and `--quick` end to end (a tiny
world, plain + seed PPO, one seed) so the benchmark harness cannot rot."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO

from bench.economy import job, prepare, results
from bench.economy import stats as st


def test_curve_interpolates_and_stops_at_the_last_point():
    grid = np.array([0, 50, 100, 150, 250])
    c = st.curve([(0, 1.0), (100, 2.0), (200, 2.5)], grid)
    assert c[:4].tolist() == [1.0, 1.5, 2.0, 2.25]
    assert math.isnan(c[4])  # no run is credited with tokens it did not spend


def test_tokens_to_reach_interpolates_the_first_crossing():
    assert st.tokens_to_reach([0, 100, 200], [1.0, 1.2, 1.4], 1.3) == pytest.approx(150)
    assert st.tokens_to_reach([0, 100, 200], [1.0, 1.5, 1.2], 1.25) == pytest.approx(50)
    assert st.tokens_to_reach([0, 100, 200], [1.0, 1.1, float("nan")], 1.3) == math.inf
    assert st.tokens_to_reach([0, 100], [1.0, 1.1], 0.9) == 0


def test_ratio_of_an_arm_twice_as_fast_as_the_baseline():
    grid = np.linspace(0, 200, 201)
    base = np.array([st.curve([(0, 1.0), (200, 1.0 + g)], grid) for g in (0.2, 0.2, 0.2)])
    fast = np.array([st.curve([(0, 1.0), (100, 1.0 + g), (200, 1.0 + g)], grid)
                     for g in (0.2, 0.2, 0.2)])
    r = st.ratio_with_interval(grid, base, fast, final_index=200, n_boot=200)
    assert r["target"] == pytest.approx(1.2)
    assert r["tokens_base"] == pytest.approx(200) and r["tokens_arm"] == pytest.approx(100)
    assert r["ratio"] == pytest.approx(0.5)
    assert r["ci_low"] == pytest.approx(0.5) and r["ci_high"] == pytest.approx(0.5)  # no spread
    r95 = st.ratio_with_interval(grid, base, fast, final_index=200, fraction=0.95, n_boot=50)
    # 0.95 x 1.2 = 1.14: the baseline's line needs 140 tokens, the fast arm 70
    assert r95["ratio"] == pytest.approx(0.5, abs=0.01)


def test_bootstrap_interval_widens_with_seed_spread():
    grid = np.linspace(0, 100, 101)
    base = np.array([st.curve([(0, 0.0), (100, g)], grid) for g in (0.8, 1.0, 1.2)])
    arm = np.array([st.curve([(0, 0.0), (100, g)], grid) for g in (1.0, 2.0, 3.0)])
    r = st.ratio_with_interval(grid, base, arm, final_index=100, n_boot=500)
    assert r["ratio"] == pytest.approx(0.5)  # target 1.0 reached by the mean curve (2.0) at 50
    assert r["ci_low"] < 0.5 < r["ci_high"]


def test_learns_verdict():
    assert st.gain_stats([0.10, 0.12, 0.11])["learns"] == "yes"
    assert st.gain_stats([0.30, 0.01, -0.01])["learns"] == "no"  # one seed not positive
    assert st.gain_stats([0.30, 0.02, 0.01])["learns"] == "no"  # mean < 3 standard errors
    g = st.gain_stats([0.1])
    assert g["learns"] == "n/a (1 seed)" and math.isnan(g["se"])


def table(report: str, heading: str) -> dict[str, dict[str, str]]:
    """{first cell: {column: cell}} of the markdown table after `heading`."""
    rows: list[str] = []
    for ln in report.split(heading, 1)[1].splitlines():
        if ln.startswith("|"):
            rows.append(ln)
        elif rows:
            break
    head = [c.strip() for c in rows[0].strip("|").split("|")]
    out = {}
    for ln in rows[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        out[cells[0]] = dict(zip(head, cells))
    return out


@pytest.mark.slow
def test_difference_interval_and_verdicts():
    same = st.difference_interval([0.19, 0.20, 0.21], [0.20, 0.19, 0.21])
    assert same[1] < 0 < same[2]  # seed noise: the interval holds 0
    worse = st.difference_interval([0.19, 0.20, 0.21], [0.05, 0.06, 0.07])
    assert worse[0] == pytest.approx(-0.14) and worse[2] < 0
    assert st.verdict(*same[1:], 0.5).endswith("saves compute")
    assert st.verdict(*same[1:], 1.0).startswith("same gold, no saving")
    assert st.verdict(*worse[1:], 0.5).startswith("costs gold")  # cheaper, but not lossless
    assert st.verdict(0.01, 0.03, None).startswith("more gold")
    assert st.verdict(math.nan, math.nan, 0.5) == "not enough seeds for a verdict"
    assert math.isnan(st.difference_interval([0.2], [0.1, 0.3])[1])


def test_saved_result_survives_a_new_default_off_switch_not_a_changed_value():
    spec = {"arm": {"trainer": "ppo"}, "steps": 4, "judge": prepare.WORLD_JUDGE,
            "base_config": {"learning_rate": 3e-5, "escalate_below": 0.0}}
    older = {**spec, "base_config": {"learning_rate": 3e-5}}  # saved before escalate_below
    assert results.spec_matches(older, spec)  # the field's default (0.0) is what it ran with
    changed = {**spec, "base_config": {**spec["base_config"], "escalate_below": 0.6}}
    assert not results.spec_matches(changed, spec)
    assert not results.spec_matches({**spec, "steps": 8}, spec)
    assert not results.spec_matches(None, spec)


def test_the_benchmark_reads_its_judge_from_params(tmp_path):
    """bench/economy judges with params.yaml's `judge:` (here a saved RM), scores with it and
    keeps results of two judges apart; a setup without one is the world's gold judge."""
    import argparse

    import ppo_tiny
    from params_file import write_params
    from rlhf.pipeline.models.judges import load_judge

    rm = ppo_tiny.build_world(tmp_path / "w")["reward"]
    params = write_params(tmp_path / "p.yaml", judge={"kind": "rm", "model": str(rm)})
    args = argparse.Namespace(quick=False, params=params, judge_model=None)
    setup = {"judge": prepare.judge_setup(args), "hashes": {}, "eval": {}}
    assert setup["judge"]["spec"]["name"] == f"rm:{rm}" and setup["judge"]["spec"]["model_hash"]
    judge = job.judge_of(setup)
    direct = load_judge(job.judge_config(setup))
    texts = (["Why is the sky blue?"] * 2, ["Light scatters.", "banana banana"])
    assert judge.score(*texts) == direct.score(*texts)
    world = results.spec_of({"hashes": {}, "eval": {}}, "sft")
    assert world["judge"] == prepare.WORLD_JUDGE
    assert not results.spec_matches(world, results.spec_of(setup, "sft"))
    assert results.spec_matches({"hashes": {}, "eval": {}}, world)  # saved before the judge


def test_quick_run_writes_a_report_with_real_numbers(tmp_path):
    out = tmp_path / "economy"
    env = {**os.environ, "RLHF_TORCH_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "bench.economy", "--quick",
                           "--out", str(out)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = (out / "BENCHMARKS.md").read_text()
    assert not (REPO / "BENCHMARKS.md").exists() or "--quick" not in (
        REPO / "BENCHMARKS.md").read_text()  # the quick report never lands in the repo
    for heading in ("## Rollout economy", "### Sample efficiency", "### Cost per run",
                    "- command (this report): `python -m bench.economy --quick", "- machine: ", "- date: "):
        assert heading in report
    assert (out / "economy_gold_vs_tokens.png").stat().st_size > 10_000
    efficiency = table(report, "### Sample efficiency")
    assert set(efficiency) == {"plain", "seed"}
    assert efficiency["plain"]["tokens to target: ratio [95 % CI]"].startswith("1 (baseline)")
    ratio = efficiency["seed"]["tokens to target: ratio [95 % CI]"]
    assert ratio == "n/a (target ≤ SFT)" or ratio == "not reached" or float(ratio.split()[0]) >= 0
    assert efficiency["seed"]["learns"] == "n/a (1 seed)"
    cost = table(report, "### Cost per run")
    assert int(cost["plain"]["generated tokens"].replace(",", "")) > 0
    assert int(cost["seed"]["light-RM calls"].replace(",", "")) > 0
    for arm in ("plain", "seed"):
        res = json.loads((out / "results" / arm / "seed0.json").read_text())
        assert res["cost"]["tokens_generated"] > 0 and res["cost"]["light_rm_calls"] > 0
        assert res["cost"]["rollouts_started"] == 8 * 4  # QUICK_STEPS x batch_size
        tokens = [p["tokens"] for p in res["points"]]
        assert tokens == sorted(tokens) and tokens[-1] == res["cost"]["tokens_generated"]
        assert all(0 <= p["gold_mean"] <= 5 and p["n"] == 8 for p in res["points"])
    assert json.loads((out / "results" / "seed" / "seed0.json").read_text())["features_on"]
    assert json.loads((out / "results" / "plain" / "seed0.json").read_text())["features_on"] == {}
    # a rerun skips what is there and reassembles the same report from the saved results
    again = subprocess.run([sys.executable, "-m", "bench.economy", "--quick",
                            "--out", str(out)], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=120, check=False)
    assert again.returncode == 0 and "0 job(s) to run" in again.stdout
    assert "### Sample efficiency" in (out / "BENCHMARKS.md").read_text()


@pytest.mark.slow
def test_quick_peers_grpo_and_rloo(tmp_path):
    """TRL's GRPO and RLOO arms on the quick world: same rollout count as PPO, checkpoints
    every `checkpoint_every` generation batches, every generated token counted."""
    out = tmp_path / "economy"
    proc = subprocess.run([sys.executable, "-m", "bench.economy", "--quick",
                           "--arms", "grpo", "rloo", "--out", str(out)], cwd=REPO,
                          env={**os.environ, "RLHF_TORCH_THREADS": "1"}, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for arm in ("grpo", "rloo"):
        res = json.loads((out / "results" / arm / "seed0.json").read_text())
        assert res["trainer"] == arm
        assert res["cost"]["rollouts_started"] == 8 * 4  # as many rollouts as a PPO arm
        assert res["cost"]["light_rm_calls"] == res["cost"]["rollouts_started"]
        assert [p["step"] for p in res["points"]] == [2, 4, 6, 8]  # generation batches
        tokens = [p["tokens"] for p in res["points"]]
        assert 0 < tokens[0] < tokens[-1] == res["cost"]["tokens_generated"] <= 8 * 4 * 16
    # no plain-PPO results: the report says so instead of inventing a baseline
    assert "No results yet" in (out / "BENCHMARKS.md").read_text()
