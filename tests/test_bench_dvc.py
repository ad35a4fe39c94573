"""bench/dvc.yaml: generated from the arms, each arm's deps exactly the code it runs (a feature's
module is a dep of an arm iff the arm switches that feature on), and the one-commit rule of the
report (a result from a dirty tree or from code that changed since is refused, one whose files
did not change is carried over)."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from conftest import REPO
from rlhf.pipeline.config import load_section

from bench.economy import dvc_stages, report, results
from bench.economy.arms import ARMS

STAGES = yaml.safe_load((REPO / "bench" / "dvc.yaml").read_text())["stages"]
BASE = load_section(REPO / "params.yaml", "ppo")


def deps(arm: str) -> set[str]:
    return set(STAGES[f"arm_{arm}"]["deps"])


def stale_after_touching(path: str) -> set[str]:
    """The arms DVC reruns when `path` (a repository file) changes: those whose deps name it
    or a folder above it."""
    rel = dvc_stages._rel(path)
    return {a for a in ARMS if any(rel == d or rel.startswith(d.rstrip("/") + "/")
                                           for d in deps(a))}


def test_the_stage_file_is_the_generated_one():
    assert (REPO / "bench" / "dvc.yaml").read_text() == dvc_stages.render(), \
        "bench/dvc.yaml is out of date: run python -m bench.economy.dvc_stages"
    assert {f"arm_{a}" for a in ARMS} | {"setup", "sft", "report", "report_all"} \
        == set(STAGES)
    seeds = dvc_stages.bench_params()["seeds"]
    for a in ARMS:
        st = STAGES[f"arm_{a}"]
        assert st["matrix"] == {"seed": seeds}
        assert st["outs"] == [f"results/{a}/seed${{item.seed}}.json"]


def test_touching_a_feature_module_makes_exactly_the_arms_that_switch_it_on_stale():
    owned = dvc_stages.feature_modules()
    assert owned, "no feature module found"
    for module in sorted(owned):
        users = {a for a in ARMS if dvc_stages.uses(module, a, BASE)}
        assert stale_after_touching(module) == users, module


def test_plain_ppo_depends_on_every_trainer_module_its_loop_imports():
    """A module the trainer's loop imports at the top runs in every PPO step, so plain PPO's
    stage must name it, even where a feature names it too (update.py: the schedules')."""
    import ast

    plain = deps("plain")
    loop = [p for p in (REPO / "pipeline" / "ppo").glob("*.py")]
    imported = set()
    for path in loop:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "rlhf.pipeline.ppo") and ".features" not in node.module:
                names = [node.module] if node.module != "rlhf.pipeline.ppo" else [
                    f"rlhf.pipeline.ppo.{a.name}" for a in node.names]
                imported |= {n.removeprefix("rlhf.").replace(".", "/") + ".py" for n in names}
    imported = {m for m in imported if (REPO / m).is_file()}
    assert "pipeline/ppo/update.py" in imported
    missing = {m for m in imported if dvc_stages._rel(m) not in plain}
    assert not missing, f"plain PPO's stage misses what its loop imports: {sorted(missing)}"


def test_the_arms_a_change_reruns_by_name():
    by_name = {p.rsplit("/", 1)[-1]: p for p in dvc_stages.feature_modules()}
    prune = {"pruning", "resampling", "pruning_resampling", "pruning_literal",
             "pruning_literal_truncation", "pruning_norep", "pruning_norep_truncation",
             "all_economy", "all_economy_ungated"}
    assert stale_after_touching(by_name["sample_economy.py"]) == prune
    assert stale_after_touching(by_name["prompt_scheduler.py"]) == {
        "scheduler", "scheduler_loose", "all_economy", "all_economy_ungated"}
    assert stale_after_touching(by_name["rm_evolution.py"]) == {
        "rm_evolution", "rm_evolution_ungated", "rm_evolution_human", "all_economy",
        "all_economy_ungated"}
    # our trainer's loop: every arm of ours, no TRL peer; the peers' module: the peers alone
    ours = {a for a, arm in ARMS.items() if arm.trainer == "ppo"}
    assert stale_after_touching("pipeline/ppo/trainer.py") == ours
    assert stale_after_touching("bench/economy/peers.py") == {"grpo", "grpo_dapo", "rloo"}
    assert stale_after_touching("pipeline/ppo/accounting.py") == set(ARMS)
    assert stale_after_touching("bench/economy/report.py") == set()


