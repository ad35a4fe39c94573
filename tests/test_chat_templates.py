"""Chat templates (pipeline/models/text.py): with a tokenizer that has one, the same conversation reaches
the policy's generate input, the RM scorer and the judge exactly as `apply_chat_template`
renders it; `text.prompt_format: plain` forces the "Human: ... Assistant:" format; the embedded
world's tokenizer (no template) keeps today's strings. Tokenizers and models are built here."""

from __future__ import annotations

import pytest
import torch
from rlhf.pipeline.models import text
from rlhf.pipeline.decode import encode_prompts
from rlhf.pipeline.reward.scorer import RMEnsemble, encode_texts

LLAMA3 = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
          "<|end_header_id|>\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
          "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
          "{% endif %}")
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIAL = ["<pad>", "<s>", "</s>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
           "<|im_start|>", "<|im_end|>"]

SINGLE = "What colour is the sky?"
# a multi-turn prompt as ingest and the preferences stage store it (hh-rlhf's notation)
MULTI = "What colour is the sky?\n\nAssistant: Blue, mostly.\n\nHuman: Why is it blue?"
MULTI_MESSAGES = [{"role": "user", "content": "What colour is the sky?"},
                  {"role": "assistant", "content": "Blue, mostly."},
                  {"role": "user", "content": "Why is it blue?"}]
RESPONSE = "Because air scatters blue light."


def _tokenizer(template: str | None):
    """A byte-level BPE tokenizer (any text encodes) that adds <s> as a real one adds its BOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([MULTI, RESPONSE, "user assistant Human: Assistant:"] * 4, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")
    if template is not None:
        fast.chat_template = template
    return fast


@pytest.fixture(autouse=True)
def _auto_format():
    previous = text.use_prompt_format("auto")
    yield
    text.use_prompt_format(previous)


def _template_ids(tok, messages, generation_prompt: bool) -> list[int]:
    out = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=generation_prompt,
                                  return_dict=True)
    return list(out["input_ids"])


def _unpadded(enc) -> list[list[int]]:
    return [ids[mask.bool()].tolist() for ids, mask in zip(enc["input_ids"], enc["attention_mask"])]


def _rm(tok, seed: int = 0):
    from transformers import LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                      max_position_embeddings=256, num_labels=1, pad_token_id=tok.pad_token_id)
    return LlamaForSequenceClassification(cfg).eval()


def _direct_score(rm, ids: list[int]) -> float:
    with torch.no_grad():
        return float(rm(input_ids=torch.tensor([ids])).logits[0, 0])


def test_messages_round_trip_through_the_stored_prompt():
    assert text.messages_of(MULTI) == MULTI_MESSAGES
    assert text.flatten(MULTI_MESSAGES) == MULTI
    assert text.messages_of(SINGLE) == [{"role": "user", "content": SINGLE}]
    # ingest's pair context starts with the tag: the same conversation
    assert text.messages_of("\n\nHuman: " + MULTI) == MULTI_MESSAGES
    with pytest.raises(ValueError, match="starts with a user message"):
        text.flatten(MULTI_MESSAGES[1:])


@pytest.mark.parametrize("template", [LLAMA3, CHATML], ids=["llama3", "chatml"])
def test_the_policy_and_the_rms_read_the_conversation_as_the_template_renders_it(template):
    tok = _tokenizer(template)
    conversations = [[{"role": "user", "content": SINGLE}], MULTI_MESSAGES]
    prompts = [SINGLE, MULTI]

    # the policy's generate input (policy.sample, the ppo stage and eval all encode through it)
    assert _unpadded(encode_prompts(tok, prompts)) == [
        _template_ids(tok, c, generation_prompt=True) for c in conversations]
    assert text.render_prompt(MULTI, tok) == tok.apply_chat_template(
        MULTI_MESSAGES, tokenize=False, add_generation_prompt=True)

    # the reward stage's scorer (and every RM judge: RMJudge scores through it)
    answered = [c + [{"role": "assistant", "content": RESPONSE}] for c in conversations]
    want = [_template_ids(tok, c, generation_prompt=False) for c in answered]
    assert encode_texts(tok, prompts, [RESPONSE] * 2, 512) == want
    rm = _rm(tok)
    scorer = RMEnsemble([rm], tok, [0.0], 1.0)
    rewards, _ = scorer(prompts, [RESPONSE] * 2)
    assert rewards.tolist() == pytest.approx([_direct_score(rm, ids) for ids in want], abs=1e-5)

    # PPO's adapter for a plain RM checkpoint reads the same ids
    from rlhf.pipeline.models.scoring import HFScorer

    assert _unpadded(HFScorer(rm, tok)._encode(prompts, [RESPONSE] * 2)) == want


@pytest.mark.parametrize("template", [LLAMA3, CHATML], ids=["llama3", "chatml"])
def test_the_policy_samples_after_the_templated_conversation(template):
    """policy.sample (the preferences, difficulty and reward stages' sampler) continues exactly
    the template's rendering: its greedy response is the one model.generate gives on
    apply_chat_template's ids."""
    from rlhf.pipeline.models.policy import sample
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = _tokenizer(template)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)).eval()
    [[got]] = sample(model, tok, [MULTI], n=1, max_new_tokens=6, temperature=0.0)
    ids = torch.tensor([_template_ids(tok, MULTI_MESSAGES, generation_prompt=True)])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
                             do_sample=False, pad_token_id=tok.pad_token_id)
    new = out[0, ids.shape[1]:].tolist()
    assert got.n_tokens == len(new) == 6
    assert got.response == text.response_of(tok.decode(new, skip_special_tokens=True))


