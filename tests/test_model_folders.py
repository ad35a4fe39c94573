"""A policy or reward-model folder that is missing, truncated or of the wrong kind: one clear
error naming the path at every stage that loads one, never a traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from params_file import write_params
from rlhf.cli.app import app
from rlhf.pipeline.models.model_folders import (
    ModelFolderError,
    check_policy,
    check_ppo_run,
    check_scorer,
)
from typer.testing import CliRunner


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """A tiny causal-LM policy, a reward-stage scorer folder of one member, a PPO run folder."""
    import torch
    from rlhf.pipeline.reward.scorer import save_scorer
    from tiny_world import write_tokenizer
    from transformers import (
        AutoTokenizer,
        LlamaConfig,
        LlamaForCausalLM,
        LlamaForSequenceClassification,
    )

    root = tmp_path_factory.mktemp("models")
    tok = AutoTokenizer.from_pretrained(write_tokenizer(root / "tokenizer"))
    cfg = {"vocab_size": len(tok), "hidden_size": 16, "intermediate_size": 32,
           "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
           "pad_token_id": 0}
    torch.manual_seed(0)
    policy = LlamaForCausalLM(LlamaConfig(**cfg))
    policy.save_pretrained(root / "policy")
    tok.save_pretrained(root / "policy")
    LlamaConfig(**cfg).save_pretrained(root / "model_config")
    member = LlamaForSequenceClassification(LlamaConfig(**cfg, num_labels=1))
    member.save_pretrained(root / "rm" / "member_0")
    tok.save_pretrained(root / "rm" / "member_0")
    save_scorer(root / "rm", ["member_0"], [0.0], 1.0, "mean", 64)
    step = root / "run" / "checkpoints" / "step-000002"
    step.mkdir(parents=True)
    torch.save(policy.state_dict(), step / "policy.pt")
    return {"root": root, "policy": root / "policy", "rm": root / "rm", "run": root / "run",
            "tokenizer": root / "tokenizer", "model_config": root / "model_config"}


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


# --- the checks, one defect at a time ------------------------------------------------------

def test_good_folders_pass(models):
    check_policy(models["policy"])
    check_scorer(models["rm"])
    check_scorer(models["rm"] / "member_0", plain_allowed=True)  # a plain HF reward model
    assert [p.name for p in check_ppo_run(models["run"])] == ["step-000002"]


@pytest.mark.parametrize("defect, needle", [
    ("missing", "does not exist"),
    ("a_file", "is a file, not a model folder"),
    ("no_config", "no config.json"),
    ("truncated_config", "not readable JSON"),
    ("truncated_weights", "truncated or damaged"),
    ("header_only_weights", "truncated or damaged"),
    ("no_weights", "no weights"),
    ("no_tokenizer", "no tokenizer"),
    ("truncated_tokenizer", "not readable JSON"),
    ("reward_model", "is a reward-model folder"),
    ("sequence_classifier", "not a causal language model"),
    ("ppo_run", "is a PPO run folder"),
])
def test_bad_policy_folders_name_the_path(models, tmp_path, defect, needle):
    p = tmp_path / "p"
    if defect == "a_file":
        p.write_text("x")
    elif defect == "reward_model":
        p = models["rm"]
    elif defect == "sequence_classifier":
        p = models["rm"] / "member_0"
    elif defect == "ppo_run":
        p = models["run"]
    elif defect != "missing":
        _copy(models["policy"], p)
        if defect == "no_config":
            (p / "config.json").unlink()
        elif defect == "truncated_config":
            _truncate(p / "config.json")
        elif defect == "truncated_weights":
            _truncate(p / "model.safetensors")
        elif defect == "header_only_weights":
            _truncate(p / "model.safetensors", keep=0.01)
        elif defect == "no_weights":
            (p / "model.safetensors").unlink()
        elif defect == "no_tokenizer":
            for f in p.glob("tokenizer*"):
                f.unlink()
        elif defect == "truncated_tokenizer":
            _truncate(p / "tokenizer.json")
    with pytest.raises(ModelFolderError) as err:
        check_policy(p, "--policy")
    assert needle in str(err.value) and str(p) in str(err.value)
    assert str(err.value).startswith("--policy: ")


@pytest.mark.parametrize("defect, needle", [
    ("policy_folder", "no scorer.json"),
    ("truncated_scorer_json", "not readable JSON"),
    ("members_missing", "no list of members"),
    ("truncated_member", "truncated or damaged"),
    ("member_gone", "does not exist"),
    ("member_is_a_policy", "not a sequence classifier"),
])
def test_bad_reward_model_folders_name_the_path(models, tmp_path, defect, needle):
    if defect == "policy_folder":
        p = models["policy"]
    else:
        p = _copy(models["rm"], tmp_path / "rm")
        meta = json.loads((p / "scorer.json").read_text())
        if defect == "truncated_scorer_json":
            _truncate(p / "scorer.json")
        elif defect == "members_missing":
            (p / "scorer.json").write_text(json.dumps({**meta, "members": []}))
        elif defect == "truncated_member":
            _truncate(p / "member_0" / "model.safetensors")
        elif defect == "member_gone":
            shutil.rmtree(p / "member_0")
        elif defect == "member_is_a_policy":
            shutil.rmtree(p / "member_0")
            shutil.copytree(models["policy"], p / "member_0")
    with pytest.raises(ModelFolderError) as err:
        check_scorer(p, "--reward-model")
    assert needle in str(err.value) and str(p) in str(err.value)


def test_truncated_ppo_checkpoint_and_missing_checkpoints(models, tmp_path):
    run = _copy(models["run"], tmp_path / "run")
    _truncate(run / "checkpoints" / "step-000002" / "policy.pt")
    with pytest.raises(ModelFolderError, match="not a readable torch file"):
        check_ppo_run(run)
    with pytest.raises(ModelFolderError, match="no checkpoints/"):
        check_ppo_run(models["policy"])


def test_the_loaders_run_the_checks(models, tmp_path):
    """load_policy / load_ensemble (what preferences, reward, difficulty, eval and PPO call) give
    the same error, not safetensors' or transformers' traceback."""
    from rlhf.pipeline.models.policy import load_policy
    from rlhf.pipeline.reward.scorer import load_ensemble

    p = _copy(models["policy"], tmp_path / "p")
    _truncate(p / "model.safetensors")
    with pytest.raises(ModelFolderError, match="truncated"):
        load_policy(p)
    r = _copy(models["rm"], tmp_path / "r")
    _truncate(r / "member_0" / "model.safetensors")
    with pytest.raises(ModelFolderError, match="truncated"):
        load_ensemble(r)
    assert load_ensemble(models["rm"]).gate == 0.6  # a good one still loads


# --- every CLI command that loads a model ---------------------------------------------------

def _broken(models, tmp_path, kind: str) -> Path:
    if kind == "policy":
        p = _copy(models["policy"], tmp_path / "[bold]policy")  # markup in the path, too
        _truncate(p / "model.safetensors")
    elif kind == "rm":
        p = _copy(models["rm"], tmp_path / "rm")
        _truncate(p / "member_0" / "model.safetensors")
    elif kind == "run":
        p = _copy(models["run"], tmp_path / "run")
        _truncate(p / "checkpoints" / "step-000002" / "policy.pt")
    elif kind == "resume":  # a PPO run killed while its last checkpoint's optim.pt was copied
        import torch

        p = _copy(models["run"], tmp_path / "run")
        step = p / "checkpoints" / "step-000002"
        torch.save({"w": torch.zeros(3)}, step / "critic.pt")
        torch.save({"policy": {}, "critic": {}}, step / "optim.pt")
        _truncate(step / "optim.pt")
        (p / "checkpoints" / "latest").write_text("step-000002")
    elif kind == "tokenizer":
        p = _copy(models["tokenizer"], tmp_path / "tok")
        _truncate(p / "tokenizer.json")
    elif kind == "model_config":
        p = _copy(models["model_config"], tmp_path / "mc")
        _truncate(p / "config.json")
    else:
        p = tmp_path / "missing"
    return p


def _commands(models, tmp_path):
    m, o = models, tmp_path / "out"
    demos = tmp_path / "demos.jsonl"
    demos.write_text(json.dumps({"prompt": "hi", "response": "hello"}) + "\n")
    prefs = tmp_path / "prefs"
    prefs.mkdir(exist_ok=True)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt_id": "a", "text": "hi"}) + "\n")
    made: dict[str, str] = {}

    def b(kind: str) -> str:
        if kind not in made:
            (tmp_path / kind).mkdir()
            made[kind] = str(_broken(models, tmp_path / kind, kind))
        return made[kind]

    def ppo(*switches: str, **bad: str) -> list[str]:
        flags = {"--policy": str(m["policy"]), "--reward": str(m["rm"]), "--prompts":
                 str(prompts), "--out": str(o), "--rollouts": str(tmp_path / "rows"), **bad}
        return ["ppo", *[x for kv in flags.items() for x in kv], *switches]

    return {
        "ppo --policy": ppo(**{"--policy": b("policy")}),
        "ppo --policy (missing)": ppo(**{"--policy": b("missing")}),
        "ppo --policy (an RM)": ppo(**{"--policy": str(m["rm"])}),
        "ppo --policy (a PPO run)": ppo(**{"--policy": str(m["run"])}),
        "ppo --reward": ppo(**{"--reward": b("rm")}),
        "ppo --reward (a policy)": ppo(**{"--reward": str(m["policy"])}),
        "ppo --strong-reward (missing)": ppo(**{"--strong-reward": b("missing")}),
        "ppo --out (--resume, truncated optim.pt)": ppo("--resume", **{"--out": b("resume")}),
        "sft --tokenizer": ["sft", "--demos", str(demos), "--out", str(o),
                            "--tokenizer", b("tokenizer"), "--model-config", str(m["model_config"])],
        "sft --model-config": ["sft", "--demos", str(demos), "--out", str(o), "--tokenizer",
                               str(m["tokenizer"]), "--model-config", b("model_config")],
        "preferences --policy": ["preferences", "--policy", b("policy"), "--out", str(o),
                                 "--demos", str(demos)],
        "reward --sft": ["reward", "--preferences", str(prefs), "--sft", b("policy"),
                         "--out-strong", str(o / "s"), "--out-light", str(o / "l"),
                         "--demos", str(demos)],
        "reward --sft (an RM)": ["reward", "--preferences", str(prefs), "--sft", str(m["rm"]),
                                 "--out-strong", str(o / "s"), "--out-light", str(o / "l"),
                                 "--demos", str(demos)],
        "difficulty --policy": ["difficulty", "--policy", b("policy"), "--reward-model",
                                str(m["rm"]), "--out", str(o), "--demos", str(demos)],
        "difficulty --reward-model": ["difficulty", "--policy", str(m["policy"]),
                                      "--reward-model", b("rm"), "--out", str(o),
                                      "--demos", str(demos)],
        "difficulty --reward-model (a policy)": ["difficulty", "--policy", str(m["policy"]),
                                                 "--reward-model", str(m["policy"]), "--out",
                                                 str(o), "--demos", str(demos)],
        "eval --sft": ["eval", "--sft", b("policy"), "--ppo", str(m["run"]), "--light-rm",
                       str(m["rm"]), "--strong-rm", str(m["rm"]), "--prompts", str(prompts),
                       "--out", str(o)],
        "eval --ppo": ["eval", "--sft", str(m["policy"]), "--ppo", b("run"), "--light-rm",
                       str(m["rm"]), "--strong-rm", str(m["rm"]), "--prompts", str(prompts),
                       "--out", str(o)],
        "eval --light-rm": ["eval", "--sft", str(m["policy"]), "--ppo", str(m["run"]),
                            "--light-rm", b("rm"), "--strong-rm", str(m["rm"]),
                            "--prompts", str(prompts), "--out", str(o)],
        "eval --strong-rm (missing)": ["eval", "--sft", str(m["policy"]), "--ppo",
                                       str(m["run"]), "--light-rm", str(m["rm"]),
                                       "--strong-rm", b("missing"), "--prompts", str(prompts),
                                       "--out", str(o)],
    }


def test_preferences_with_a_real_data_folder_lacking_its_files_is_one_error(models, tmp_path):
    demos = tmp_path / "demos.jsonl"
    demos.write_text(json.dumps({"prompt": "hi", "response": "hello"}) + "\n")
    result = CliRunner().invoke(app, [
        "preferences", "--policy", str(models["policy"]), "--demos", str(demos), "--out",
        str(tmp_path / "o"), "--realdata", str(tmp_path / "nowhere")], env={"COLUMNS": "400"})
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert (f"--realdata {tmp_path / 'nowhere'}: hh-rlhf__harmless-base_test.jsonl.gz not found"
            in result.output)
    assert not (tmp_path / "o").exists()


def test_a_broken_reward_backbone_folder_is_named(models, tmp_path):
    backbone = _copy(models["policy"], tmp_path / "backbone")
    _truncate(backbone / "model.safetensors")
    params = tmp_path / "params.yaml"
    write_params(params, reward={"backbone": str(backbone)}, ppo={}, judge={})
    prefs = tmp_path / "prefs"
    prefs.mkdir()
    result = CliRunner().invoke(app, [
        "reward", "--preferences", str(prefs), "--sft", str(models["policy"]), "--out-strong",
        str(tmp_path / "s"), "--out-light", str(tmp_path / "l"), "--params", str(params)],
        env={"COLUMNS": "400"})
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert f"reward.backbone: {backbone / 'model.safetensors'} is truncated" in result.output


COMMANDS = ["ppo --policy", "ppo --policy (missing)", "ppo --policy (an RM)",
            "ppo --policy (a PPO run)", "ppo --reward", "ppo --reward (a policy)",
            "ppo --strong-reward (missing)", "ppo --out (--resume, truncated optim.pt)",
            "sft --tokenizer", "sft --model-config", "preferences --policy", "reward --sft",
            "reward --sft (an RM)", "difficulty --policy", "difficulty --reward-model",
            "difficulty --reward-model (a policy)", "eval --sft", "eval --ppo", "eval --light-rm",
            "eval --strong-rm (missing)"]


@pytest.mark.parametrize("name", COMMANDS)
def test_every_stage_command_gives_one_error_naming_the_folder(models, tmp_path, repo, name):
    args = _commands(models, tmp_path)[name]
    flag = name.split()[1]
    bad = args[args.index(flag) + 1]
    result = CliRunner().invoke(app, [*args, "--params", str(repo / "params.yaml")],
                                env={"COLUMNS": "400"})
    assert result.exit_code == 2, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception  # no traceback
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    assert bad in result.output.replace("\n", ""), result.output
    assert not (tmp_path / "out").exists()  # it stopped before writing anything