def test_artifacts_and_params_follow_the_inputs_an_arm_reads():
    assert "../artifacts/store/pool_embeddings" in deps("scheduler")
    assert "../artifacts/store/pool_embeddings" not in deps("plain")
    assert "../artifacts/models/rm_strong" in deps("level02")
    assert "../artifacts/models/rm_strong" not in deps("grpo")
    for a in ARMS:
        assert {"../artifacts/models/sft", "../artifacts/models/rm_light",
                "../artifacts/store/pool", "results/setup.json"} <= deps(a)
    prefs = {a for a in ARMS
             if "preferences" in STAGES[f"arm_{a}"]["params"][0]["../params.yaml"]}
    assert "level02" in prefs and "rm_evolution_human" in prefs and "plain" not in prefs
    headline = set(dvc_stages.bench_params()["headline"])
    assert {"plain", "grpo", "rloo", "grpo_dapo"} <= headline
    reported = {d.split("/")[1] for d in STAGES["report"]["deps"] if d.count("/") == 2}
    assert reported == headline  # `make bench` runs the headline arms and nothing else


def stale_after_changing(key: str) -> set[str]:
    """The stages DVC reruns when params.yaml's `ppo.<key>` changes: those whose params name it
    or the whole section (setup.json, which every arm reads, counts for every arm)."""
    def reads(stage: str) -> bool:
        ps = [k for entry in STAGES[stage].get("params", []) for k in entry.get("../params.yaml", [])]
        return "ppo" in ps or f"ppo.{key}" in ps

    if reads("setup"):
        return set(ARMS)
    return {a for a in ARMS if reads(f"arm_{a}")}


def test_a_switch_default_stales_the_arms_that_take_it_from_params_yaml_alone():
    from rlhf.pipeline.ppo.features.registry import plain_values

    section = yaml.safe_load((REPO / "params.yaml").read_text())["ppo"]
    switches = [k for k in plain_values() if k in section]
    assert {"engine", "critic"} <= set(switches), "the shipped non-plain defaults are switches"
    plain_based = {a for a, arm in ARMS.items() if arm.base == "plain"}
    for key in switches:
        stale = stale_after_changing(key)
        assert not stale & plain_based, (key, stale & plain_based)
        # a seed-based arm reruns unless it pins the switch itself
        assert stale == {a for a, arm in ARMS.items()
                         if arm.base != "plain" and key not in arm.overrides}, key
    # the budget and the held-out sampling: every arm
    for key in ("batch_size", "max_new_tokens", "temperature", "top_p", "eval_seed"):
        assert stale_after_changing(key) == set(ARMS), key
    # a core key plain PPO takes from params.yaml: every arm but the ones that pin it
    assert stale_after_changing("learning_rate") == {
        a for a, arm in ARMS.items() if "learning_rate" not in arm.overrides}


def test_an_arm_runs_the_config_its_params_declare(tmp_path):
    """What the arm trains with is plain(ppo) + its overrides: a switch outside its declared
    params leaves its config (and its spec) unchanged."""
    from dataclasses import asdict, replace

    setup = {"params": str(REPO / "params.yaml")}
    plain_arm, seed_arm = ARMS["plain"], ARMS["seed"]
    flipped = tmp_path / "params.yaml"
    doc = yaml.safe_load((REPO / "params.yaml").read_text())
    doc["ppo"]["critic"] = "full" if doc["ppo"]["critic"] != "full" else "trunk"
    flipped.write_text(yaml.safe_dump(doc))
    other = {"params": str(flipped)}
    assert asdict(results.base_of(setup, plain_arm)) == asdict(results.base_of(other, plain_arm))
    assert asdict(results.base_of(setup, seed_arm)) != asdict(results.base_of(other, seed_arm))
    # the snapshot runs' setup.json (with base_config) reads the same config
    snap = {"base_config": asdict(BASE)}
    assert results.base_of(snap, seed_arm) == replace(BASE)


