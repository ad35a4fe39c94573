from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from rlhf.pipeline.config import SECTIONS, ConfigError, build, load_all, load_section, read_params


@dataclass(frozen=True)
class _Inner:
    size: int = 4


@dataclass(frozen=True)
class _Cfg:
    seed: int = 0
    rate: float = 0.5
    name: str = "x"
    tags: list[str] = field(default_factory=list)
    inner: _Inner = field(default_factory=_Inner)
    maybe: int | None = None

    def __post_init__(self):
        if self.rate < 0:
            raise ValueError("rate must be >= 0")


def test_build_types_and_defaults():
    cfg = build(_Cfg, {"seed": 3, "rate": 1, "tags": ["a"], "inner": {"size": 8}}, "demo")
    assert cfg == _Cfg(seed=3, rate=1.0, tags=["a"], inner=_Inner(8))
    assert isinstance(cfg.rate, float)


@pytest.mark.parametrize("data, needle", [
    ({"sed": 3}, "[demo] unknown key(s) 'sed'"),
    ({"seed": "3"}, "[demo] key 'seed' must be int"),
    ({"seed": True}, "[demo] key 'seed' must be int"),
    ({"tags": [1]}, "[demo] key 'tags'"),
    ({"inner": {"sise": 1}}, "[demo.inner] unknown key(s) 'sise'"),
    ({"rate": -1.0}, "[demo] rate must be >= 0"),
])
def test_build_names_bad_key_and_section(data, needle):
    with pytest.raises(ConfigError) as info:
        build(_Cfg, data, "demo")
    assert needle in str(info.value)


def test_real_params_yaml_loads(repo):
    params = read_params(repo / "params.yaml")
    configs = load_all(repo / "params.yaml")
    assert set(configs) == set(params)
    assert set(params) <= set(SECTIONS)


def test_bad_key_in_a_params_file_is_named(repo, tmp_path):
    params = read_params(repo / "params.yaml")
    for section in params:
        bad = tmp_path / "params.yaml"
        text = (repo / "params.yaml").read_text()
        bad.write_text(text + f"\n{section}_typo_section: {{}}\n")
        with pytest.raises(ConfigError, match=f"unknown params section '{section}_typo_section'"):
            load_all(bad)
        bad.write_text(text.replace(f"{section}:\n", f"{section}:\n  no_such_key: 1\n", 1))
        with pytest.raises(ConfigError, match=rf"\[{section}\] unknown key\(s\) 'no_such_key'"):
            load_section(bad, section)


def test_missing_and_invalid_params_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        read_params(tmp_path / "nope.yaml")
    (tmp_path / "p.yaml").write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        read_params(tmp_path / "p.yaml")
