"""params.yaml `compute` (pipeline/models/compute.py): resolution is a pure function of the section and
the machine; `auto` on a machine without CUDA is exactly the CPU float32 settings the stages used
before the section existed; a device or dtype the machine cannot give is one error line; and every
stage's load path puts its model's tensors in the dtype asked for (bf16 runs on a CPU), on tiny
models the test builds and saves."""

from __future__ import annotations

import json

import ppo_tiny
import pytest
import torch
from rlhf.pipeline.models.compute import (STAGES, Compute, ComputeConfig, ComputeError, Machine,
                                   for_training, resolve)
from rlhf.pipeline.config import ConfigError, build, load_config

NO_GPU = Machine(cuda=False)
BF16 = Compute(dtype="bfloat16")


def _dtypes(model) -> set:
    return {p.dtype for p in model.parameters()}


# ------------------------------------------------------------------------------ resolution
def test_auto_on_a_machine_without_cuda_is_the_cpu_in_float32_with_the_librarys_attention():
    c = resolve(ComputeConfig(), machine=NO_GPU)
    assert (c.device, c.dtype, c.attn_implementation, c.gradient_checkpointing) == \
        ("cpu", "float32", None, False)
    assert c.load_kwargs() == {"dtype": torch.float32}  # what the stages passed before
    assert len(c.why) == 3 and "no GPU" in c.why[0]


def test_auto_on_a_gpu_is_cuda_in_bf16_with_flash_attention_where_it_imports():
    gpu = Machine(cuda=True, gpus=2, bf16=True, flash_attn=True)
    assert resolve(ComputeConfig(), machine=gpu) == Compute(
        "cuda:0", "bfloat16", "flash_attention_2", False, resolve(ComputeConfig(), machine=gpu).why)
    old = resolve(ComputeConfig(), machine=Machine(cuda=True, gpus=1))  # no bf16, no flash-attn
    assert (old.device, old.dtype, old.attn_implementation) == ("cuda:0", "float32", None)
    assert resolve(ComputeConfig(device="cuda:1"), machine=gpu).device == "cuda:1"


def test_a_stage_entry_is_merged_over_the_global_values():
    cfg = ComputeConfig(dtype="float32", stages={"reward": {"dtype": "bfloat16"},
                                                 "sft": {"attn_implementation": "eager"}})
    gpu = Machine(cuda=True, gpus=2, bf16=True)
    assert resolve(cfg, "reward", NO_GPU).dtype == "bfloat16"
    assert resolve(cfg, "ppo", NO_GPU).dtype == "float32"
    assert resolve(cfg, "sft", NO_GPU).attn_implementation == "eager"
    on_second = ComputeConfig(stages={"reward": {"device": "cuda:1"}})
    assert (resolve(on_second, "reward", gpu).device, resolve(on_second, "ppo", gpu).device) == \
        ("cuda:1", "cuda:0")


@pytest.mark.parametrize("cfg, machine, needle", [
    (ComputeConfig(device="cuda"), NO_GPU, "compute (stage ppo): device cuda: torch sees no CUDA"),
    (ComputeConfig(device="cuda:2"), Machine(cuda=True, gpus=2), "this machine has 2 GPU(s)"),
    (ComputeConfig(dtype="float16"), NO_GPU, "dtype float16 on the CPU"),
    (ComputeConfig(attn_implementation="flash_attention_2"), NO_GPU, "needs a GPU and flash-attn"),
])
def test_what_the_machine_cannot_give_is_one_line(cfg, machine, needle):
    with pytest.raises(ComputeError) as err:
        resolve(cfg, "ppo", machine)
    assert needle in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("section, needle", [
    ({"dtype": "fp8"}, "[compute] key 'dtype' must be"),
    ({"device": "gpu"}, "device must be auto, cpu, cuda or cuda:N"),
    ({"stages": {"route": {"device": "cpu"}}}, "unknown stage 'route'"),
    ({"stages": {"reward": {"dtyp": "bfloat16"}}}, "stages.reward: a mapping of"),
    ({"stages": {"reward": {"dtype": "fp8"}}}, "stages.reward.dtype must be one of auto, float32"),
    ({"stages": {"ppo": {"gradient_checkpointing": "yes"}}}, "gradient_checkpointing must be"),
])
def test_a_bad_section_is_one_config_error(section, needle):
    with pytest.raises(ConfigError) as err:
        build(ComputeConfig, section, "compute")
    assert needle in str(err.value) and "\n" not in str(err.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without CUDA")
def test_a_stage_asked_for_cuda_without_one_stops_with_one_line(tmp_path):
    from params_file import write_params
    from rlhf.cli.app import app
    from typer.testing import CliRunner

    params = write_params(tmp_path / "p.yaml", sft={}, judge={}, compute={"device": "cuda"})
    res = CliRunner().invoke(app, ["sft", "--demos", str(tmp_path / "d.jsonl"), "--out",
                                   str(tmp_path / "o"), "--params", str(params)])
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit)
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "device cuda: torch sees no CUDA GPU" in lines[0], res.output


