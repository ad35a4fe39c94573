"""Issue 15 on the trainer's seam: Level 2's triggers and one reward scale (the strong-to-light
score map), the human queue, Level 0's token budget, the confidence gate's loss mask and the RM
that evolves with the policy (check, fine-tune, hot-swap, exact resume), on tiny real models."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import ppo_tiny
from rlhf.pipeline.config import ConfigError, build
from rlhf.pipeline.ppo.config import PPOConfig
from rlhf.pipeline.ppo.features.rm_evolution import gate_mask, relative_drop
from rlhf.pipeline.models.scoring import load_scorer
from rlhf.pipeline.ppo.features.tiers import capped, escalation_triggers
from rlhf.pipeline.ppo.features.inputs import annotator_pool
from rlhf.pipeline.ppo.trainer import PPOTrainer, RunPaths, hooks_for
from rlhf.pipeline.reward.score_map import ScoreMap
from rlhf.store.io import read_table

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPTS = [(f"p{i:02d}", p) for i, p in enumerate(ppo_tiny.PROMPTS)]


# --------------------------------------------------------------------------- pure pieces
def test_each_trigger_on_hand_made_rows():
    valid = [True, True, True, True, False]
    scores = [0.5, -2.0, 0.4, 0.3, -9.0]
    conf = [0.9, 0.9, 0.3, 0.9, 0.1]
    risk = [False, False, False, True, True]
    unsure = [False, False, False, False, True]
    t = escalation_triggers(valid, scores, conf, 0.6, -1.0, risk, unsure)
    assert t == [[], ["low_score"], ["confidence"], ["high_risk"], []]  # invalid: never
    # every trigger off: Level 1 only
    assert escalation_triggers(valid, scores, conf, 0.0, None, None, None) == [[]] * 5
    # one row meeting all four lists all four
    assert escalation_triggers([True], [-5.0], [0.1], 0.6, 0.0, [True], [True]) == [
        ["confidence", "low_score", "high_risk", "uncertain_cluster"]]


def test_the_cap_keeps_the_lowest_light_scores_in_row_order():
    trig = [["a"], [], ["a"], ["a"], ["a"]]
    scores = [0.0, -9.0, -3.0, 1.0, -1.0]
    assert capped(trig, scores, 1.0) == [0, 2, 3, 4]
    assert capped(trig, scores, 0.4) == [2, 4]  # floor(0.4 x 5) = 2: the two lowest
    assert capped(trig, scores, 0.01) == [2]  # at least one


def test_the_score_map_is_monotone_and_puts_the_source_on_the_target_scale():
    rng = np.random.default_rng(0)
    strong = rng.normal(3.0, 2.0, 500)
    light = 0.1 * strong - 1.0 + rng.normal(0, 0.01, 500)  # same order, another scale
    m = ScoreMap.fit(strong, light)
    x = np.linspace(-10, 15, 400)
    y = m(x)
    assert np.all(np.diff(y) > 0)  # strictly increasing, inside and beyond the knots
    assert np.abs(m(strong) - light).mean() < 0.02
    assert m(strong).std() == pytest.approx(light.std(), rel=0.05)
    rep = m.report(strong, light)
    assert rep["spearman_mapped_vs_light"] > 0.99 and rep["n"] == 500


def test_the_score_map_saves_loads_and_refuses_bad_input(tmp_path):
    m = ScoreMap.fit([0, 1, 2, 3, 4], [10, 20, 30, 40, 50])
    m.save(tmp_path)
    back = ScoreMap.load(tmp_path)
    assert back == m and back([2.5])[0] == pytest.approx(35.0)
    with pytest.raises(FileNotFoundError, match="score map"):
        ScoreMap.load(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="same samples"):
        ScoreMap.fit([0, 1, 2, 3], [1, 2, 3])
    with pytest.raises(ValueError, match="varying"):
        ScoreMap.fit([1, 1, 1, 1], [1, 2, 3, 4])
    with pytest.raises(ValueError, match="increasing"):
        ScoreMap((0.0, 1.0), (1.0, 0.0), 1.0)


def test_gate_mask_and_relative_drop():
    assert gate_mask([True, True, True, False], [0.2, 0.7, 0.1, 0.0],
                     [False, False, True, False], 0.6) == [0]
    assert relative_drop(0.8, 0.7) == pytest.approx(0.125)
    assert relative_drop(float("nan"), 0.5) == 0.0


@pytest.mark.parametrize("key,value,match", [
    ("escalate_score_quantile", 1.0, "ppo.escalate_score_quantile"),
    ("escalate_max_share", 0.0, "ppo.escalate_max_share"),
    ("rm_drop", -0.1, "ppo.rm_drop"),
    ("rm_check_samples", 2, "ppo.rm_check_samples"),
    ("rm_check_every", 0, "ppo.rm_check_every"),
    ("human_labels_per_step", -1, "ppo.human_labels_per_step"),
    ("escalate_uncertain", True, "ppo.schedule_on"),
])
def test_an_out_of_range_issue_15_key_is_an_error_naming_it(key, value, match):
    with pytest.raises(ConfigError, match=match):
        build(PPOConfig, {**ppo_tiny.PARAMS, key: value}, "ppo")


# --------------------------------------------------------------------------- on the trainer
class SpreadScorer:
    """Light RM stand-in: rewards 0, 1, 2, 3 and confidences 0.2, 0.9, 0.9, 0.59 over a batch."""

    name, version, gate = "light_rm", "light-v", 0.6

    def score(self, prompts, responses):
        n = len(prompts)
        return (torch.tensor([float(i % 4) for i in range(n)]),
                torch.tensor([(0.2, 0.9, 0.9, 0.59)[i % 4] for i in range(n)]))


class Strong:
    name, version, gate = "strong_rm", "strong-v", 0.6

    def __init__(self):
        self.calls: list[int] = []

    def score(self, prompts, responses):
        self.calls.append(len(prompts))
        return torch.full((len(prompts),), 9.0), torch.full((len(prompts),), 0.95)


def _trainer(tmp_path, scorer, strong=None, routes=None, annotators=None, smap=None, **over):
    tok = ppo_tiny.tokenizer()
    cfg = build(PPOConfig, {**ppo_tiny.PARAMS, "csv_every": 1, "debug_rollouts": True, **over},
                "ppo")
    paths = RunPaths(tmp_path / "run", tmp_path / "rollouts", "t", None, tmp_path / "rm_scores",
                     tables={"human_labels": tmp_path / "human_labels"})
    hooks = hooks_for(cfg, strong, tokenizer=tok, light_scorer=scorer, score_map=smap,
                      routes=routes, annotators=annotators)
    return PPOTrainer(cfg, ppo_tiny.policy(tok), ppo_tiny.policy(tok), tok, scorer, PROMPTS,
                      paths, strong_scorer=strong, hooks=hooks)


def _audit(store, *args):
    from typer.testing import CliRunner

    from rlhf.cli.app import app

    res = CliRunner().invoke(app, ["audit", *args, "--store", str(store), "--format", "jsonl"])
    assert res.exit_code == 0, res.output
    return [json.loads(x) for x in res.stdout.splitlines()]


def _rows(tmp_path, table="rollouts"):
    return sorted(read_table(table, tmp_path / table).to_pylist(),
                  key=lambda r: (r["step"], r["prompt_id"]))


def test_low_score_trigger_and_the_fitted_map_put_strong_scores_on_the_light_scale(tmp_path):
    strong = Strong()
    smap = ScoreMap((0.0, 10.0), (0.0, 1.0), 0.1)  # strong 9.0 -> light scale 0.9
    _trainer(tmp_path, SpreadScorer(), strong, smap=smap, total_steps=2,
             escalate_score_quantile=0.2, escalate_map="fitted").train()
    rows = _rows(tmp_path)
    l2 = [r for r in rows if r["tier"] == 2]
    # quantile 0.2 of {0, 1, 2, 3}: 0.6, so the row the light RM scored 0 escalates each step
    assert len(l2) == 2 and all("l2_low_score" in r["flags"] for r in l2)
    assert all(r["reward"] == pytest.approx(0.9) and r["rm_version"] == "strong-v" for r in l2)
    assert strong.calls == [1, 1]
    assert {r["rm_version"] for r in rows if r["tier"] == 1} == {"light-v"}


def test_without_the_map_the_strong_scale_reaches_ppo(tmp_path):
    _trainer(tmp_path, SpreadScorer(), Strong(), total_steps=1,
             escalate_score_quantile=0.2).train()
    assert [r["reward"] for r in _rows(tmp_path) if r["tier"] == 2] == [9.0]


def test_high_risk_routes_escalate_and_the_human_queue_labels_them(tmp_path):
    routes = {pid: SimpleNamespace(high_risk=pid in ("p00", "p01", "p02"), max_new_tokens=6,
                                   complexity="mid") for pid, _ in PROMPTS}
    strong = Strong()
    from rlhf.pipeline.preferences import PreferencesConfig

    t = _trainer(tmp_path, SpreadScorer(), strong, routes=routes,
                 annotators=annotator_pool(PreferencesConfig()), total_steps=3,
                 escalate_high_risk=True, human_labels_per_step=1)
    t.train()
    rows = _rows(tmp_path)
    l2 = [r for r in rows if r["tier"] == 2]
    assert l2 and all(r["prompt_id"] in ("p00", "p01", "p02") for r in l2)
    assert all("l2_high_risk" in r["flags"] for r in l2)
    labels = _rows(tmp_path, "human_labels")
    per_step = {}
    for lab in labels:
        per_step[lab["step"]] = per_step.get(lab["step"], 0) + 1
        assert lab["annotator_id"].startswith("ann-") and 0.0 <= lab["score"] <= 5.0
        assert lab["triggers"] == ["high_risk"]
    assert max(per_step.values()) == 1  # the label budget per step
    assert len(labels) == sum(1 for r in rows if "human_labelled" in r["flags"])
    # labelled at the run's simulated clock: 10 minutes a step
    times = sorted(lab["labeled_at"] for lab in labels)
    assert len(set(times)) == len(times)
    # `rlhf audit rm`: escalations by trigger and the human labels, on the strong RM's rows
    strong_rows = [r for r in _audit(tmp_path, "rm", "1") if r["rm_name"] == "strong_rm"]
    assert sum(r["by_high_risk"] for r in strong_rows) == len(l2)
    assert sum(r["human_labels"] for r in strong_rows) == len(labels)
    assert sum(r["by_low_score"] + r["by_confidence"] for r in strong_rows) == 0
    # `rlhf audit annotators` counts them with the preference campaign's labels
    ann = _audit(tmp_path, "annotators")
    assert sum(r["labels"] for r in ann) == len(labels)


def test_route_budget_stops_each_row_at_its_prompts_budget(tmp_path):
    routes = {pid: SimpleNamespace(high_risk=False, max_new_tokens=2 if i % 2 else 6,
                                   complexity="low" if i % 2 else "high")
              for i, (pid, _) in enumerate(PROMPTS)}
    _trainer(tmp_path, SpreadScorer(), routes=routes, total_steps=3, max_new_tokens=6,
             route_budget_on=True).train()
    rows = _rows(tmp_path)
    short = [r for r in rows if int(r["prompt_id"][1:]) % 2]
    assert short and all(r["generated_tokens"] <= 2 for r in short)
    assert any(r["generated_tokens"] > 2 for r in rows if not int(r["prompt_id"][1:]) % 2)


def test_the_confidence_gate_keeps_low_confidence_samples_out_of_the_update(tmp_path):
    t = _trainer(tmp_path, SpreadScorer(), total_steps=2, rm_gate_mask_on=True)
    last = t.train()
    rows = _rows(tmp_path)
    gated = [r for r in rows if r["scorer"] == "gated"]
    assert len(gated) == 4 and all(r["reward"] is None and r["rm_version"] == "light-v"
                                   for r in gated)  # confidences 0.2 and 0.59, twice
    assert last["rollouts_trained"] == 2 and last["rollouts_skipped"] == 2
    scores = read_table("rm_scores", tmp_path / "rm_scores").to_pylist()
    queued = [s for s in scores if s["queued"]]
    assert len(queued) == 4 and len(scores) == 8  # the gated ones keep their queued score row


class UngatedScorer(SpreadScorer):
    gate = 0.0  # reward.confidence_gate: 0, saved in scorer.json


def test_a_confidence_gate_of_0_gates_nothing(tmp_path):
    # 0 means no gate: it once became 0.6 through an `or 0.6` and gated the 0.2 and 0.59 rows
    last = _trainer(tmp_path, UngatedScorer(), total_steps=2, rm_gate_mask_on=True).train()
    assert not [r for r in _rows(tmp_path) if r["scorer"] == "gated"]
    assert last["rollouts_trained"] == 4 and last["rollouts_skipped"] == 0
    scores = read_table("rm_scores", tmp_path / "rm_scores").to_pylist()
    assert len(scores) == 8 and not any(s["queued"] for s in scores)


# --------------------------------------------------------------------------- RM evolution
@pytest.fixture(scope="module")
def rm_world(tmp_path_factory):
    return ppo_tiny.build_world(tmp_path_factory.mktemp("evo") / "world", reward_stage=True)


def _evolving(tmp_path, world, refresh=True, **over):
    light = load_scorer(world["reward"], "light_rm")
    strong = load_scorer(world["strong_reward"], "strong_rm")
    t = _trainer(tmp_path, light, strong, rm_evolve_on=True, rm_check_every=2,
                 rm_check_samples=8, rm_finetune_lr=0.01, **over)
    evo = next(h for h in t.hooks.all() if h.name == "rm_evolution")
    evo.pending_refresh = refresh  # as the collapse detector's rm_refresh would ask
    return t, evo, light


def test_a_refresh_fine_tunes_and_hot_swaps_the_light_rm(tmp_path, rm_world):
    t, evo, light = _evolving(tmp_path, rm_world, total_steps=4)
    before = {k: v.clone() for k, v in light.scorer.models[0].state_dict().items()}
    base = light.version
    t.train()
    assert evo.swaps >= 1 and light.version != base and light.version.startswith(base + "+e1")
    after = light.scorer.models[0].state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    rows = _rows(tmp_path)
    versions = [(r["step"], r["rm_version"]) for r in rows if r["tier"] == 1]
    assert {v for s, v in versions if s == 1} == {base}  # scored before the swap
    assert {v for s, v in versions if s >= 2} != {base}  # by the swapped RM after it
    scores = read_table("rm_scores", tmp_path / "rm_scores").to_pylist()
    assert {s["rm_version"] for s in scores if s["rm_name"] == "light_rm"} >= {base,
                                                                            light.version}
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    swaps = [e for e in events if e.get("kind", e.get("event")) == "rm_swap"]
    assert swaps and swaps[0]["reason"] == "rm_refresh"
    assert len(evo.checks) == 3 and evo.checks[0]["swapped"]  # steps 1 (refresh), 2, 4
    light_rows = [r for r in _audit(tmp_path, "rm", "1") if r["rm_name"] == "light_rm"]
    assert [r["swap"] for r in light_rows if r["rm_version"] == base] == [0]
    assert sum(r["swap"] for r in light_rows) == evo.swaps
    assert min(r["from_step"] for r in light_rows if r["rm_version"] != base) == 2


def test_a_collapse_the_detector_finds_refreshes_the_light_rm(tmp_path, rm_world):
    """No flag set by hand: the trainer's reward-collapse detector (seed 000 §5.1) trips on the
    light RM's own statistics and the RM evolution refreshes at the next step. Thresholds just
    above 0 make any step whose reward mean falls while its spread rises a collapse; Spearman
    checks are due only every 1,000 steps, so every check here is a refresh."""
    light = load_scorer(rm_world["reward"], "light_rm")
    strong = load_scorer(rm_world["strong_reward"], "strong_rm")
    t = _trainer(tmp_path, light, strong, total_steps=8, rm_evolve_on=True,
                 rm_check_every=1000, rm_check_samples=8, rm_finetune_lr=0.01,
                 collapse_detector_on=True, collapse_mean_drop=1e-6, collapse_std_rise=1e-6)
    evo = next(h for h in t.hooks.all() if h.name == "rm_evolution")
    base = light.version
    t.train()
    run = tmp_path / "run"
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    kind = [e.get("kind", e.get("event")) for e in events]
    tripped = [m["step"] for m in metrics if m["rm_refresh"]]
    assert tripped and tripped[0] < 8, "the detector never tripped: pick other thresholds"
    s = tripped[0]
    # the detector's own reading: the valid rows' reward mean fell and their spread rose
    rows = _rows(tmp_path)
    stats = [(np.mean(v), np.std(v, ddof=1)) for v in (
        [r["reward"] for r in rows if r["step"] == k and r["reward"] is not None]
        for k in (s - 1, s))]
    assert stats[1][0] < stats[0][0] and stats[1][1] > stats[0][1]
    refresh = next(e for e, k in zip(events, kind) if k == "rm_refresh")
    assert refresh["step"] == s and refresh["reward_mean"] == pytest.approx(stats[1][0], abs=1e-5)
    # the refresh at the next step: a check that fine-tuned and hot-swapped the light RM
    first = evo.checks[0]
    assert first["step"] == s + 1 and first["refresh_request"] and first["swapped"]
    swap = next(e for e, k in zip(events, kind) if k == "rm_swap")
    assert swap["step"] == s + 1 and swap["reason"] == "rm_refresh"
    assert evo.swaps == len(evo.checks) and light.version != base
    assert all(c["refresh_request"] for c in evo.checks)  # no scheduled check was due


def test_annotators_label_every_check_sample(tmp_path, rm_world):
    from rlhf.pipeline.preferences import PreferencesConfig

    light = load_scorer(rm_world["reward"], "light_rm")
    strong = load_scorer(rm_world["strong_reward"], "strong_rm")
    t = _trainer(tmp_path, light, strong, annotators=annotator_pool(PreferencesConfig()),
                 total_steps=4, rm_evolve_on=True, rm_check_every=2, rm_check_samples=8,
                 rm_label_source="annotators")
    evo = next(h for h in t.hooks.all() if h.name == "rm_evolution")
    last = t.train()
    labels = _rows(tmp_path, "human_labels")
    assert labels and all(x["triggers"] == ["rm_check"] and x["light_score"] is None
                          for x in labels)
    assert [c["human_labels"] for c in evo.checks] == [8, 8]  # steps 2 and 4: 8 samples each
    assert last["human_rm_calls_cum"] == len(labels) and last["strong_rm_calls_cum"] == 0
    with pytest.raises(ValueError, match="annotator pool"):
        _trainer(tmp_path / "x", light, strong, rm_evolve_on=True,
                 rm_label_source="annotators")


def test_no_drop_no_swap(tmp_path, rm_world):
    t, evo, light = _evolving(tmp_path, rm_world, refresh=False, total_steps=2, rm_drop=0.99)
    base = light.version
    t.train()
    assert evo.swaps == 0 and light.version == base and len(evo.checks) == 1
    assert evo.checks[0]["reference"] == evo.checks[0]["spearman"]


def test_resume_across_a_swap_equals_the_uninterrupted_run(tmp_path, rm_world):
    def strip(rows):
        return [{k: v for k, v in r.items() if k not in ("created_at", "scored_at")}
                for r in rows]

    t, evo, light = _evolving(tmp_path, rm_world, total_steps=4, checkpoint_every=2)
    t.train()
    rows, scores = strip(_rows(tmp_path)), strip(_rows(tmp_path, "rm_scores"))
    sha = (tmp_path / "run" / "weights-rank0.sha256").read_text()
    assert evo.swaps >= 1
    # as if killed after step 4 but before `latest` moved on: resume from step 2, the swap of
    # step 1 in that checkpoint, with a light RM freshly loaded from its folder
    (tmp_path / "run" / "checkpoints" / "latest").write_text("step-000002")
    again, evo2, light2 = _evolving(tmp_path, rm_world, refresh=False, total_steps=4,
                                    checkpoint_every=2)
    assert light2.version != light.version
    again.train(resume=True)
    assert (evo2.swaps, light2.version) == (evo.swaps, light.version)
    assert strip(_rows(tmp_path)) == rows and strip(_rows(tmp_path, "rm_scores")) == scores
    assert (tmp_path / "run" / "weights-rank0.sha256").read_text() == sha
