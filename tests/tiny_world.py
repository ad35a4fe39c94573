"""A tiny stand-in for the world stage, made inside the tests: a byte-level BPE tokenizer trained
on a toy corpus, a 2-layer LlamaConfig, a toy gold judge and toy demonstrations.

The toy task: a prompt asks about a colour word; a good response repeats that word and the word
"because"; a bad one talks about something else. `toy_gold` scores that on 0-5.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

COLOURS = ["red", "blue", "green", "yellow", "purple", "orange", "black", "white"]
FILLER = ["the", "cat", "sat", "on", "a", "mat", "and", "then", "it", "ran", "far", "away"]


def toy_prompt(i: int) -> str:
    return f"Tell me about {COLOURS[i % len(COLOURS)]} things number {i}."


def toy_response(prompt: str, good: bool, rng: random.Random) -> str:
    colour = next(c for c in COLOURS if c in prompt)
    if good:
        return f"{colour.capitalize()} is nice because {colour} is {rng.choice(FILLER)} bright."
    return " ".join(rng.choice(FILLER) for _ in range(rng.randint(3, 7))) + "."


def toy_gold(prompt: str, response: str) -> float:
    colour = next((c for c in COLOURS if c in prompt), "")
    score = 1.0
    if colour and colour in response.lower():
        score += 2.5
    if "because" in response:
        score += 1.5
    return min(score, 5.0)


def write_tokenizer(path: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(0)
    corpus = []
    for i in range(200):
        p = toy_prompt(i)
        corpus += [f"Human: {p}\nAssistant: {toy_response(p, i % 2 == 0, rng)}"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")
    fast.save_pretrained(path)
    return path


def write_model_config(path: Path, vocab_size: int, hidden: int = 32, layers: int = 2) -> Path:
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=2,
                      max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                      tie_word_embeddings=True)
    cfg.save_pretrained(path)
    return path


def write_demonstrations(path: Path, n: int = 64) -> Path:
    rng = random.Random(1)
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            p = toy_prompt(i)
            fh.write(json.dumps({"prompt": p, "response": toy_response(p, True, rng),
                                 "topic": "colour", "quality": 1.0}) + "\n")
    return path


def toy_pairs(n: int, seed: int = 0) -> list[dict]:
    """Preference pairs of the toy task: chosen = a good response, rejected = a bad one."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p = toy_prompt(i)
        out.append({"prompt": p, "chosen": toy_response(p, True, rng),
                    "rejected": toy_response(p, False, rng)})
    return out