def test_the_shipped_params_resolve_here_to_the_settings_the_stages_had(repo):
    """The embedded default and the realdata profile: on this CPU every stage runs float32 on the
    CPU with the attention it had (sft eager in the default; the library's default elsewhere,
    PPO naming sdpa as before), so their outputs do not move."""
    if torch.cuda.is_available():
        pytest.skip("the default's resolution on a CPU machine")
    default = load_config(repo / "params.yaml", "compute")
    for stage in STAGES:
        c = resolve(default, stage)
        assert (c.device, c.dtype, c.gradient_checkpointing) == ("cpu", "float32", False)
        assert c.attn_implementation == ("eager" if stage == "sft" else None), stage
    real = load_config(repo / "profiles" / "realdata" / "params.yaml", "compute")
    assert {resolve(real, s).describe() for s in STAGES} == {resolve().describe()}


# ------------------------------------------------------------------------ each stage's load path
@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return ppo_tiny.build_world(tmp_path_factory.mktemp("compute"), reward_stage=True)


def test_policy_loads_in_the_dtype_asked_for_and_samples(world, capsys):
    """preferences, difficulty, the reward stage's rollouts, sft's judged samples and eval's
    reference all load through policy.load_policy."""
    from rlhf.pipeline.models.policy import load_policy, sample

    model, tok = load_policy(world["policy"], BF16)
    assert _dtypes(model) == {torch.bfloat16}
    assert "saved in float32, cast to bfloat16" in capsys.readouterr().err
    out = sample(model, tok, ppo_tiny.PROMPTS[:2], n=2, max_new_tokens=4, seed=1)
    assert [len(x) for x in out] == [2, 2] and all(s.n_tokens <= 4 for x in out for s in x)
    capsys.readouterr()
    plain, _ = load_policy(world["policy"], resolve(machine=NO_GPU))
    assert _dtypes(plain) == {torch.float32}
    assert "cast" not in capsys.readouterr().err  # no cast: no line (a load bar may print)


def test_reward_models_load_and_score_in_the_dtype_asked_for(world):
    """reward scoring, difficulty, eval's RMs and ppo's reward: the stage's scorer.json folders
    and a plain sequence-classification folder; scores come back float32 on the CPU."""
    from rlhf.pipeline.models.scoring import load_scorer
    from rlhf.pipeline.reward.scorer import load_ensemble

    strong = load_ensemble(world["strong_reward"], compute=BF16)
    assert all(_dtypes(m) == {torch.bfloat16} for m in strong.models)
    rewards, conf = strong(ppo_tiny.PROMPTS[:3], ["good", "bad", "nice"])
    assert rewards.dtype == torch.float32 and rewards.shape == (3,) and conf.shape == (3,)
    light = load_scorer(world["reward"], compute=BF16)  # ppo's light RM (a reward-stage folder)
    scores, _ = light.score(ppo_tiny.PROMPTS[:2], ["good", "bad"])
    assert scores.shape == (2,)
    plain_rm = world["strong_reward"] / "m0"  # a plain save_pretrained RM folder
    hf = load_scorer(plain_rm, compute=BF16)
    assert _dtypes(hf.model) == {torch.bfloat16}
    assert hf.score(["a"], ["good"])[0].dtype == torch.float32


def test_ppo_features_load_the_strong_rm_in_the_dtype_asked_for(world):
    """Level 2 and RM evolution read `--strong-reward` through the feature context, which
    trainer.run gives the ppo stage's compute: the strong RM loads as the light one does."""
    from rlhf.pipeline.ppo.config import PPOConfig
    from rlhf.pipeline.ppo.features import FeatureContext

    paths = {"strong_reward": world["strong_reward"]}
    strong = FeatureContext(PPOConfig(), paths, compute=BF16).optional("strong_reward")
    assert strong.name == "strong_rm"
    assert all(_dtypes(m) == {torch.bfloat16} for m in strong.scorer.models)
    plain = FeatureContext(PPOConfig(), paths).optional("strong_reward")  # None: as before
    assert all(_dtypes(m) == {torch.float32} for m in plain.scorer.models)


