"""The `--quick` world of the benchmark (bench/economy): a tiny policy, a light RM and prompts built in seconds.

A word-level tokenizer over a few dozen words, a 2-layer LlamaForCausalLM (hidden 32) as the SFT
policy, a 2-layer LlamaForSequenceClassification as the light RM (a plain checkpoint folder, which
`rlhf.pipeline.models.scoring.load_scorer` reads), training prompts as JSONL (the trainer reads them
like the full run's artifacts/store/pool) and held-out prompts as JSON. Nothing is trained: the
point is that every path of the harness runs, with real token counts and real gold scores (the
world's gold judge scores length and repetition of any text).

    .venv/bin/python -c "from bench.economy import world as w; import pathlib; \
print(w.build(pathlib.Path('/tmp/qw')))"
"""

from __future__ import annotations

import json
from pathlib import Path

WORDS = ("the", "cat", "dog", "bird", "sun", "moon", "is", "was", "very", "good", "bad", "great",
         "poor", "nice", "awful", "a", "an", "and", "or", "tell", "me", "about", "describe",
         "explain", "why", "how", "what", "happy", "sad", "big", "small", "fast", "slow",
         "light", "water", "plants", "green", "leaves", "red", "blue", "sky", "it", "they",
         "because")
TRAIN = ["tell me about the cat", "describe the dog", "explain why the sun is big",
         "how is the moon", "what is a bird", "tell me about the sun and the moon",
         "describe a fast dog", "explain how the cat is happy", "what was the small bird",
         "tell me why the dog is sad", "how big is the moon", "describe the slow cat"]
HELD_OUT = ["why is the sky blue", "why are leaves green", "tell me about water",
            "describe the plants", "what is light", "explain why plants are green",
            "how fast is light", "what is red and blue"]


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[BOS]", "[EOS]", "Human:", "Assistant:"]
    vocab = {t: i for i, t in enumerate([*specials, *WORDS, "."])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                   bos_token="[BOS]", eos_token="[EOS]")


def _llama(tok, cls, seed: int, **kw):
    import torch
    from transformers import LlamaConfig

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=128, pad_token_id=tok.pad_token_id,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      tie_word_embeddings=False, **kw)
    return cls(cfg)


def build(root: Path) -> dict[str, Path]:
    """Write the world under `root`; returns {sft, rm_light, pool, held_out}."""
    from transformers import LlamaForCausalLM, LlamaForSequenceClassification

    root.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer()
    for name, model in (("sft", _llama(tok, LlamaForCausalLM, 0)),
                        ("rm_light", _llama(tok, LlamaForSequenceClassification, 1,
                                            num_labels=1))):
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    pool = root / "prompts.jsonl"
    pool.write_text("".join(json.dumps({"prompt_id": f"p{i:02d}", "text": t}) + "\n"
                            for i, t in enumerate(TRAIN)))
    held = root / "held_out.json"
    held.write_text(json.dumps([[f"h{i:02d}", t] for i, t in enumerate(HELD_OUT)]))
    return {"sft": root / "sft", "rm_light": root / "rm_light", "pool": pool, "held_out": held}


def build_artifacts(root: Path) -> Path:
    """The same world in the pipeline's artifacts layout (`root` = an `artifacts/` folder):
    models/sft, models/rm_light and the store's pool (ppo and eval splits), similar and
    difficulty tables, so bench/dvc.yaml's stages run end to end in seconds without `make run`.

        .venv/bin/python -c "from bench.economy import world as w; import pathlib; \
w.build_artifacts(pathlib.Path('/tmp/tiny-artifacts'))"
    """
    import shutil
    import tempfile

    from rlhf.store.hashing import prompt_key
    from rlhf.store.io import write_shard

    scratch = Path(tempfile.mkdtemp(prefix="economy-world-"))
    world = build(scratch)
    for name in ("sft", "rm_light"):
        shutil.rmtree(root / "models" / name, ignore_errors=True)
        shutil.copytree(world[name], root / "models" / name)
    shutil.rmtree(scratch, ignore_errors=True)
    texts = [(f"p{i:02d}", t, "ppo") for i, t in enumerate(TRAIN)] + [
        (f"h{i:02d}", t, "eval") for i, t in enumerate(HELD_OUT)]
    pool = [{"prompt_id": pid, "prompt_key": prompt_key(pid), "text": t, "source_type": "human",
             "source_file": "world.jsonl", "source_line": i, "dedup_cluster": i,
             "cluster_size": 1, "topic_cluster": i % 2, "n_tokens": len(t.split()), "split": split}
            for i, (pid, t, split) in enumerate(texts)]
    similar = [{"prompt_id": "s00", "text": "tell me about a cat", "source_file": "world.jsonl",
                "source_line": 99, "representative_id": "p00", "dedup_cluster": 0,
                "distance": 0.1}]
    difficulty = [{"prompt_id": pid, "prompt_key": prompt_key(pid), "text": t, "split": split,
                   "topic_cluster": i % 2, "length": 8, "logprob_std": 0.5, "rm_score": 0.0,
                   "score": float(i % 10), "bucket": ("low", "mid", "high")[i % 3]}
                  for i, (pid, t, split) in enumerate(texts)]
    for table, rows in (("pool", pool), ("similar", similar), ("difficulty", difficulty)):
        shutil.rmtree(root / "store" / table, ignore_errors=True)
        write_shard(table, rows, root / "store" / table / "part-00000.parquet")
    return root
