"""The feature registry (pipeline/ppo/features/registry.py) on the real trainer and a tiny Llama:
a toy feature added from this test module alone (one `register` call, no edit anywhere else)
runs two PPO steps; the registry and the loop agree on every switch, field, input and table."""

import dataclasses
import inspect
import json
import re
from pathlib import Path

import pytest

import ppo_tiny
from rlhf.pipeline.config import ConfigError, build
from rlhf.pipeline.ppo import config as ppo_config
from rlhf.pipeline.ppo.config import CORE_FIELDS, PPOConfig, features_on, plain, with_values
from rlhf.pipeline.ppo.features import (FEATURES, ConfigField, Feature, FeatureContext,
                                        build_hooks, register, registry, unregister)
from rlhf.pipeline.ppo.hooks import HookBase

REPO = Path(__file__).resolve().parents[1]


class SkipEveryThird(HookBase):
    """The toy feature: a prompt gate that skips every third candidate it is shown."""

    name = "skip_every_third"

    def __init__(self):
        self.seen = 0

    def select(self, step, candidates):
        keep = [(self.seen + i) % 3 != 2 for i in range(len(candidates))]
        self.seen += len(candidates)
        return keep

    def state_dict(self):
        return {"seen": self.seen}

    def load_state_dict(self, state):
        self.seen = state["seen"]


@pytest.fixture
def toy_feature():
    feature = register(Feature(
        "skip_every_third", {"skip_third_on": False}, help="skip every third prompt",
        build=lambda cfg, ctx: [SkipEveryThird()],
        fields=(ConfigField("skip_third_on", bool, False, "the toy switch"),)))
    yield feature
    unregister(feature.name)


