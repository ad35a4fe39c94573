"""What PPO records in the store besides rollouts: `rm_scores` (every RM score it uses, with
confidence, Level-2 escalation and fine-tune queueing) and `train_metrics` (the CSV line's six
metrics), and the audits that read them, on tiny real models."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

import ppo_tiny
from rlhf.cli.app import app
from rlhf.pipeline.config import build
from rlhf.pipeline.ppo.config import PPOConfig
from rlhf.pipeline.ppo.trainer import PPOTrainer, RunPaths
from rlhf.store.hashing import hex_key, tree_hash
from rlhf.store.io import read_table

pytestmark = pytest.mark.usefixtures("one_torch_thread")

runner = CliRunner()


def _invoke(*args: str) -> list[dict]:
    res = runner.invoke(app, [*args, "--format", "jsonl"])
    assert res.exit_code == 0, res.output
    return [json.loads(x) for x in res.stdout.splitlines()]


@pytest.fixture(scope="module")
def tiered_run(tmp_path_factory):
    """`rlhf ppo` on the tiny world with reward-stage RMs: the light RM (one member) and the
    strong one (two members), every record table in one store, texts kept (debug rollouts)."""
    root = tmp_path_factory.mktemp("tiered")
    world = ppo_tiny.build_world(root / "world", reward_stage=True)
    params = ppo_tiny.write_params(root / "params.yaml", total_steps=4, checkpoint_every=2,
                                   csv_every=2, escalate_below=0.6, debug_rollouts=True)
    store = root / "store"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        res = runner.invoke(app, [
            "ppo", "--policy", str(world["policy"]), "--reward", str(world["reward"]),
            "--strong-reward", str(world["strong_reward"]), "--prompts", str(world["prompts"]),
            "--out", str(root / "run"), "--rollouts", str(store / "rollouts"),
            "--rm-scores", str(store / "rm_scores"), "--train-metrics", str(store / "train_metrics"),
            "--checkpoint-table", str(store / "checkpoints"), "--params", str(params),
            "--run-id", "tiered", "--metrics", str(root / "ppo.json")])
    finally:
        torch.set_num_threads(threads)
    assert res.exit_code == 0, res.output
    return {"world": world, "store": store, "out": root / "run", "report": root / "ppo.json"}


def _key(row: dict) -> tuple:
    """(step, prompt, response key) of a rollout, or of an RM score (its full hash's key)."""
    key = row["response_key"] if "response_key" in row else hex_key(row["response_hash"])
    return row["step"], row["prompt_id"], key


def test_escalated_rollouts_are_scored_by_the_strong_rm(tiered_run):
    """Tier 2 exactly when the light RM's confidence is below 0.6; PPO's reward is then the
    strong RM's score of that very response (recomputed here from the stored texts)."""
    from rlhf.pipeline.models.scoring import load_scorer

    light = load_scorer(tiered_run["world"]["reward"])
    strong = load_scorer(tiered_run["world"]["strong_reward"], name="strong_rm")
    rows = read_table("rollouts", tiered_run["store"] / "rollouts").to_pylist()
    assert len(rows) == 4 * 4 and all(r["scorer"] != "fallback" for r in rows)
    prompts, responses = [r["prompt_text"] for r in rows], [r["response_text"] for r in rows]
    l_score, l_conf = light.score(prompts, responses)
    s_score, _ = strong.score(prompts, responses)
    tiers = [r["tier"] for r in rows]
    assert tiers == [2 if c < 0.6 else 1 for c in l_conf.tolist()]
    assert 0 < tiers.count(2) < len(rows)  # the tiny RMs put samples on both sides of the gate
    for r, ls, ss in zip(rows, l_score.tolist(), s_score.tolist()):
        assert r["scorer"] == ("strong_rm" if r["tier"] == 2 else "light_rm")
        assert r["reward"] == pytest.approx(ss if r["tier"] == 2 else ls, abs=1e-4)
    report = json.loads(tiered_run["report"].read_text())
    assert report["rollouts"] == 16 and report["escalated_rollouts"] == tiers.count(2)


def test_rm_scores_hold_one_row_per_score_used(tiered_run):
    rollouts = {_key(r): r for r in read_table("rollouts", tiered_run["store"] / "rollouts").to_pylist()}
    scores = read_table("rm_scores", tiered_run["store"] / "rm_scores").to_pylist()
    light = [s for s in scores if s["rm_name"] == "light_rm"]
    strong = [s for s in scores if s["rm_name"] == "strong_rm"]
    assert len(scores) == len(light) + len(strong)
    # one light-RM row per scored rollout, one more (the strong RM's) per escalated rollout
    assert sorted(_key(s) for s in light) == sorted(rollouts)
    assert sorted(_key(s) for s in strong) == sorted(k for k, r in rollouts.items() if r["tier"] == 2)
    for s in strong:
        r = rollouts[_key(s)]
        assert s["escalated"] and s["score"] == pytest.approx(r["reward"])
    for s in light:
        assert s["escalated"] == (rollouts[_key(s)]["tier"] == 2) == (s["confidence"] < 0.6)
    for s in scores:  # seed 000 §3.4: below the RM's 0.6 gate -> its fine-tune queue
        assert s["queued"] == (s["confidence"] < 0.6) and 0.0 <= s["confidence"] <= 1.0
    assert {s["rm_version"] for s in light} == {tree_hash(tiered_run["world"]["reward"])}
    assert {s["rm_version"] for s in strong} == {tree_hash(tiered_run["world"]["strong_reward"])}
    assert {s["run_id"] for s in scores} == {"tiered"}


def test_train_metrics_are_the_csv_lines(tiered_run):
    rows = sorted(read_table("train_metrics", tiered_run["store"] / "train_metrics").to_pylist(),
                  key=lambda r: r["step"])
    logged = {m["step"]: m for m in map(json.loads, (tiered_run["out"] / "metrics.jsonl")
                                        .read_text().splitlines())}
    assert [r["step"] for r in rows] == [2, 4]  # csv_every = 2, like metrics.csv
    pairs = {"rollout_success": "rollout_success_rate", "rew_mean": "reward_mean",
             "rew_std": "reward_std", "kl_div": "kl_div_mean", "clip_ratio": "clip_ratio",
             "critic_loss": "critic_loss", "entropy": "entropy_mean"}
    for r in rows:
        for col, key in pairs.items():
            assert r[col] == pytest.approx(logged[r["step"]][key], rel=1e-6, abs=1e-7)


def test_audits_rm_and_lineage_on_the_real_run(tiered_run):
    store = str(tiered_run["store"])
    rollouts = read_table("rollouts", tiered_run["store"] / "rollouts").to_pylist()
    n2 = sum(r["tier"] == 2 for r in rollouts)
    rm = {r["rm_name"]: r for r in _invoke("audit", "rm", "--store", store)}
    assert set(rm) == {"light_rm", "strong_rm"}
    assert rm["light_rm"]["scored"] == 16 and rm["light_rm"]["escalated"] == n2
    assert rm["light_rm"]["escalated_share"] == round(n2 / 16, 4)
    assert rm["light_rm"]["low_confidence_share"] == round(n2 / 16, 4)  # the gate is the same 0.6
    assert rm["strong_rm"]["scored"] == n2 and rm["strong_rm"]["escalated_share"] == 1.0
    lineage = _invoke("audit", "lineage", "tiered/policy-000004", "--store", store)
    assert {r["run_id"] for r in lineage} == {"tiered"}
    assert sum(r["rollouts"] for r in lineage) == 16
    assert sum(r["by_strong_rm"] for r in lineage) == n2
    assert sum(r["by_light_rm"] for r in lineage) == 16 - n2
    versions = lineage[0]["rm_versions"]
    assert versions == sorted([f"light_rm:{tree_hash(tiered_run['world']['reward'])}",
                               f"strong_rm:{tree_hash(tiered_run['world']['strong_reward'])}"])
    half = _invoke("audit", "lineage", "tiered/policy-000002", "--store", store)
    assert sum(r["rollouts"] for r in half) == 8


# --- the gate itself, with scorers whose confidence is set by hand

class GateScorer:
    """Light RM stand-in: confidence cycles 0.2, 0.6, 0.9, 0.59 over a batch; reward 0.5."""

    name = "light_rm"
    version = "light-v"
    CONF = (0.2, 0.6, 0.9, 0.59)

    def score(self, prompts, responses):
        conf = [self.CONF[i % 4] for i in range(len(prompts))]
        return torch.full((len(prompts),), 0.5), torch.tensor(conf)


class StrongStandIn:
    name = "strong_rm"
    version = "strong-v"
    gate = 0.95  # its own gate: every strong score here is queued

    def __init__(self):
        self.calls: list[int] = []

    def score(self, prompts, responses):
        self.calls.append(len(prompts))
        return torch.full((len(prompts),), 9.0), torch.full((len(prompts),), 0.9)


def _trainer(tmp_path, strong, **overrides) -> PPOTrainer:
    tok = ppo_tiny.tokenizer()
    cfg = build(PPOConfig, {**ppo_tiny.PARAMS, "csv_every": 1, **overrides}, "ppo")
    prompts = [(f"p{i:02d}", p) for i, p in enumerate(ppo_tiny.PROMPTS)]
    paths = RunPaths(tmp_path / "run", tmp_path / "rollouts", "gate", None,
                     tmp_path / "rm_scores", tmp_path / "train_metrics")
    return PPOTrainer(cfg, ppo_tiny.policy(tok), ppo_tiny.policy(tok), tok, GateScorer(),
                      prompts, paths, strong_scorer=strong)


def test_gate_is_strictly_below_escalate_below(tmp_path):
    strong = StrongStandIn()
    _trainer(tmp_path, strong, total_steps=2, escalate_below=0.6).train()
    rows = sorted(read_table("rollouts", tmp_path / "rollouts").to_pylist(),
                  key=lambda r: (r["step"], r["reward"]))
    # per step of 4: confidences 0.2 and 0.59 escalate; 0.6 (at the gate) and 0.9 do not
    assert [r["tier"] for r in rows] == [1, 1, 2, 2] * 2
    assert [r["reward"] for r in rows] == [0.5, 0.5, 9.0, 9.0] * 2
    assert strong.calls == [2, 2]  # only the escalated rollouts reach the strong RM
    scores = read_table("rm_scores", tmp_path / "rm_scores").to_pylist()
    assert len(scores) == 2 * (4 + 2)
    light = sorted((round(s["confidence"], 4), s["escalated"], s["queued"]) for s in scores
                   if s["rm_name"] == "light_rm")  # float32 confidences
    assert light == sorted([(0.2, True, True), (0.59, True, True),
                            (0.6, False, False), (0.9, False, False)] * 2)
    strong_rows = [s for s in scores if s["rm_name"] == "strong_rm"]
    assert all(s["queued"] and s["rm_version"] == "strong-v" for s in strong_rows)  # gate 0.95


def test_no_strong_rm_or_gate_zero_means_level_one_only(tmp_path):
    _trainer(tmp_path / "a", None, total_steps=1, escalate_below=0.6).train()
    strong = StrongStandIn()
    _trainer(tmp_path / "b", strong, total_steps=1, escalate_below=0.0).train()
    assert strong.calls == []
    for run in ("a", "b"):
        rows = read_table("rollouts", tmp_path / run / "rollouts").to_pylist()
        assert {r["tier"] for r in rows} == {1} and {r["scorer"] for r in rows} == {"light_rm"}
        scores = read_table("rm_scores", tmp_path / run / "rm_scores").to_pylist()
        assert len(scores) == 4 and not any(s["escalated"] for s in scores)


def test_fallback_rollouts_are_not_scored_records_and_nan_metrics_are_null(tmp_path):
    strong = StrongStandIn()
    _trainer(tmp_path, strong, total_steps=1, generation_timeout_s=1e-9,
             escalate_below=0.6).train()
    rows = read_table("rollouts", tmp_path / "rollouts").to_pylist()
    assert {r["scorer"] for r in rows} == {"fallback"} and {r["tier"] for r in rows} == {1}
    assert strong.calls == [] and read_table("rm_scores", tmp_path / "rm_scores").num_rows == 0
    (m,) = read_table("train_metrics", tmp_path / "train_metrics").to_pylist()
    assert m["rollout_success"] == 0.0 and m["clip_ratio"] is None and m["critic_loss"] is None
    logged = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert math.isnan(logged["clip_ratio"])  # no update: NaN in the log, null in the table


def test_bad_strong_reward_or_gate_is_a_clean_error(tmp_path):
    world = ppo_tiny.build_world(tmp_path / "world")
    base = ["ppo", "--policy", str(world["policy"]), "--reward", str(world["reward"]),
            "--prompts", str(world["prompts"]), "--out", str(tmp_path / "o"),
            "--rollouts", str(tmp_path / "r")]
    params = ppo_tiny.write_params(tmp_path / "p.yaml")
    res = runner.invoke(app, [*base, "--params", str(params), "--strong-reward", str(tmp_path)])
    assert res.exit_code == 2 and "not a reward-model folder" in " ".join(res.output.split())
    res = runner.invoke(app, [*base, "--params", str(params),
                              "--strong-reward", str(tmp_path / "missing")])
    assert res.exit_code == 2 and "does not exist" in " ".join(res.output.split())
    bad = ppo_tiny.write_params(tmp_path / "bad.yaml", escalate_below=1.5)
    res = runner.invoke(app, [*base, "--params", str(bad)])
    out = " ".join(res.output.split())
    assert res.exit_code == 2 and "escalate_below" in out and "Traceback" not in out


def test_step_accounting_adds_up_to_the_stored_rows(tiered_run):
    """Every generated token is counted: per step, tokens_generated is the sum of the rollout
    rows' generated_tokens; the run's totals (metrics, summary.json, train_metrics) are the sums
    of the steps; RM calls are what the tiers scored."""
    rollouts = read_table("rollouts", tiered_run["store"] / "rollouts").to_pylist()
    logged = [json.loads(x) for x in (tiered_run["out"] / "metrics.jsonl").read_text().splitlines()]
    for m in logged:
        rows = [r for r in rollouts if r["step"] == m["step"]]
        assert m["tokens_generated"] == sum(r["generated_tokens"] for r in rows) > 0
        # no drafter (ppo.draft none, the hf engine): every row drafted nothing
        assert m["drafted_tokens"] == m["accepted_tokens"] == 0
        assert all(r["drafted"] == r["accepted"] == 0 for r in rows)
        assert m["rollouts_started"] == len(rows) == m["rollouts_trained"] + m["rollouts_skipped"]
        assert m["strong_rm_calls"] == sum(r["tier"] == 2 for r in rows)
        assert m["light_rm_calls"] >= sum(r["scorer"] != "fallback" for r in rows)
        assert 0 < m["tokens_trained"] <= m["tokens_generated"]
        assert not any(k.startswith("seconds") for k in m)  # wall clock: timings.jsonl
    timings = [json.loads(x) for x in (tiered_run["out"] / "timings.jsonl").read_text().splitlines()]
    assert [t["step"] for t in timings] == [m["step"] for m in logged]
    for t in timings:
        assert all(t[f"seconds_{p}"] >= 0 for p in ("generate", "score", "update", "records"))
    assert logged[-1]["tokens_generated_cum"] == sum(m["tokens_generated"] for m in logged)
    summary = json.loads((tiered_run["out"] / "summary.json").read_text())
    assert summary["cost"]["tokens_generated_cum"] == logged[-1]["tokens_generated_cum"]
    tm = {r["step"]: r for r in read_table("train_metrics",
                                           tiered_run["store"] / "train_metrics").to_pylist()}
    assert tm[4]["tokens_generated_cum"] == logged[3]["tokens_generated_cum"]
    assert tm[2]["strong_rm_calls_cum"] == logged[0]["strong_rm_calls"] + logged[1]["strong_rm_calls"]
