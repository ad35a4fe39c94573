"""Sanity check of the embedded default: a tiny Llama trained briefly on the world's demos.

Trains the world's model_config from scratch on demonstrations.jsonl with a plain torch loop
(a stand-in for the SFT stage, with a throwaway prompt format), then samples answers to held-out
prompts and scores them with the gold judge. It shows that the tokenizer and config fit together,
that the model learns varied text quickly on a CPU, and how much headroom the gold judge leaves.

    python bench/world_tiny_sft_check.py artifacts/world --seconds 120
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("world", type=Path, nargs="?", default=Path("artifacts/world"))
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--samples", type=int, default=48)
    args = ap.parse_args()

    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from rlhf.pipeline.world.judge import gold_score

    torch.manual_seed(0)
    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(str(args.world / "tokenizer"))
    cfg = LlamaConfig.from_pretrained(str(args.world / "model_config"))
    model = LlamaForCausalLM(cfg)
    demos = [json.loads(x) for x in (args.world / "demonstrations.jsonl").read_text().splitlines()]
    rng = random.Random(0)
    rng.shuffle(demos)
    held, train = demos[: args.samples], demos[args.samples:]

    def fmt(prompt: str) -> str:
        return f"Question: {prompt}\nAnswer:"

    seqs = []
    for d in train:
        p = tok(fmt(d["prompt"]), add_special_tokens=False)["input_ids"]
        r = tok(" " + d["response"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        ids = ([tok.bos_token_id] + p + r)[: cfg.max_position_embeddings]
        seqs.append((ids, 1 + len(p)))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    t0, step, batch = time.perf_counter(), 0, 32
    model.train()
    while time.perf_counter() - t0 < args.seconds:
        chunk = rng.sample(seqs, batch)
        width = max(len(s) for s, _ in chunk)
        ids = torch.full((batch, width), tok.pad_token_id)
        labels = torch.full((batch, width), -100)
        att = torch.zeros((batch, width), dtype=torch.long)
        for i, (s, n_prompt) in enumerate(chunk):
            ids[i, : len(s)] = torch.tensor(s)
            labels[i, n_prompt: len(s)] = torch.tensor(s[n_prompt:])
            att[i, : len(s)] = 1
        loss = model(input_ids=ids, attention_mask=att, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        step += 1
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.3f} ({time.perf_counter() - t0:.0f}s)")
    model.eval()
    scores, texts = [], []
    for d in held:
        p = [tok.bos_token_id] + tok(fmt(d["prompt"]), add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            out = model.generate(torch.tensor([p]), max_new_tokens=120, do_sample=True,
                                 temperature=0.8, top_p=0.95, eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.pad_token_id)
        text = tok.decode(out[0, len(p):], skip_special_tokens=True).strip()
        texts.append(text)
        scores.append(gold_score(d["prompt"], text))
    demo_gold = statistics.fmean(gold_score(d["prompt"], d["response"]) for d in held)
    print(f"params {sum(p.numel() for p in model.parameters()):,}  steps {step}  "
          f"final loss {loss.item():.3f}")
    print(f"gold mean: sampled {statistics.fmean(scores):.2f}  held-out demos {demo_gold:.2f}  "
          f"distinct samples {len(set(texts))}/{len(texts)}")
    for d, t, s in list(zip(held, texts, scores))[:4]:
        print(f"[{s:.2f}] {d['prompt']}\n   -> {t}")


if __name__ == "__main__":
    main()
