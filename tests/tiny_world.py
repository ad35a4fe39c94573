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


class ToyLabel:
    def __init__(self, annotator_id, labeled_at, scores, ranking):
        self.annotator_id, self.labeled_at = annotator_id, labeled_at
        self.scores, self.ranking = scores, ranking


class ToyAnnotatorPool:
    """The world's AnnotatorPool contract: noisy, biased, drifting scores of the toy judge."""

    def __init__(self, n_annotators, noise_std, bias, drift_per_day, seed, start):
        self.ids = [f"ann{i}" for i in range(n_annotators)]
        self.noise_std, self.bias, self.drift = noise_std, bias, drift_per_day
        self.rng = random.Random(seed)
        self.start = start

    def label(self, prompt, responses, when):
        ann = self.ids[self.rng.randrange(len(self.ids))]
        days = (when - self.start).total_seconds() / 86400
        scores = tuple(
            min(5.0, max(0.0, toy_gold(prompt, r) + self.bias.get(ann, 0.0) + self.drift * days
                         + self.rng.gauss(0, self.noise_std)))
            for r in responses)
        ranking = tuple(sorted(range(len(responses)), key=lambda i: -scores[i]))
        return ToyLabel(ann, when, scores, ranking)


_POLICY_CACHE: dict = {}


def trained_policy(tmp_path_factory) -> tuple[Path, Path]:
    """(world folder, SFT policy folder) trained once per test session (about 15 s)."""
    if "policy" not in _POLICY_CACHE:
        from rlhf.pipeline.sft import SftConfig, run
        from transformers import AutoTokenizer

        d = tmp_path_factory.mktemp("tinyworld")
        tok = write_tokenizer(d / "tokenizer")
        cfg = write_model_config(d / "model_config", len(AutoTokenizer.from_pretrained(tok)))
        demos = write_demonstrations(d / "demonstrations.jsonl", n=96)
        # half the demonstrations are bad, so the policy's samples vary in quality
        rng = random.Random(5)
        lines = (d / "demonstrations.jsonl").read_text().splitlines()
        mixed = []
        for i, line in enumerate(lines):
            row = json.loads(line)
            if i % 2:
                row["response"] = toy_response(row["prompt"], False, rng)
            mixed.append(json.dumps(row))
        (d / "demonstrations.jsonl").write_text("\n".join(mixed) + "\n")
        metrics = run(SftConfig(epochs=15, batch_size=16, learning_rate=1e-2, eval_prompts=8,
                                eval_max_new_tokens=16, heldout_fraction=0.15),
                      demos, d / "sft", tok, cfg, judge=toy_gold)
        _POLICY_CACHE.update(world=d, policy=d / "sft", metrics=metrics)
    return _POLICY_CACHE["world"], _POLICY_CACHE["policy"]


def policy_metrics() -> dict:
    return _POLICY_CACHE["metrics"]


def write_pool(directory: Path, n: int = 120, start: int = 1000) -> Path:
    """A `pool` table of unseen toy prompts: splits reward/ppo/eval = 50/30/20 %, 4 topics."""
    from rlhf.store.hashing import content_hash
    from rlhf.store.io import write_shard

    rows = []
    for i in range(start, start + n):
        text = toy_prompt(i)
        k = i % 10
        rows.append({"prompt_id": content_hash(text), "text": text, "source_type": "human",
                     "source_file": "sources/human.jsonl", "source_line": i,
                     "dedup_cluster": i, "cluster_size": 1, "topic_cluster": i % 4,
                     "n_tokens": len(text.split()),
                     "split": "reward" if k < 5 else "ppo" if k < 8 else "eval"})
    write_shard("pool", rows, Path(directory) / "part-00000.parquet")
    return Path(directory)
