"""LoRA through peft: SFT's LoRA path (`sft.lora`, pipeline/sft.py) on a tiny pretrained Llama
trains adapters on every linear layer and saves them merged, and `rlhf export --merge` turns an
adapter folder into a plain model folder whose logits are the adapted model's; `reward.train.lora`
trains an RM's adapters and head and merges them (PPO's LoRA: tests/test_ppo_lora.py)."""

from __future__ import annotations

import json

import peft  # the real library under test: a missing package fails here, loudly
import pytest
import torch
from rlhf.cli.app import app
from tiny_world import toy_gold, write_demonstrations, write_model_config, write_tokenizer
from typer.testing import CliRunner

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _base(tmp_path):
    """A tiny Llama saved as a pretrained model folder (weights + tokenizer), and its weights."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tok_dir = write_tokenizer(tmp_path / "tokenizer")
    tok = AutoTokenizer.from_pretrained(tok_dir)
    config = AutoConfig.from_pretrained(str(write_model_config(tmp_path / "mc", len(tok))))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    return tmp_path / "base", {k: v.clone() for k, v in model.state_dict().items()}


def test_sft_lora_trains_adapters_on_the_linear_layers_and_saves_them_merged(tmp_path):
    from rlhf.pipeline.sft import SftConfig, run
    from transformers import AutoModelForCausalLM

    base, before = _base(tmp_path)
    demos = write_demonstrations(tmp_path / "demos.jsonl", n=48)
    cfg = SftConfig(base_model=str(base), lora=True, lora_r=4, lora_alpha=8, epochs=2,
                    batch_size=16, learning_rate=1e-2, eval_prompts=2, eval_max_new_tokens=4,
                    heldout_fraction=0.15)
    m = run(cfg, demos, tmp_path / "sft", judge=toy_gold)
    assert not (tmp_path / "sft" / "adapter_config.json").exists()  # merged: a plain model
    saved = AutoModelForCausalLM.from_pretrained(str(tmp_path / "sft"))
    after = saved.state_dict()
    assert set(after) == set(before)
    changed = {k for k in before if not torch.equal(after[k], before[k])}
    # adapters on every linear layer of the blocks (peft's all-linear: not the LM head), so
    # those weights moved and nothing else did (embeddings, norms, head)
    linear = {k for k in before if ".layers." in k and k.endswith("proj.weight")}
    assert changed == linear
    # merged back: the base's parameters, no adapter ones
    assert m["n_params"] == sum(p.numel() for p in saved.parameters())
    assert m["eval_loss"] == m["eval_loss"] and m["train_loss"] == m["train_loss"]


def test_export_merge_turns_adapters_into_a_plain_model_with_the_adapted_logits(tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base, _ = _base(tmp_path)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(base)),
                           LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    torch.manual_seed(1)
    for name, p in model.named_parameters():
        if "lora_B" in name:  # a trained adapter, not peft's zero-initialised one
            torch.nn.init.normal_(p, std=0.05)
    model.save_pretrained(tmp_path / "adapters")
    AutoTokenizer.from_pretrained(str(base)).save_pretrained(tmp_path / "adapters")
    res = CliRunner().invoke(app, ["export", str(tmp_path / "adapters"), str(tmp_path / "out"),
                                   "--merge", "--lock", str(tmp_path / "none.lock")])
    assert res.exit_code == 0, res.output
    assert not (tmp_path / "out" / "adapter_config.json").exists()
    assert "base_model_name_or_path" not in json.loads(
        (tmp_path / "out" / "config.json").read_text())
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
    ids = torch.tensor([[1, 5, 9, 12, 7]])
    with torch.no_grad():
        want = model.eval()(input_ids=ids).logits
        got = merged(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(got, AutoModelForCausalLM.from_pretrained(str(base))(
        input_ids=ids).logits, atol=1e-3)  # the adapters changed the logits
    assert peft.__version__


def test_reward_lora_trains_adapters_and_the_head_and_the_adapters_change_the_scores(tmp_path):
    """`reward.train.lora`: only the adapters and the fresh score head train; the returned RM is
    a plain classifier with them merged, and without the adapters its scores differ."""
    from rlhf.pipeline.models.lora import LoraConfig
    from rlhf.pipeline.reward.scorer import batch_scores, encode_texts
    from rlhf.pipeline.reward.train import RmTrainConfig, init_rm, pairwise_loss, train_rm
    from tiny_world import toy_pairs
    from transformers import AutoTokenizer

    base, _ = _base(tmp_path)
    tok = AutoTokenizer.from_pretrained(str(base))
    model = init_rm(str(base), seed=0)  # the base + a fresh score head
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pairs = toy_pairs(64, seed=0)
    cfg = RmTrainConfig(epochs=3, learning_rate=1e-2, batch_size=16, max_length=64,
                        lora=LoraConfig(enabled=True, r=4, alpha=8))
    loss_before = pairwise_loss(model, tok, pairs, cfg.max_length)["loss"]
    trained, _ = train_rm(model, tok, pairs, cfg, seed=0)
    assert not hasattr(trained, "peft_config")  # merged: what every scorer loads
    after = trained.state_dict()
    assert set(after) == set(before)
    changed = {k for k in before if not torch.equal(after[k], before[k])}
    linear = {k for k in before if ".layers." in k and k.endswith("proj.weight")}
    assert changed == linear | {"score.weight"}  # the adapters' layers and the head, no more
    assert pairwise_loss(trained, tok, pairs, cfg.max_length)["loss"] < loss_before - 0.1
    ids = encode_texts(tok, [p["prompt"] for p in pairs[:8]], [p["chosen"] for p in pairs[:8]],
                       cfg.max_length)
    scores = batch_scores(trained, tok, ids)
    trained.load_state_dict({**after, **{k: before[k] for k in linear}})  # adapters taken out
    assert not torch.allclose(batch_scores(trained, tok, ids), scores, atol=1e-4)
