"""`engine: auto` (pipeline/decode/engines.py resolve_engine): a pure function of the device
string, native on a CPU and hf on CUDA (no GPU needed to ask); every params section that has an
`engine` key, in params.yaml and the realdata profile, accepts it; an unknown engine or device is
a one-line error; the PPO config resolves to the engine it records, and drafts on an engine that
is not native are refused when `auto` resolves."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rlhf.pipeline.config import ConfigError, build, config_class, read_params
from rlhf.pipeline.decode import ENGINES, get_generator, resolve_engine
from rlhf.pipeline.ppo.config import PPOConfig
from rlhf.pipeline.ppo.generate import engine_resolved

ROOT = Path(__file__).resolve().parents[1]
PARAMS = [ROOT / "params.yaml", ROOT / "profiles" / "realdata" / "params.yaml"]


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")])
def test_auto_is_native_on_a_cpu(device):
    assert resolve_engine("auto", device) == "native"


@pytest.mark.parametrize("device", ["cuda", "cuda:1", torch.device("cuda", 0)])
def test_auto_is_hf_on_cuda_until_static_is_measured_there(device):
    assert resolve_engine("auto", device) == "hf"


def test_auto_is_hf_on_a_device_kind_nobody_measured():
    assert resolve_engine("auto", "meta") == "hf"


@pytest.mark.parametrize("name", ENGINES)
def test_a_named_engine_is_itself_on_every_device(name):
    assert resolve_engine(name, "cpu") == resolve_engine(name, "cuda") == name


@pytest.mark.parametrize(("name", "device", "says"), [
    ("nope", "cpu", "unknown engine 'nope'; engines: auto, hf, native, static, vllm"),
    ("auto", "toaster", "engine 'auto': not a torch device: 'toaster'"),
])
def test_unknown_engine_or_device_is_a_one_line_error(name, device, says):
    with pytest.raises(ConfigError) as exc:
        resolve_engine(name, device)
    assert str(exc.value) == says and "\n" not in str(exc.value)


def test_get_generator_wants_auto_resolved_first():
    with pytest.raises(ConfigError, match=r"resolve_engine\('auto', device\) first"):
        get_generator("auto")


def engine_sections(path: Path) -> list[str]:
    return [name for name, section in read_params(path).items()
            if isinstance(section, dict) and "engine" in section]


@pytest.mark.parametrize("path", PARAMS, ids=lambda p: p.parent.name)
def test_every_section_with_an_engine_accepts_auto(path):
    sections = engine_sections(path)
    assert {"preferences", "reward", "difficulty", "ppo", "eval"} <= set(sections)
    for name in sections:
        data = {**read_params(path)[name], "engine": "auto"}
        assert build(config_class(name), data, name, complete=True).engine == "auto"
        with pytest.raises(ConfigError, match=f"\\[{name}\\] key 'engine' must be"):
            build(config_class(name), {**data, "engine": "turbo"}, name, complete=True)


def test_ppo_config_resolves_to_the_engine_it_records():
    auto = PPOConfig(engine="auto")
    assert engine_resolved(auto, "cpu") == PPOConfig(engine="native")
    assert engine_resolved(auto, "cuda:0").engine == "hf"
    native = PPOConfig(engine="native")
    assert engine_resolved(native, "cuda") is native  # a named engine: the config untouched
    assert engine_resolved(PPOConfig(engine="auto", draft="lookup"), "cpu").engine == "native"
    with pytest.raises(ConfigError, match="ppo.engine: auto is 'hf' on cuda"):
        engine_resolved(PPOConfig(engine="auto", draft="lookup"), "cuda")
