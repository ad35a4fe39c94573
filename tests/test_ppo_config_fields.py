"""A feature owns its `ppo:` keys: it declares them next to its code (`ConfigField`: type,
default, range, help) and PPOConfig, the params check, the ranges and the config reference
all read that one declaration. A toy feature added from this module alone (no edit to
pipeline/ppo/config.py, pipeline/ranges.py or docs/generate.py) gets its key parsed from a
params file, range-checked and documented; the code's defaults equal params.yaml's but for the
deliberate exceptions listed here with their reasons."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import pytest
import yaml
from rlhf.pipeline import ranges
from rlhf.pipeline.config import ConfigError, build, load_section
from rlhf.pipeline.ppo.config import CORE_FIELDS, PPOConfig
from rlhf.pipeline.ppo.features import FEATURES, ConfigField, Feature, register, unregister
from rlhf.pipeline.ranges import COUNT, Range


@pytest.fixture
def toy_feature():
    feature = register(Feature(
        "toy_budget", ("toy_on",), help="a toy feature with a parameter of its own",
        fields=(ConfigField("toy_on", bool, False, "the toy's switch"),
                ConfigField("toy_tokens", int, 12, "the toy's token budget (a count)",
                            range=Range(4, why="the toy needs four tokens"))),
        check=lambda cfg: None))
    yield feature
    unregister(feature.name)


def test_a_toy_features_key_is_parsed_range_checked_and_documented(tmp_path, repo, toy_feature):
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["ppo"] = {**params["ppo"], "toy_on": True, "toy_tokens": 40}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    cfg = load_section(path, "ppo")  # the flat ppo: section, like any other key
    assert (cfg.toy_on, cfg.toy_tokens, PPOConfig().toy_tokens) == (True, 40, 12)
    assert ranges.of(PPOConfig)["toy_tokens"] == Range(4, why="the toy needs four tokens")
    for bad in (3, 0):  # the declared range, one line naming the key, the bound and its reason
        with pytest.raises(ConfigError) as info:
            build(PPOConfig, {"toy_tokens": bad}, "ppo")
        assert "\n" not in str(info.value)
        assert f"ppo.toy_tokens = {bad}: allowed >= 4 (the toy needs four tokens)" in str(
            info.value)
    with pytest.raises(ConfigError, match="ppo.toy_tokens must be int"):
        build(PPOConfig, {"toy_tokens": "many"}, "ppo")
    sys.path.insert(0, str(repo / "docs"))
    import generate

    page = generate.config_page(repo)
    assert "| `toy_tokens` | `int` | 12 | – | >= 4 | the toy's token budget (a count) |" in page


def test_a_feature_registered_before_ppoconfig_is_built_adds_a_real_field(repo):
    """The path of the next real feature: its module registers it (features/__init__.py imports
    it) before PPOConfig is first used, and its keys are dataclass fields, after the others'."""
    code = textwrap.dedent("""
        import dataclasses
        from rlhf.pipeline.ppo.features import ConfigField, Feature, register
        from rlhf.pipeline.ranges import COUNT
        register(Feature("toy", ("toy_on",), fields=(
            ConfigField("toy_on", bool, False, "the switch"),
            ConfigField("toy_k", int, 3, "a count", range=COUNT))))
        from rlhf.pipeline.config import ConfigError, build
        from rlhf.pipeline.ppo.config import PPOConfig, features_on
        names = [f.name for f in dataclasses.fields(PPOConfig)]
        assert names[-3:] == ["toy_on", "toy_k", "extra"], names[-3:]
        cfg = build(PPOConfig, {"toy_on": True, "toy_k": 5}, "ppo")
        assert dataclasses.asdict(cfg)["toy_k"] == 5 and features_on(cfg) == {"toy_on": True}
        try:
            PPOConfig(toy_k=0)
        except ConfigError as exc:
            assert str(exc) == "ppo.toy_k = 0: allowed >= 1", exc
        else:
            raise AssertionError("toy_k = 0 passed")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, cwd=repo)
    assert out.returncode == 0, out.stderr[-2000:]


def test_every_bound_is_written_once():
    declared = {c.name: c for f in FEATURES.values() for c in f.fields}
    assert not set(declared) & set(ranges.RANGES["PPOConfig"])  # a feature's range: its own
    assert set(ranges.RANGES["PPOConfig"]) <= set(CORE_FIELDS)
    table = ranges.of(PPOConfig)
    for name, c in declared.items():
        if c.range is not None:
            assert table[name] is c.range, name
    # the four bounds config.py and ranges.py used to disagree on: the stricter one, once
    assert str(table["temperature"]) == "> 0.3" and "seed 001 §5.1" in table["temperature"].why
    assert (table["schedule_window"].lo, table["rm_check_samples"].lo,
            table["prune_top_k"].lo) == (2, 4, 2)
    with pytest.raises(ConfigError, match=r"^ppo.schedule_window = 1: allowed >= 2 \(a variance"):
        PPOConfig(schedule_window=1)


def test_a_switch_must_declare_its_key_and_default_to_plain_ppo():
    with pytest.raises(ValueError, match="declare no ConfigField"):
        register(Feature("bare", {"bare_on": False}))
    with pytest.raises(ValueError, match="must default to their plain-PPO value"):
        register(Feature("on_by_default", {"obd_on": False},
                         fields=(ConfigField("obd_on", bool, True),)))
    assert "bare" not in FEATURES and "on_by_default" not in FEATURES


# PPOConfig's built-in defaults that differ from params.yaml's ppo section, each on purpose: the
# stages read every key from params.yaml (config.load_config), so these defaults reach only
# library calls and the tests' params files (config.complete_section writes them)
DELIBERATE = {
    # a switch defaults to plain PPO (test_ppo_config: the baseline every claim is a ratio
    # against); params.yaml turns the native decode loop on
    "engine": "a switch: plain PPO's hf; params.yaml runs native",
    # `rlhf ppo` on its own reports held-out gold; in the pipeline the eval stage does
    "heldout_eval": "off in the pipeline, where the eval stage computes the same figures",
    # the seeds' numbers; params.yaml scales them to the CPU run
    "kl_warmup_steps": "seed 001 §5.1's 100 steps, for runs of thousands of steps",
    "critic_hidden_size": "seed 000 §3.2's 1024 (the GPU value)",
    "critic_layers": "seed 000 §3.2's 3-layer encoder; params.yaml's 0 is trunk/shared's quarter",
    # the size of the quick runs the tests and library calls build from the defaults
    "total_steps": "test scale", "batch_size": "test scale", "mini_batch_size": "test scale",
    "max_new_tokens": "test scale", "checkpoint_every": "test scale",
    "learning_rate": "test scale: params.yaml's 3e-5 is tuned against over-optimising the RM "
                     "over 60 steps (docs/ppo.md)",
}


def test_code_defaults_equal_params_yaml_but_the_deliberate_ones(repo):
    shipped = yaml.safe_load((repo / "params.yaml").read_text())["ppo"]
    default = PPOConfig()
    differ = {k for k, v in shipped.items()
              if getattr(default, k) != _value(getattr(default, k), v)}
    assert differ == set(DELIBERATE)
    assert set(shipped) == {f.name for f in dataclasses.fields(PPOConfig)} - {"extra"}


def _value(default, v):
    """The shipped YAML value `v` as the config holds it (a nested block as its dataclass)."""
    return type(default)(**v) if dataclasses.is_dataclass(default) else _tuples(v)


def _tuples(v):
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v