@pytest.mark.usefixtures("one_torch_thread")
def test_a_toy_feature_from_a_test_module_runs_two_ppo_steps(tmp_path, toy_feature):
    from rlhf.pipeline.ppo.trainer import PPOTrainer, RunPaths

    cfg = build(PPOConfig, {**ppo_tiny.PARAMS, "total_steps": 2, "max_new_tokens": 4,
                            "skip_third_on": True}, "ppo")  # a params.yaml key like any other
    assert cfg.skip_third_on is True and features_on(cfg)["skip_third_on"] is True
    assert plain(cfg).skip_third_on is False and PPOConfig().skip_third_on is False
    tok = ppo_tiny.tokenizer()
    hooks = build_hooks(cfg, FeatureContext(cfg, tokenizer=tok))
    assert [type(g) for g in hooks.gates] == [SkipEveryThird] and hooks.names() == [
        "skip_every_third"]
    prompts = [(f"p{i:02d}", p) for i, p in enumerate(ppo_tiny.PROMPTS)]
    tr = PPOTrainer(cfg, ppo_tiny.policy(tok), ppo_tiny.policy(tok), tok, ppo_tiny.WordScorer(),
                    prompts, RunPaths(tmp_path / "run", tmp_path / "rows", "toy"), hooks=hooks)
    tr.train()
    metrics = [json.loads(x) for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert [m["rollouts_started"] for m in metrics] == [4, 4]  # refilled to a full batch
    gate = hooks.gates[0]
    # every third candidate shown was skipped and counted; each step drew 4 more once
    skipped = sum(i % 3 == 2 for i in range(gate.seen))
    assert gate.seen == 16 and sum(m["prompts_screened"] for m in metrics) == skipped == 5
    state = json.loads((tmp_path / "run/checkpoints/step-000002/trainer_state.json").read_text())
    assert state["hooks"]["skip_every_third"] == {"seen": gate.seen}


def test_off_by_default_and_bad_values_are_one_line_errors(toy_feature):
    assert build_hooks(PPOConfig(), FeatureContext(PPOConfig())).names() == []
    with pytest.raises(ConfigError, match="ppo.skip_third_on must be bool"):
        build(PPOConfig, {"skip_third_on": "yes"}, "ppo")
    with pytest.raises(ConfigError, match="unknown key"):
        build(PPOConfig, {"skip_thrid_on": True}, "ppo")
    assert with_values(PPOConfig(), skip_third_on=True, batch_size=4).skip_third_on is True


def test_a_feature_cannot_take_a_key_another_owns():
    with pytest.raises(ValueError, match="already belong to prompt_scheduler"):
        register(Feature("thief", {"schedule_on": False}))
    assert "thief" not in FEATURES


def test_every_ppo_field_is_the_loops_or_exactly_one_features():
    owned = [k for f in FEATURES.values() for k in f.owned()]
    assert len(owned) == len(set(owned))  # no key owned twice
    fields = [f.name for f in dataclasses.fields(PPOConfig)]
    assert sorted(set(owned) | set(CORE_FIELDS)) == sorted(fields)
    assert not set(owned) & set(CORE_FIELDS)
    assert ppo_config.PLAIN_PPO == {k: v for f in registry.ordered() for k, v in
                                    f.switches.items()}
    for name, value in ppo_config.PLAIN_PPO.items():  # a switch's off value is the default
        assert getattr(PPOConfig(), name) == value, name


def test_the_loop_never_names_a_feature():
    """trainer.py builds hooks from the registry alone: no feature class, switch or table name."""
    src = (REPO / "pipeline/ppo/trainer.py").read_text()
    for f in FEATURES.values():
        for key in f.switches:
            if f.build is not None:  # loop features (schedules, critic) are the loop's math
                assert not re.search(rf"\bcfg\.{key}\b", src), key
        for t in f.tables:
            assert f'"{t.name}"' not in src, t.name
    for cls in ("EntropyStop", "Resample", "PromptScheduler", "Escalation", "HumanQueue",
                "RouteBudget", "RMEvolution"):
        assert cls not in src


def test_the_cli_offers_one_option_per_input_and_table():
    from typer.testing import CliRunner

    from rlhf.cli.app import app

    out = CliRunner().invoke(app, ["ppo", "--help"], env={"COLUMNS": "200"}).output
    for inp in registry.INPUTS.values():
        assert inp.from_params or inp.option in out
    for t in registry.tables().values():
        assert t.option in out


def test_order_follows_after_and_a_missing_input_names_its_option():
    names = [f.name for f in registry.ordered()]
    for f in FEATURES.values():
        for a in f.after:
            assert names.index(a) < names.index(f.name)
    cfg = PPOConfig(schedule_on=True)
    with pytest.raises(ValueError, match=r"ppo.schedule_on needs .*rlhf ppo --embeddings"):
        build_hooks(cfg, FeatureContext(cfg))


def test_each_features_code_is_its_own_module_and_paths_that_exist():
    """`Feature.modules` (the code an arm runs only with the feature on: the benchmark's deps):
    the module defining `build` is derived, never typed; every path a feature names exists, so a
    rename that leaves one behind fails here naming the feature."""
    for f in FEATURES.values():
        for m in f.modules:
            assert (REPO / m).exists(), f"feature {f.name} names {m}, which does not exist"
        if f.build is not None:
            own = Path(inspect.getsourcefile(f.build)).resolve()
            assert (REPO / f.modules[0]).resolve() == own, (f.name, f.modules)
    toy = Feature("toy", {"toy_on": False}, build=lambda cfg, ctx: [],
                  fields=(ConfigField("toy_on", bool, False),))
    assert toy.modules == ()  # a test module's feature is no repository code


def test_benchmark_reads_derive_from_the_registry():
    from bench.economy import arms as economy

    assert economy.reads(economy.ARMS["plain"], "pool_embeddings") is False
    arm = economy.Arm(base="plain", overrides={"schedule_on": True})
    assert economy.reads(arm, "pool_embeddings") and not economy.reads(arm, "rm_strong")
    assert economy.reads(economy.Arm(overrides={"rm_evolve_on": True}), "rm_strong")
