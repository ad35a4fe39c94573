"""PPOConfig loads from params.yaml and refuses bad sampling settings (seed 001 §5.1)."""

from __future__ import annotations

import dataclasses

import pytest

from rlhf.pipeline.config import ConfigError, build, load_section
from rlhf.pipeline.ppo.config import (PLAIN_PPO, PPOConfig,
                                      check_gradient_accumulation, features_on, plain)


def test_params_yaml_ppo_section_loads(repo):
    cfg = load_section(repo / "params.yaml", "ppo")
    assert isinstance(cfg, PPOConfig)
    assert cfg.lambda_eps_table == ((0, 0.92, 0.10), (1000, 0.95, 0.15), (5000, 0.98, 0.08))


def test_defaults_are_plain_ppo(repo):
    cfg = PPOConfig()
    switches = [f.name for f in dataclasses.fields(cfg)
                if f.name.endswith("_on") and f.name != "gradnorm_diagnostics_on"]
    assert switches and not any(getattr(cfg, s) for s in switches)
    assert set(switches) <= set(PLAIN_PPO)  # every switch is listed with its plain value
    assert cfg.critic == "full" and cfg.escalate_below == 0.0 and cfg.debug_rollouts is False
    assert features_on(cfg) == {} and plain(cfg) == cfg
    seed = load_section(repo / "params.yaml", "ppo")
    assert features_on(plain(seed)) == {}
    on = features_on(seed)
    assert on and all(getattr(plain(seed), k) == PLAIN_PPO[k] for k in on)
    # plain() changes the switches only: budget and sampling stay the run's
    assert (plain(seed).total_steps, plain(seed).temperature) == (seed.total_steps, seed.temperature)


@pytest.mark.parametrize("data, needle", [
    ({"temperature": 0.3}, "ppo.temperature = 0.3: allowed > 0.3"),
    ({"temperature": 0.1}, "seed 001 §5.1"),
    ({"top_p": 0.96}, "ppo.top_p = 0.96: allowed in (0, 0.95]"),
    ({"top_p": 1.0}, "top_p"),
    ({"batch_size": 6, "mini_batch_size": 4}, "multiple of ppo.mini_batch_size"),
    ({"lambda_eps_table": [[5, 0.9, 0.1]]}, "start at step 0"),
    ({"kl_estimator": "k5"}, "kl_estimator"),
    ({"critic": "huge"}, "critic"),
])
def test_bad_settings_are_clear_config_errors(data, needle):
    with pytest.raises(ConfigError) as exc:
        build(PPOConfig, data, "ppo")
    msg = str(exc.value)  # a range's error names `ppo.key`, a rule's the section
    assert needle in msg and ("[ppo]" in msg or msg.startswith("ppo."))


def test_sampling_limits_are_inclusive_where_the_issue_says():
    assert build(PPOConfig, {"temperature": 0.31, "top_p": 0.95}, "ppo").top_p == 0.95


def test_accumulation_helper():
    check_gradient_accumulation(8, 8)
    check_gradient_accumulation(4, 2)
    with pytest.raises(ConfigError, match="5.5"):
        check_gradient_accumulation(3, 2)


def test_deepspeed_config_follows_seed_000(repo):
    import json

    ds = json.loads((repo / "configs" / "deepspeed_zero3.json").read_text())
    zero = ds["zero_optimization"]
    assert zero["stage"] == 3
    assert zero["offload_optimizer"]["device"] == "cpu"
    assert zero["offload_param"]["device"] == "none"
    assert ds["communication_data_type"] == "fp16"
    assert zero["stage3_gather_16bit_weights_on_model_save"] is False


def test_config_and_schedules_import_without_torch():
    import subprocess
    import sys

    code = ("import sys, rlhf.pipeline.ppo.config, rlhf.pipeline.ppo.diagnostics; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_extension_builds_remove_only_a_stale_lock(tmp_path, monkeypatch):
    """A JIT build of DeepSpeed's cpu_adam killed mid-way leaves `lock` behind, and torch waits
    on it without end: CI once hung 600 s per ZeRO-3 test on one. A lock older than the limit
    goes (with a warning); a fresh one (a build running now) stays."""
    import os
    import time

    from rlhf.pipeline.ppo.sharding import extension_builds

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    stale, fresh = tmp_path / "cpu_adam" / "lock", tmp_path / "shm_comm" / "lock"
    for lock in (stale, fresh):
        lock.parent.mkdir()
        lock.touch()
    hour_ago = time.time() - 3600
    os.utime(stale, (hour_ago, hour_ago))
    with pytest.warns(UserWarning, match="stale build lock"):
        assert extension_builds(stale_after_s=900) == tmp_path
    assert not stale.exists() and fresh.exists()


def test_extension_builds_default_to_the_environment(monkeypatch):
    import os
    import sys
    from pathlib import Path

    from rlhf.pipeline.ppo.sharding import extension_builds

    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    root = extension_builds()
    if os.access(sys.prefix, os.W_OK):  # the venv: its own builds, not ~/.cache's
        assert root == Path(sys.prefix) / "torch_extensions"
        assert os.environ["TORCH_EXTENSIONS_DIR"] == str(root)
