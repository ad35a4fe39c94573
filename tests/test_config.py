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


# --- what a stage command reads: load_config (every key from the file) --------------------------
def test_load_config_reads_every_key_from_the_file_never_a_default(repo, tmp_path):
    import yaml
    from rlhf.pipeline.config import complete_section, load_config

    shipped = yaml.safe_load((repo / "params.yaml").read_text())
    assert load_config(repo / "params.yaml", "reward").backbone == shipped["reward"]["backbone"]
    p = tmp_path / "params.yaml"
    with pytest.raises(ConfigError, match="params file not found"):
        load_config(p, "reward")
    p.write_text(yaml.safe_dump({"sft": shipped["sft"]}))
    with pytest.raises(ConfigError, match="no 'reward' section"):
        load_config(p, "reward")
    reward = {k: v for k, v in shipped["reward"].items() if k != "backbone"}
    p.write_text(yaml.safe_dump({"reward": reward}))
    with pytest.raises(ConfigError, match=r"\[reward\] missing required key\(s\): backbone"):
        load_config(p, "reward")
    nested = {**shipped["reward"], "train": {"epochs": 1}}
    p.write_text(yaml.safe_dump({"reward": nested}))
    with pytest.raises(ConfigError, match=r"\[reward.train\] missing required key"):
        load_config(p, "reward")
    # a completed section loads; its keys are the dataclass defaults plus the given ones
    p.write_text(yaml.safe_dump({"reward": complete_section("reward", {"n_ensemble": 2})}))
    assert load_config(p, "reward").n_ensemble == 2


def test_load_config_fields_reads_and_returns_only_those_keys(repo, tmp_path):
    import yaml
    from rlhf.pipeline.config import load_config

    sampling = load_config(repo / "params.yaml", "ppo", ("temperature", "top_p"))
    assert vars(sampling) == {"temperature": 0.8, "top_p": 0.95}
    with pytest.raises(AttributeError):
        sampling.kl_coef  # noqa: B018  (not read, so not there)
    p = tmp_path / "params.yaml"
    p.write_text(yaml.safe_dump({"ppo": {"temperature": 0.8}}))
    with pytest.raises(ConfigError, match=r"\[ppo\] missing required key\(s\): top_p"):
        load_config(p, "ppo", ("temperature", "top_p"))
    p.write_text(yaml.safe_dump({"ppo": {"temperature": "hot", "top_p": 0.9}}))
    with pytest.raises(ConfigError, match="'temperature' must be float"):
        load_config(p, "ppo", ("temperature", "top_p"))


def test_a_command_with_an_incomplete_params_file_is_one_error(repo, tmp_path):
    import yaml
    from rlhf.cli.app import app
    from typer.testing import CliRunner

    p = tmp_path / "params.yaml"
    sft = yaml.safe_load((repo / "params.yaml").read_text())["sft"]
    del sft["lora_r"]
    p.write_text(yaml.safe_dump({"sft": sft}))
    for args in (["sft", "--demos", "d.jsonl", "--out", "o", "--params", str(p)],
                 ["params", "check", "--params", str(p)]):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
        assert "missing required key(s): lora_r" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(app, ["sft", "--demos", "d.jsonl", "--out", "o",
                                   "--params", str(tmp_path / "none.yaml")])
    assert res.exit_code == 2 and "params file not found" in res.output