def test_the_judge_loads_its_rm_in_the_dtype_asked_for(world):
    from rlhf.pipeline.models.judges import JudgeConfig, load_judge

    judge = load_judge(JudgeConfig(kind="rm", model=str(world["strong_reward"] / "m0")),
                       compute=BF16)
    assert all(_dtypes(m) == {torch.bfloat16} for m in judge._scorer.models)
    assert len(judge.score(["tell me"], ["good"])) == 1


def test_eval_loads_a_checkpoint_in_the_dtype_asked_for(world, tmp_path):
    from rlhf.pipeline.eval import load_checkpoint_policy
    from transformers import AutoModelForCausalLM

    step = tmp_path / "step-000001"
    step.mkdir()
    m = AutoModelForCausalLM.from_pretrained(str(world["policy"]))
    torch.save(m.state_dict(), step / "policy.pt")  # the trainer's policy.pt checkpoint
    assert _dtypes(load_checkpoint_policy(world["policy"], step, BF16)) == {torch.bfloat16}
    assert _dtypes(load_checkpoint_policy(world["policy"], world["policy"], BF16)) == \
        {torch.bfloat16}


def test_reward_training_builds_its_models_in_the_dtype_asked_for(world):
    """The strong members (init_rm) and the light RM (build_light); gradient checkpointing on
    where compute asks for it, off by default."""
    from rlhf.pipeline.reward.distill import LightConfig, build_light
    from rlhf.pipeline.reward.train import init_rm

    rm = init_rm(str(world["policy"]), compute=Compute(dtype="bfloat16",
                                                       gradient_checkpointing=True))
    assert _dtypes(rm) == {torch.bfloat16} and rm.is_activation_checkpointing
    assert not init_rm(str(world["policy"]), compute=BF16).is_activation_checkpointing
    light = build_light(LightConfig(init="sft", num_layers=1), str(world["policy"]),
                        compute=BF16)
    assert _dtypes(light) == {torch.bfloat16}
    assert _dtypes(init_rm(str(world["policy"]))) == {torch.float32}  # None: as before


def test_ppo_loads_its_policy_and_reference_in_the_dtype_asked_for(world):
    from rlhf.pipeline.ppo.trainer import _load_policy
    from transformers import AutoModelForCausalLM

    policy = _load_policy(AutoModelForCausalLM, world["policy"], BF16, "policy")
    assert _dtypes(policy) == {torch.bfloat16}
    # the default on a CPU: float32 and SDPA named, as ppo loaded before the compute section
    plain = _load_policy(AutoModelForCausalLM, world["policy"], resolve(machine=NO_GPU),
                         "policy")
    assert _dtypes(plain) == {torch.float32} and plain.config._attn_implementation == "sdpa"
    assert for_training(plain, Compute(gradient_checkpointing=True)).is_activation_checkpointing


def test_sft_trains_in_bf16_and_its_saved_config_records_it(tmp_path):
    """sft in bfloat16 on the CPU with gradient checkpointing: the weights it saves are bf16 and
    config.json says so (`dtype`), which a later stage's load reads to say it casts."""
    from rlhf.pipeline.models.compute import saved_dtype
    from rlhf.pipeline.sft import SftConfig, build_model, train_sft
    from tiny_world import write_demonstrations, write_model_config, write_tokenizer
    from transformers import AutoTokenizer

    tok_dir = write_tokenizer(tmp_path / "tokenizer")
    cfg_dir = write_model_config(tmp_path / "mc", len(AutoTokenizer.from_pretrained(tok_dir)))
    model, _ = build_model(SftConfig(), tok_dir, cfg_dir, BF16)
    assert _dtypes(model) == {torch.bfloat16}
    assert _dtypes(build_model(SftConfig(), tok_dir, cfg_dir)[0]) == {torch.float32}
    demos = [json.loads(x) for x in
             write_demonstrations(tmp_path / "d.jsonl", n=16).read_text().splitlines()]
    cfg = SftConfig(epochs=1.0, batch_size=8, max_length=64, heldout_fraction=0.0)
    m = train_sft(cfg, demos, tmp_path / "sft", tok_dir, cfg_dir,
                  compute=Compute(dtype="bfloat16", gradient_checkpointing=True))
    assert m["train_loss"] == m["train_loss"]  # a number, not NaN
    assert saved_dtype(tmp_path / "sft") == "bfloat16"
    # accelerate's state is process-wide: ppo, next in the same process, builds its accelerator
    # from its own compute (float32 on the CPU), not under the Trainer's bf16 autocast
    from rlhf.pipeline.ppo.trainer import _accelerator

    acc = _accelerator(resolve(machine=NO_GPU))
    assert acc.mixed_precision == "no" and acc.device.type == "cpu"
    with acc.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