@pytest.mark.parametrize("template", [LLAMA3, CHATML], ids=["llama3", "chatml"])
def test_the_judge_scores_the_templated_conversation(template, tmp_path):
    from rlhf.pipeline.models.judges import RMJudge

    tok = _tokenizer(template)
    rm = _rm(tok, seed=1)
    rm.save_pretrained(tmp_path / "judge")
    tok.save_pretrained(tmp_path / "judge")
    judge = RMJudge(tmp_path / "judge", "rm:test")
    want = _template_ids(tok, MULTI_MESSAGES + [{"role": "assistant", "content": RESPONSE}],
                         generation_prompt=False)
    assert judge(MULTI, RESPONSE) == pytest.approx(_direct_score(rm, want), abs=1e-5)


def test_prompt_format_plain_forces_the_human_assistant_format():
    tok = _tokenizer(CHATML)
    text.use_prompt_format("plain")
    assert _unpadded(encode_prompts(tok, [MULTI])) == [
        tok(f"Human: {MULTI}\nAssistant:")["input_ids"]]
    assert encode_texts(tok, [SINGLE], [RESPONSE], 512) == [
        tok(f"Human: {SINGLE}\nAssistant: {RESPONSE}</s>")["input_ids"]]


def test_prompt_format_template_without_a_template_is_a_one_line_error():
    text.use_prompt_format("template")
    with pytest.raises(ValueError) as err:
        encode_prompts(_tokenizer(None), [SINGLE])
    assert "has no chat template" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match="must be one of"):
        text.use_prompt_format("chatml")


@pytest.mark.parametrize("prompt_format", ["auto", "plain"])
def test_the_embedded_worlds_rendering_is_unchanged(prompt_format):
    """No template (the embedded world's tokenizer): today's exact strings and ids."""
    tok = _tokenizer(None)
    text.use_prompt_format(prompt_format)
    assert text.render_prompt("Name  a fruit.", tok) == "Human: Name a fruit.\nAssistant:"
    assert text.render_sample("Name a fruit.", " Apple. ", tok) == \
        "Human: Name a fruit.\nAssistant: Apple."
    assert text.render_prompt(MULTI, tok) == (
        "Human: What colour is the sky?\n\nAssistant: Blue, mostly.\n\nHuman: Why is it blue?"
        "\nAssistant:")
    assert text.response_offset(SINGLE, tok) == len(f"Human: {SINGLE}\nAssistant: ")
    assert _unpadded(encode_prompts(tok, [SINGLE])) == [
        tok(f"Human: {SINGLE}\nAssistant:")["input_ids"]]
    assert encode_texts(tok, [SINGLE], [RESPONSE], 512) == [
        tok(f"Human: {SINGLE}\nAssistant: {RESPONSE}</s>")["input_ids"]]


