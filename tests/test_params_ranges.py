"""Every numeric parameter of every config section declares its range, and the values the range
excludes (below it, above it, NaN, +-inf, a wrong type) are one-line errors naming the key."""

import dataclasses
import math
import typing
from pathlib import Path

import pytest
import yaml
from rlhf.cli.app import app
from rlhf.pipeline import ranges
from rlhf.pipeline.config import SECTIONS, ConfigError, build, config_class, load_all
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
PARAMS_FILES = [ROOT / "params.yaml", *sorted((ROOT / "profiles").glob("*/params.yaml"))]


def _numeric(tp) -> bool:
    """Whether a field's type holds numbers (itself, a mapping's values or a tuple's items)."""
    if tp in (int, float):
        return True
    origin = typing.get_origin(tp)
    if origin is dict:
        return _numeric(typing.get_args(tp)[1])
    if origin in (tuple, list):
        return any(_numeric(a) for a in typing.get_args(tp) if a is not Ellipsis)
    if origin in (typing.Union, type(int | None)):
        return any(_numeric(a) for a in typing.get_args(tp) if a is not type(None))
    return False


def _holds_int(tp, spec) -> bool:
    """Whether the numbers of a field may be ints (a table's rows mix int and float columns)."""
    if isinstance(spec, tuple):
        return True
    return tp is int or int in typing.get_args(tp)


def _fields():
    """(dotted key, owning dataclass, field name, type) for every leaf field of every section."""
    out = []

    def walk(cls, where):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            if dataclasses.is_dataclass(tp):
                walk(tp, f"{where}.{f.name}")
            else:
                out.append((f"{where}.{f.name}", cls, f.name, tp))

    for section in SECTIONS:
        walk(config_class(section), section)
    return out


NUMERIC = [f for f in _fields() if _numeric(f[3])]


def _shaped(value, cls, name, tp):
    """`value` put where field `name` holds its numbers: in a mapping's value, a tuple's item
    or a table row's column (every column of the row at its default but one)."""
    origin = typing.get_origin(tp)
    if origin is dict:
        default = getattr(cls(), name)
        return {next(iter(default), "k"): value}
    if origin is tuple:
        args = typing.get_args(tp)
        if typing.get_origin(args[0]) is tuple:  # a table: rows of columns
            return None
        return (value,)
    return value


def test_numeric_fields_found():
    # the walk sees the sections, their nested sections and PPOConfig (a guard on the walk)
    keys = {k for k, *_ in NUMERIC}
    assert {"world.model.hidden_size", "reward.train.learning_rate", "ppo.kl_coef",
            "preferences.annotators.noise_std", "eval.checkpoints"} <= keys
    assert len(NUMERIC) > 200


@pytest.mark.parametrize("key,cls,name,tp", NUMERIC, ids=[k for k, *_ in NUMERIC])
def test_every_numeric_field_declares_a_range(key, cls, name, tp):
    assert name in ranges.of(cls), (
        f"{key} ({cls.__name__}.{name}) has no range in pipeline/ranges.py RANGES (or, a "
        f"feature's key, in its ConfigField)")


@pytest.mark.parametrize("key,cls,name,tp", NUMERIC, ids=[k for k, *_ in NUMERIC])
def test_default_is_inside_its_range(key, cls, name, tp):
    spec = ranges.of(cls)[name]
    assert ranges.check(key.rpartition(".")[0], name, getattr(cls(), name), spec) is None


@pytest.mark.parametrize("key,cls,name,tp", NUMERIC, ids=[k for k, *_ in NUMERIC])
def test_excluded_values_are_one_line_errors(key, cls, name, tp):
    where = key.rpartition(".")[0]
    spec = ranges.of(cls)[name]
    if isinstance(spec, tuple):  # a table: try each column of the default's first row
        rows = getattr(cls(), name)
        cases = []
        for column, rng in enumerate(spec):
            for bad in rng.excluded():
                row = list(rows[0])
                row[column] = bad
                cases.append(([row], bad))
    else:
        cases = [(_shaped(bad, cls, name, tp), bad) for bad in spec.excluded()]
    assert cases
    for value, bad in cases:
        with pytest.raises(ConfigError) as info:
            build(cls, {name: value}, where)
        msg = str(info.value)
        assert "\n" not in msg
        if not math.isfinite(bad) and _holds_int(tp, spec):  # a float where an int belongs
            assert msg.startswith((f"[{where}] key '{name}' must be", key)), msg
            continue
        assert msg.startswith(key), msg
        assert "allowed" in msg and (str(bad) in msg or (math.isnan(bad) and "nan" in msg)), msg
    for wrong in ("3", True, None):
        shaped = _shaped(wrong, cls, name, tp)
        value = [[wrong] * len(spec)] if isinstance(spec, tuple) else shaped
        with pytest.raises(ConfigError, match=rf"\[{where}\] key '{name}' must be"):
            build(cls, {name: value}, where)


def test_range_strings():
    assert str(ranges.COUNT) == ">= 1"
    assert str(ranges.POS) == "> 0"
    assert str(ranges.PROB) == "in [0, 1]"
    assert str(ranges.FRACTION_LT1) == "in [0, 1)"
    assert not ranges.FINITE.allows(math.nan) and ranges.FINITE.allows(-1e9)


def test_shipped_params_files_are_inside_the_ranges():
    for path in PARAMS_FILES:
        assert load_all(path)


@pytest.mark.parametrize("section,key,value,expected", [
    ("reward", "confidence_gate", 1.5, "reward.confidence_gate = 1.5: allowed in [0, 1]"),
    ("ppo", "kl_coef", float("nan"), "ppo.kl_coef = nan: allowed >= 0"),
    ("sft", "batch_size", 0, "sft.batch_size = 0: allowed >= 1"),
    ("world", "model", {"hidden_size": -4}, "world.model.hidden_size = -4: allowed >= 1"),
    ("dedup", "split_fractions", {"reward": float("inf"), "ppo": 0.5, "eval": 0.2},
     "dedup.split_fractions.reward = inf: allowed in [0, 1]"),
])
def test_params_check_names_the_bad_value(tmp_path, section, key, value, expected):
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    if isinstance(value, dict) and isinstance(params[section][key], dict):
        params[section][key] = {**params[section][key], **value}
    else:
        params[section][key] = value
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    result = CliRunner().invoke(app, ["params", "check", "-p", str(path)])
    assert result.exit_code != 0
    assert result.output.strip().splitlines() == [f"error: {expected}"]
    assert "Traceback" not in result.output


SCALARS = [f for f in NUMERIC if f[3] in (int, float)]  # every config: none is left unchecked


@pytest.mark.parametrize("key,cls,name,tp", SCALARS, ids=[k for k, *_ in SCALARS])
def test_a_config_built_in_code_obeys_the_same_ranges(key, cls, name, tp):
    """`__post_init__` reads ranges.py (`check_fields`), so a config built in code rejects what
    the params check rejects, with the same line: each bound is written once."""
    spec = ranges.of(cls)[name]
    for bad in spec.excluded():
        with pytest.raises(ValueError) as info:
            dataclasses.replace(cls(), **{name: bad})
        msg = str(info.value)  # a nested block names itself only (lora.r)
        assert " = " in msg and key.endswith(msg.split(" = ")[0]) and "allowed" in msg, msg
