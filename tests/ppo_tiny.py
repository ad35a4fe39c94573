"""A tiny PPO world the trainer tests build for themselves: a word-level tokenizer, a 2-layer
LlamaForCausalLM policy (hidden 32), a 2-layer LlamaForSequenceClassification RM, prompts."""

from __future__ import annotations

import json
from pathlib import Path

WORDS = ("the cat dog bird sun moon is was very good bad great poor nice awful a an and or "
         "tell me about describe explain why how what happy sad big small fast slow").split()
PROMPTS = ["tell me about the cat", "describe the dog", "explain why the sun is big",
           "how is the moon", "what is a bird", "tell me about the sun and the moon",
           "describe a fast dog", "explain how the cat is happy", "what was the small bird",
           "tell me why the dog is sad", "how big is the moon", "describe the slow cat"]


def tokenizer(words: tuple[str, ...] = WORDS):
    """A word-level tokenizer of `words` (and "...") with [PAD] [UNK] [BOS] [EOS]."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[BOS]", "[EOS]", *words, "..."])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                   bos_token="[BOS]", eos_token="[EOS]")


def llama_config(tok, **kw):
    from transformers import LlamaConfig

    args = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
                pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                eos_token_id=tok.eos_token_id, tie_word_embeddings=False)
    args.update(kw)
    return LlamaConfig(**args)


def policy(tok, seed: int = 0):
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(llama_config(tok)).eval()


def _rm(tok, seed: int, folder: Path):
    import torch
    from transformers import LlamaForSequenceClassification

    torch.manual_seed(seed)
    rm = LlamaForSequenceClassification(llama_config(tok, num_labels=1))
    rm.save_pretrained(folder)
    tok.save_pretrained(folder)
    return rm


def build_world(root: Path, reward_stage: bool = False) -> dict[str, Path]:
    """Policy, RM and prompts on disk (what `rlhf ppo` reads).

    `reward_stage=True` makes both RM folders the reward stage's own (scorer.json: baseline
    reference, temperature, so the confidence is real, 1 - H2(P)): "reward" a single RM (the
    light one), "strong_reward" an ensemble of two. Their references and temperature are set from
    the members' scores of a few texts, so about half the samples fall below the 0.6 gate."""
    tok = tokenizer()
    root.mkdir(parents=True, exist_ok=True)
    pol = policy(tok)
    pol.save_pretrained(root / "policy")
    tok.save_pretrained(root / "policy")
    rm = _rm(tok, 1, root / "rm")
    with open(root / "prompts.jsonl", "w") as fh:
        for i, p in enumerate(PROMPTS):
            fh.write(json.dumps({"prompt_id": f"p{i:02d}", "text": p}) + "\n")
    world = {"policy": root / "policy", "reward": root / "rm", "prompts": root / "prompts.jsonl"}
    if reward_stage:
        members = [rm, _rm(tok, 2, root / "rm_strong" / "m0"), _rm(tok, 3, root / "rm_strong" / "m1")]
        _save_scorer(tok, root / "rm", [rm], ["."])
        _save_scorer(tok, root / "rm_strong", members[1:], ["m0", "m1"])
        world["strong_reward"] = root / "rm_strong"
    return world


def _save_scorer(tok, folder: Path, models: list, members: list[str]) -> None:
    import statistics

    from rlhf.pipeline.reward.scorer import batch_scores, encode_texts, save_scorer

    texts = [w for w in WORDS if w not in ("a", "an")][:16]
    ids = encode_texts(tok, PROMPTS[:len(texts)], texts, 64)
    scores = [batch_scores(m, tok, ids).tolist() for m in models]
    refs = [statistics.median(s) for s in scores]
    spread = statistics.pstdev([x - r for s, r in zip(scores, refs) for x in s]) or 1.0
    save_scorer(folder, members, refs, temperature=spread / 3, aggregation="mean", max_length=64)


class WordScorer:
    """An RM-like callable: the share of 'good/great/nice/happy' words in the response."""

    name = "word_rm"
    POSITIVE = {"good", "great", "nice", "happy"}

    def score(self, prompts, responses):
        import torch

        r = [sum(w in self.POSITIVE for w in s.split()) / max(len(s.split()), 1)
             for s in responses]
        return torch.tensor(r), torch.ones(len(r))


PARAMS = {
    "seed": 0, "total_steps": 6, "batch_size": 4, "mini_batch_size": 2, "ppo_epochs": 1,
    "max_new_tokens": 6, "max_prompt_tokens": 16, "learning_rate": 0.001,
    "critic_learning_rate": 0.001, "critic_hidden_size": 32, "critic_layers": 2,
    "critic_heads": 4, "critic_max_tokens": 16, "checkpoint_every": 2, "csv_every": 2,
    "lambda_eps_table_on": True, "adaptive_clip_on": True, "kl_warmup_on": True,
    "kl_warmup_steps": 3, "collapse_detector_on": True, "gradnorm_reference_steps": 2,
    # the wall-clock fallback off in practice: runs that tests compare step for step must not
    # depend on the machine's load (two pytest workers and a torchrun share 2 cores); the tests
    # of the fallback set their own timeout
    "generation_timeout_s": 600.0,
}


def write_params(path: Path, attn_implementation: str = "eager", **overrides) -> Path:
    """A params file of PARAMS with `overrides` in its ppo section; the attention goes to the
    `compute` section (pipeline/models/compute.py), where every stage reads it."""
    from params_file import write_params as write

    return write(path, ppo={**PARAMS, **overrides},
                 compute={"attn_implementation": attn_implementation})
