"""The SFT stage on a tiny tokenizer/model the test builds, and the shared text format."""

from __future__ import annotations

import json

import pytest

from rlhf.pipeline.text import format_prompt, format_sample, response_of, split_dialogue
from tiny_world import toy_gold, toy_prompt, write_demonstrations, write_model_config, write_tokenizer


def test_sample_starts_with_prompt():
    p, r = "  What   is\tthis? ", " A cat. "
    assert format_sample(p, r).startswith(format_prompt(p))
    assert format_sample(p, r) == "Human: What is this?\nAssistant: A cat."
    assert response_of(" Fine.\nHuman: more?") == "Fine."


def test_split_dialogue():
    d = "\n\nHuman: Hi\n\nAssistant: Hello\n\nHuman: Help me?\n\nAssistant: Sure."
    prompt, reply = split_dialogue(d)
    assert reply == "Sure."
    assert prompt.startswith("Hi\n\nAssistant: Hello") and prompt.endswith("Help me?")
    assert split_dialogue("\n\nHuman: no reply") is None


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("world")
    tok = write_tokenizer(d / "tokenizer")
    from transformers import AutoTokenizer

    cfg = write_model_config(d / "model_config", len(AutoTokenizer.from_pretrained(tok)))
    demos = write_demonstrations(d / "demonstrations.jsonl", n=96)
    return d, tok, cfg, demos


@pytest.mark.slow
def test_sft_trains_saves_and_judges(tiny, tmp_path):
    from rlhf.pipeline.policy import load_policy, sample
    from rlhf.pipeline.sft import SftConfig, run

    d, tok, cfg_path, demos = tiny
    cfg = SftConfig(epochs=15, batch_size=16, learning_rate=1e-2, eval_prompts=8,
                    eval_max_new_tokens=16, heldout_fraction=0.15)
    out = tmp_path / "sft"
    m = run(cfg, demos, out, tmp_path / "sft.json", tok, cfg_path, judge=toy_gold)
    assert (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file()
    assert json.loads((tmp_path / "sft.json").read_text())["n_train"] == m["n_train"]
    assert m["n_heldout"] > 0
    # the toy demonstrations are easy: the policy must beat an untrained one clearly
    assert m["eval_loss"] < 2.0, m
    assert m["gold_mean"] > 2.5, m
    model, tk = load_policy(out)
    a = sample(model, tk, [toy_prompt(1), toy_prompt(2)], n=3, max_new_tokens=12, seed=3)
    b = sample(model, tk, [toy_prompt(1), toy_prompt(2)], n=3, max_new_tokens=12, seed=3)
    assert [[s.response for s in x] for x in a] == [[s.response for s in x] for x in b]
    assert all(len(x) == 3 for x in a)
    s = a[0][0]
    assert s.n_tokens == len(s.logprobs) and all(lp <= 0 for lp in s.logprobs)
