"""The SFT stage on a tiny tokenizer/model the test builds, and the shared text format."""

from __future__ import annotations


import pytest
from rlhf.pipeline.models.text import format_prompt, format_sample, response_of, split_dialogue
from tiny_world import policy_metrics, toy_prompt, trained_policy


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


@pytest.mark.slow
def test_sft_trains_saves_and_judges(tmp_path_factory):
    from rlhf.pipeline.models.policy import load_policy, sample

    d, out = trained_policy(tmp_path_factory)  # runs rlhf.pipeline.sft.run (shared, ~15 s)
    m = policy_metrics()
    assert (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file()
    assert m["n_heldout"] > 0 and m["n_params"] > 0
    # every value the stage ran with is in its report (tiny_world's, not the defaults)
    assert m["params"]["epochs"] == 15 and m["params"]["learning_rate"] == 1e-2
    assert m["params"]["eval_prompts"] == 8 and m["params"]["heldout_fraction"] == 0.15
    # the toy demonstrations are easy: far below the ~6 nats of an untrained model, and its
    # samples mention the prompt's colour (an untrained policy scores 1.0 with the toy judge)
    assert m["eval_loss"] < 2.0, m
    assert m["gold_mean"] > 2.0, m
    model, tk = load_policy(out)
    a = sample(model, tk, [toy_prompt(1), toy_prompt(2)], n=3, max_new_tokens=12, seed=3)
    b = sample(model, tk, [toy_prompt(1), toy_prompt(2)], n=3, max_new_tokens=12, seed=3)
    assert [[s.response for s in x] for x in a] == [[s.response for s in x] for x in b]
    assert all(len(x) == 3 for x in a)
    s = a[0][0]
    assert s.n_tokens == len(s.logprobs) and all(lp <= 0 for lp in s.logprobs)


def test_sft_rejects_bad_demonstrations(tmp_path):
    from rlhf.pipeline.sft import read_demonstrations

    bad = tmp_path / "d.jsonl"
    bad.write_text('{"prompt": "a", "response": "b"}\n{not json\n')
    with pytest.raises(ValueError, match="d.jsonl:2: not JSON"):
        read_demonstrations(bad)
    bad.write_text('{"prompt": "a"}\n')
    with pytest.raises(ValueError, match="needs string fields"):
        read_demonstrations(bad)


def test_the_sft_loss_is_trls_completion_only_loss(tmp_path):
    """The stage's trainer takes the loss from the model's own head on the collator's labels;
    TRL's SFTTrainer computes it through its fused LM head: the same value on the same batch."""
    import torch
    from rlhf.pipeline.sft import SftConfig, _to_dataset, _trainer_class, build_model
    from tiny_world import write_demonstrations, write_model_config, write_tokenizer
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    tok_dir = write_tokenizer(tmp_path / "tokenizer")
    cfg_dir = write_model_config(tmp_path / "mc", len(AutoTokenizer.from_pretrained(tok_dir)))
    rows = [__import__("json").loads(x) for x in
            write_demonstrations(tmp_path / "d.jsonl", n=16).read_text().splitlines()]
    model, tok = build_model(SftConfig(), tok_dir, cfg_dir)
    args = SFTConfig(output_dir=str(tmp_path / "o"), per_device_train_batch_size=8,
                     max_length=64, completion_only_loss=True, report_to="none", use_cpu=True,
                     save_strategy="no", disable_tqdm=True)
    ours = _trainer_class()(model=model, args=args, train_dataset=_to_dataset(rows, tok),
                            processing_class=tok)
    batch = next(iter(ours.get_train_dataloader()))
    assert (batch["labels"] == -100).any() and (batch["labels"] != -100).any()
    with torch.no_grad():
        loss = ours.compute_loss(ours.model, dict(batch))
        theirs = SFTTrainer.compute_loss(ours, ours.model, dict(batch))
    assert torch.allclose(loss, theirs, atol=1e-4), (loss, theirs)
