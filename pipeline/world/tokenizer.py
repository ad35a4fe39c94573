"""The embedded default's tiny byte-level BPE tokenizer and tiny Llama-style model config.

The tokenizer is trained with `tokenizers` on the world's own corpus (demonstrations and clean
prompts) and saved as a transformers tokenizer (AutoTokenizer.from_pretrained works offline), with
bos/eos/pad special tokens. Training is deterministic: one thread (RAYON_NUM_THREADS=1 is set
before `tokenizers` is imported, when it is not already set), a fixed corpus order, and the
trainer breaks merge-count ties by pair order; tests train twice and compare the saved files.

    rlhf world generate --seed 0 --out artifacts/world   # writes tokenizer/ and model_config/
"""

from __future__ import annotations

import json
import os
from pathlib import Path

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
SPECIAL_TOKENS = (PAD, BOS, EOS)  # ids 0, 1, 2


def train_tokenizer(corpus: list[str], vocab_size: int, out_dir: Path) -> int:
    """Train a byte-level BPE tokenizer on `corpus`, save it to `out_dir`; returns its size."""
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer, length=len(corpus))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS,
                                   pad_token=PAD, model_max_length=1024)
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    _canonicalise_json(out_dir)
    return len(fast)


def _canonicalise_json(folder: Path) -> None:
    # Sorted keys and fixed indentation, so the files are byte-identical across runs.
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        path.write_text(json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n",
                        encoding="utf-8")


def llama_param_count(vocab_size: int, hidden_size: int, intermediate_size: int,
                      num_hidden_layers: int, num_attention_heads: int,
                      num_key_value_heads: int, tie_word_embeddings: bool) -> int:
    """Parameters of a LlamaForCausalLM with this shape (no biases; RMSNorm weights)."""
    head_dim = hidden_size // num_attention_heads
    attn = hidden_size * hidden_size * 2 + 2 * hidden_size * num_key_value_heads * head_dim
    mlp = 3 * hidden_size * intermediate_size
    layer = attn + mlp + 2 * hidden_size
    emb = vocab_size * hidden_size
    return emb * (1 if tie_word_embeddings else 2) + num_hidden_layers * layer + hidden_size


def write_model_config(out_dir: Path, tokenizer_dir: Path, hidden_size: int,
                       intermediate_size: int, num_hidden_layers: int, num_attention_heads: int,
                       num_key_value_heads: int, max_position_embeddings: int) -> dict:
    """Save a tiny LlamaConfig whose vocab and special ids match the tokenizer; returns a summary."""
    from transformers import AutoTokenizer, LlamaConfig

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads, max_position_embeddings=max_position_embeddings,
        rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(str(out_dir))
    _canonicalise_json(out_dir)
    n = llama_param_count(len(tok), hidden_size, intermediate_size, num_hidden_layers,
                          num_attention_heads, num_key_value_heads, True)
    return {"vocab_size": len(tok), "n_params": n, "hidden_size": hidden_size,
            "num_hidden_layers": num_hidden_layers}
