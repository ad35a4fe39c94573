"""A hub name where a stage takes "any HF name or local path" (`sft.base_model` and every
stage's policy option, `rlhf ppo --policy`, `rlhf preferences --policy`, `rlhf reward --sft`,
`rlhf difficulty --policy`, `rlhf eval --sft`: pipeline/models/model_folders.py
`policy_folder`): resolved offline to its snapshot in the Hugging Face cache, here a temporary
cache in the hub's layout (`models--org--name/snapshots/<commit>/` + `refs/main`) that the test
fills with a tiny model it saves; a name the cache lacks is one error line naming the cache.

    python -m pytest -q tests/test_hub_names.py
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import ppo_tiny
import pytest
from params_file import write_params
from rlhf.cli.app import app
from typer.testing import CliRunner

NAME, COMMIT = "tiny-org/tiny-policy", "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> dict[str, Path]:
    """The ppo_tiny world, its policy also in a hub cache as NAME."""
    root = tmp_path_factory.mktemp("hub")
    world = ppo_tiny.build_world(root / "world")
    cache = root / "cache"
    repo = cache / ("models--" + NAME.replace("/", "--"))
    shutil.copytree(world["policy"], repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)  # what the hub client writes: no newline
    return {**world, "cache": cache, "snapshot": repo / "snapshots" / COMMIT}


def test_a_hub_name_is_its_snapshot_and_a_missing_one_names_the_cache(hub, monkeypatch):
    from rlhf.pipeline.models.model_folders import ModelFolderError, policy_folder

    monkeypatch.setenv("HF_HUB_CACHE", str(hub["cache"]))
    assert policy_folder(NAME, "--policy") == hub["snapshot"]
    assert policy_folder(hub["policy"], "--policy") == hub["policy"]  # a folder: itself
    with pytest.raises(ModelFolderError) as err:
        policy_folder("tiny-org/absent", "--policy")
    message = str(err.value)
    assert message.startswith("--policy tiny-org/absent: no such folder, and the Hugging Face "
                              f"cache {hub['cache']} has no snapshot of the hub model")
    assert "HF_HUB_OFFLINE" in message and "\n" not in message


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_rlhf_ppo_and_sft_take_a_hub_name(hub, tmp_path):
    env = {"COLUMNS": "400", "HF_HUB_CACHE": str(hub["cache"])}
    ppo = ppo_tiny.write_params(tmp_path / "ppo.yaml", total_steps=1, checkpoint_every=1)
    res = CliRunner().invoke(app, [
        "ppo", "--policy", NAME, "--reward", str(hub["reward"]), "--prompts",
        str(hub["prompts"]), "--out", str(tmp_path / "run"), "--rollouts",
        str(tmp_path / "rollouts"), "--params", str(ppo)], env=env)
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 1
    # sft.base_model (the realdata profile's model) by the same name
    demos = tmp_path / "demos.jsonl"
    demos.write_text("".join(json.dumps({"prompt": p, "response": "the cat is good"}) + "\n"
                             for p in ppo_tiny.PROMPTS))
    params = write_params(tmp_path / "sft.yaml", judge={}, sft={
        "base_model": NAME, "epochs": 1.0, "batch_size": 6, "max_length": 32,
        "heldout_fraction": 0.2, "eval_prompts": 1, "eval_max_new_tokens": 2})
    res = CliRunner().invoke(app, ["sft", "--demos", str(demos), "--out", str(tmp_path / "sft"),
                                   "--params", str(params)], env=env)
    assert res.exit_code == 0, res.output
    assert (tmp_path / "sft" / "model.safetensors").is_file()
    # not in the cache: one error line naming it, before anything loads or is written
    res = CliRunner().invoke(app, [
        "ppo", "--policy", "tiny-org/absent", "--reward", str(hub["reward"]), "--prompts",
        str(hub["prompts"]), "--out", str(tmp_path / "absent"), "--rollouts",
        str(tmp_path / "r2"), "--params", str(ppo)], env=env)
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert res.exit_code == 2 and len(errors) == 1, res.output
    assert str(hub["cache"]) in errors[0] and not (tmp_path / "absent").exists()


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_preferences_reward_difficulty_and_eval_take_a_hub_name(hub, tmp_path):
    """The stages after sft take the SFT policy by hub name too (cli/common.py `need_model`
    "hub_policy", model_folders.policy_folder): the tiny world's stages, chained on NAME."""
    env = {"COLUMNS": "400", "HF_HUB_CACHE": str(hub["cache"])}
    demos = tmp_path / "demos.jsonl"
    demos.write_text("".join(json.dumps({"prompt": p, "response": "the cat is good"}) + "\n"
                             for p in ppo_tiny.PROMPTS))
    params = write_params(
        tmp_path / "params.yaml", judge={}, ppo=dict(ppo_tiny.PARAMS),
        preferences={"k": 3, "max_new_tokens": 4, "heldout_fraction": 0.5,
                     "annotators": {"n_annotators": 2}},
        reward={"n_ensemble": 1, "train": {"epochs": 1.0, "max_length": 32},
                "light": {"epochs": 1}, "rollout_prompts": 4, "rollout_k": 2, "onpolicy_k": 2,
                "eval_prompts": 4, "max_new_tokens": 4, "external_sources": []},
        difficulty={"max_new_tokens": 4, "sampler_batch_size": 4},
        eval={"max_new_tokens": 4, "max_prompt_tokens": 16, "n_prompts": 4, "batch_size": 4})
    prefs, strong, light = tmp_path / "prefs", tmp_path / "rm_strong", tmp_path / "rm_light"
    (tmp_path / "ppo" / "checkpoints").mkdir(parents=True)  # no checkpoint: the SFT policy
    commands = {
        "preferences": ["--policy", NAME, "--demos", demos, "--out", prefs],
        "reward": ["--preferences", prefs, "--sft", NAME, "--out-strong", strong,
                   "--out-light", light, "--demos", demos],
        "difficulty": ["--policy", NAME, "--reward-model", strong, "--out",
                       tmp_path / "difficulty", "--demos", demos],
        "eval": ["--sft", NAME, "--ppo", tmp_path / "ppo", "--light-rm", light, "--strong-rm",
                 strong, "--prompts", hub["prompts"], "--out", tmp_path / "eval"]}
    for command, args in commands.items():
        res = CliRunner().invoke(app, [command, *map(str, args), "--params", str(params)],
                                 env=env)
        assert res.exit_code == 0, (command, res.output)
    assert (tmp_path / "eval" / "curves.csv").is_file()
    # a name the cache lacks: one error line naming the cache, at each of them
    for command, args in commands.items():
        absent = [("tiny-org/absent" if a == NAME else a) for a in args]
        res = CliRunner().invoke(app, [command, *map(str, absent), "--params", str(params)],
                                 env=env)
        errors = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
        assert res.exit_code == 2 and len(errors) == 1, (command, res.output)
        assert str(hub["cache"]) in errors[0] and "tiny-org/absent" in errors[0], errors