@pytest.mark.parametrize("template", [LLAMA3, CHATML], ids=["llama3", "chatml"])
def test_sft_trains_on_the_templated_conversation(template, tmp_path):
    """SFT's rows reach TRL as messages: the training ids are the template's rendering of the
    conversation, the loss on what follows the generation prompt the policy is sampled after."""
    from rlhf.pipeline.sft import _to_dataset, _trainer_class
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import SFTConfig

    tok = _tokenizer(template)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=2, pad_token_id=tok.pad_token_id))
    args = SFTConfig(output_dir=str(tmp_path / "o"), per_device_train_batch_size=2,
                     max_length=256, completion_only_loss=True, report_to="none", use_cpu=True,
                     save_strategy="no", disable_tqdm=True)
    rows = [{"prompt": MULTI, "response": RESPONSE}]
    trainer = _trainer_class()(model=model, args=args, train_dataset=_to_dataset(rows, tok),
                               processing_class=tok)
    example = trainer.train_dataset[0]
    full = _template_ids(tok, MULTI_MESSAGES + [{"role": "assistant", "content": RESPONSE}],
                         generation_prompt=False)
    prompt = encode_prompts(tok, [MULTI])["input_ids"][0].tolist()
    assert example["input_ids"] == full
    assert example["labels"] == [-100] * len(prompt) + full[len(prompt):]


def test_a_users_messages_rows_reach_the_template_turn_by_turn(tmp_path):
    """Ingest keeps a `messages` conversation as one prompt text that reads back as the same
    turns; a conversation it cannot keep that way is quarantined as bad_record."""
    import json

    from rlhf.pipeline.ingest import IngestConfig, run_ingest
    from rlhf.store.io import read_table

    meta = {"source_type": "user_query", "session_id": "s1", "timestamp": "2026-01-02T03:04:05Z"}
    rows = [{"messages": MULTI_MESSAGES, **meta},
            {"messages": MULTI_MESSAGES[:2], **meta},  # ends on the assistant: no prompt
            {"messages": [{"role": "user", "content": "a\n\nHuman: b"}], **meta},
            {"messages": [{"role": "tool", "content": "x"}], **meta}]
    src = tmp_path / "chat.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = run_ingest([src], tmp_path / "store", IngestConfig())
    assert (res.kept, res.rejected) == (1, 3)
    [kept] = read_table("prompts", tmp_path / "store" / "prompts").to_pylist()
    assert kept["text"] == MULTI and text.messages_of(kept["text"]) == MULTI_MESSAGES
    reasons = [r["reasons"] for r in read_table("rejected", tmp_path / "store" / "rejected")
               .to_pylist()]
    assert reasons == [["bad_record"]] * 3
    tok = _tokenizer(CHATML)
    assert text.render_prompt(kept["text"], tok) == tok.apply_chat_template(
        MULTI_MESSAGES, tokenize=False, add_generation_prompt=True)


def test_a_stage_with_template_and_no_template_stops_with_one_error_line(tmp_path):
    """`rlhf sft` on the embedded world's kind of tokenizer (no template) with
    text.prompt_format: template: one `error:` line, no traceback, no checkpoint."""
    from params_file import write_params
    from rlhf.cli.app import app
    from tiny_world import write_demonstrations, write_model_config, write_tokenizer
    from transformers import AutoTokenizer
    from typer.testing import CliRunner

    tok_dir = write_tokenizer(tmp_path / "tokenizer")
    cfg_dir = write_model_config(tmp_path / "mc", len(AutoTokenizer.from_pretrained(tok_dir)))
    demos = write_demonstrations(tmp_path / "d.jsonl", n=8)
    params = write_params(tmp_path / "params.yaml", sft={}, judge={},
                          text={"prompt_format": "template"})
    res = CliRunner().invoke(app, ["sft", "--demos", str(demos), "--tokenizer", str(tok_dir),
                                   "--model-config", str(cfg_dir), "--out", str(tmp_path / "sft"),
                                   "-p", str(params)], env={"COLUMNS": "400"})
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: sft failed: text.prompt_format is "
                                                   "'template' but the tokenizer"), res.output
    assert "has no chat template" in lines[0]
    assert not (tmp_path / "sft" / "model.safetensors").exists()