# --------------------------------------------------------------------------- one commit
def _git(repo, *args):
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A git repository with two files an arm runs, in place of the checkout."""
    (tmp_path / "a.py").write_text("a = 1\n")
    (tmp_path / "b.py").write_text("b = 1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "one")
    monkeypatch.setattr(results, "REPO", tmp_path)
    monkeypatch.setattr(results, "job_code", lambda setup, arm: ["a.py", "b.py"])
    return tmp_path


def _commit(repo, msg):
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", msg)


def test_a_result_from_a_clean_tree_is_kept_while_its_files_do_not_change(repo):
    res = {"provenance": results.provenance(["a.py", "b.py"])}
    assert res["provenance"]["dirty"] == []
    assert report.code_verdict(res, {}, "plain") is None
    (repo / "c.txt").write_text("unrelated\n")  # a later commit that leaves its files alone
    _git(repo, "add", "c.txt")
    _commit(repo, "two")
    assert report.code_verdict(res, {}, "plain") is None  # carried over, not rerun
    (repo / "b.py").write_text("b = 2\n")
    _commit(repo, "three")
    why = report.code_verdict(res, {}, "plain")
    assert why and "changed since" in why and "b.py" in why


def test_a_folder_an_arm_runs_counts_as_its_files(repo, monkeypatch):
    """bench/dvc.yaml lists pipeline/decode/ as one dep: a clean folder is clean (make bench at
    e556e6e refused all 54 results as 'made from a dirty tree: pipeline/decode' before this)."""
    (repo / "pkg").mkdir()
    (repo / "pkg" / "m.py").write_text("m = 1\n")
    _git(repo, "add", "pkg")
    _commit(repo, "pkg")
    (repo / "pkg" / "__pycache__").mkdir()  # ignored build output is not a change
    prov = results.provenance(["a.py", "pkg"])
    assert prov["dirty"] == [] and set(prov["deps"]) == {"a.py", "pkg/m.py"}
    # the report keeps it (make bench at 1bc56bb refused all 54 as 'made by a different set of
    # files': the folder against its files) while the folder's files stay as they were
    monkeypatch.setattr(results, "job_code", lambda setup, arm: ["a.py", "pkg"])
    res = {"provenance": prov}
    assert report.code_verdict(res, {}, "plain") is None
    (repo / "pkg" / "m.py").write_text("m = 2\n")
    assert results.provenance(["a.py", "pkg"])["dirty"] == ["pkg/m.py"]
    _commit(repo, "m")
    assert "changed since: pkg/m.py" in report.code_verdict(res, {}, "plain")
    (repo / "pkg" / "m.py").write_text("m = 1\n")
    (repo / "pkg" / "n.py").write_text("n = 1\n")  # a file the folder gains
    _git(repo, "add", "pkg")
    _commit(repo, "n")
    assert "different set of files" in report.code_verdict(res, {}, "plain")


def test_a_result_from_a_dirty_tree_is_refused(repo):
    (repo / "a.py").write_text("a = 2\n")  # not committed
    res = {"provenance": results.provenance(["a.py", "b.py"])}
    assert res["provenance"]["dirty"] == ["a.py"]
    why = report.code_verdict(res, {}, "plain")
    assert why and "dirty tree" in why and "a.py" in why
    assert "no provenance" in report.code_verdict({}, {}, "plain")


def test_collect_lists_refused_results_as_stale_never_merges_them(repo, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    clean = {"spec": {"s": 1}, "provenance": results.provenance(["a.py", "b.py"])}
    (repo / "a.py").write_text("a = 3\n")
    dirty = {"spec": {"s": 1}, "provenance": results.provenance(["a.py", "b.py"])}
    for seed, res in ((0, clean), (1, dirty)):
        (out / "results" / "plain").mkdir(parents=True, exist_ok=True)
        (out / "results" / "plain" / f"seed{seed}.json").write_text(json.dumps(res))
    runs, stale = report.collect({}, out, ["plain"], lambda s, a: {"s": 1},
                                         lambda saved, spec: saved == spec, seeds=[0, 1, 2],
                                         check_code=True)
    assert len(runs["plain"]) == 1
    assert len(stale) == 2 and "dirty tree" in stale[0] and "missing" in stale[1]


# --------------------------------------------------------------------------- the report's columns
def test_last_point_says_whether_an_arm_still_rises():
    def run(*golds):
        return {"points": [{"gold_mean": g} for g in golds]}

    assert report.last_point([run(0.5, 0.6), run(0.5, 0.61), run(0.5, 0.59)]).endswith(
        "rising)")
    assert "flat or noisy" in report.last_point([run(0.6, 0.6), run(0.6, 0.61),
                                                          run(0.6, 0.59)])


def test_seconds_are_compared_only_under_a_timing_protocol():
    rs = [{"cost": {"tokens_generated": 10, "gen_token_forwards": 30}, "seconds_train": s,
           "seconds_eval": 1.0} for s in (5.0, 7.0, 6.0)]
    arms = {"plain": ARMS["plain"]}
    text = "\n".join(report.cost_section({"plain": rs}, arms, "none"))
    assert "policy token-fwd (gen)" in text and "| 30 |" in text
    assert "train s" not in text and "No seconds comparison" in text
    timed = "\n".join(report.cost_section({"plain": rs}, arms, "serial"))
    assert "timing protocol `serial`" in timed and "| plain | 6 [5, 7] | 1 |" in timed


# --------------------------------------------------------------------------- make bench's driver
def test_the_driver_guards_an_item_by_its_code_and_params_not_its_artifacts():
    """`dvc_stages.py --run` records an item (dvc commit) only when the files it checks did not
    change while the item ran: the item's code and params files, never the artifacts or results."""
    code = dvc_stages.item_code("bench/dvc.yaml:arm_plain@0")
    assert {"pipeline/ppo/trainer.py", "params.yaml", "bench/params.yaml",
            "bench/economy/driver.py"} <= set(code)
    assert not any(c.startswith(("artifacts/", "bench/results/")) for c in code)
    assert "pipeline/ppo/features/prompt_scheduler.py" not in code
    assert "pipeline/ppo/features/prompt_scheduler.py" in dvc_stages.item_code(
        "bench/dvc.yaml:arm_scheduler_loose@1")
    before = dvc_stages._code_state(code)
    assert before == dvc_stages._code_state(code) and len(before.split()) == len(code)


def test_verdicts_come_from_the_curves_and_the_counts():
    def runs(gain, forwards, engine="native", trainer="ppo"):
        return [{"cost": {"gen_token_forwards": forwards, "logprob_token_forwards": forwards},
                 "trainer": trainer, "features_on": {"engine": engine}} for _ in gain]

    import numpy as np

    base, cheap, worse = [0.19, 0.2, 0.21], [0.2, 0.19, 0.21], [0.05, 0.06, 0.07]
    arms = {"plain": (base, runs(base, 100, "hf")), "engine_native": (cheap, runs(cheap, 40)),
            "pruning": (worse, runs(worse, 40)), "scheduler": (base, runs(base, 40)),
            "spec_model": (cheap, runs(cheap, 30)), "grpo": (base, runs(base, 96, "trl", "grpo"))}
    curves = {a: np.array([[g] for g in gold]) for a, (gold, _) in arms.items()}
    text = "\n".join(report.verdict_section({a: r for a, (_, r) in arms.items()},
                                                    curves, 0, "plain"))
    row = {c[0]: c for c in (ln.strip("| ").split(" | ") for ln in text.splitlines()
                               if ln.startswith("| ") and " | `" in ln)}
    assert set(row) == {"engine_native", "pruning", "scheduler", "spec_model", "grpo"}
    # the engine is judged against plain PPO on hf, and saves compute there
    assert row["engine_native"][2:5] == ["`plain`", row["engine_native"][3], "0.40"]
    assert row["engine_native"][5].endswith("saves compute") and row["engine_native"][6] == "″"
    # a switch on the native engine against engine_native: the engine's 0.40 is not its saving
    # (it was once labelled "saves compute" against plain on hf)
    assert row["scheduler"][2] == "`engine_native`" and row["scheduler"][4] == "1.00"
    assert row["scheduler"][5].startswith("same gold, no saving")
    assert row["scheduler"][7] == "0.40"  # the headline column: against plain on hf
    assert row["spec_model"][4] == "0.75" and row["spec_model"][5].endswith("saves compute")
    assert row["pruning"][5].startswith("costs gold") and row["pruning"][7] == "0.40"
    # TRL's own generation has no same-engine reference: against plain
    assert row["grpo"][1:3] == ["trl", "`plain`"] and row["grpo"][4] == "0.96"
    assert "verdict against" in text and "headline: gold minus `plain`'s (hf)" in text
