"""Where the strong RM ensemble's training time went, cut by cut: the embedded
default's real training pairs (the reward stage's `training_data`: annotator rankings plus
hacked twins), a few optimiser steps of one MiniLM member under each way of training it, each in
this process one after the other:

- `pairwise`: TRL's RewardTrainer as the stage ran it before (random batches of 32 pairs, both
  texts of every pair scored, each batch padded to its longest);
- `distinct`: pipeline/reward/train.py's batches (a prompt's pairs together, each distinct text
  scored once a step), one padded batch;
- `chunked`: the same in length-sorted chunks (`scorer.forward_scores`), the stage's fp32 path;
- `chunked_bf16`: that under bf16 autocast (`reward.precision: bf16`).

Per way: texts forwarded and tokens padded per epoch (counted, exact) and seconds per step
(median over `--steps` steps after one warm-up step), and the epoch's seconds they imply.

    .venv/bin/python bench/reward_cuts.py --artifacts artifacts --threads 2   # idle CPU

Needs `dvc repro preferences` (its table; the world's gold judge orders the hacked twins).
Prints one JSON line per way; figures, not a pass/fail test.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

WAYS = ("pairwise", "distinct", "chunked", "chunked_bf16")


def _padded(widths_per_batch: list[list[int]]) -> int:
    return sum(max(w) * len(w) for w in widths_per_batch if w)


def epoch_counts(pairs, ids, chosen, rejected, batch_size: int, seed: int,
                 chunk: int) -> dict[str, dict]:
    """Texts forwarded and padded tokens over one epoch, per way (deterministic). `ids`: the
    distinct texts' tokens; `chosen` / `rejected`: each pair's indices into them."""
    from rlhf.pipeline.reward.train import prompt_batches

    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    pw = [order[s:s + batch_size] for s in range(0, len(order), batch_size)]
    pw_w = [[len(ids[side[i]]) for i in b for side in (chosen, rejected)] for b in pw]
    db = prompt_batches(pairs, batch_size, random.Random(seed))
    d_w = [[len(ids[t]) for t in sorted({side[i] for i in b for side in (chosen, rejected)})]
           for b in db]
    chunks = [sorted(w)[s:s + chunk] for w in d_w for s in range(0, len(w), chunk)]

    def counts(steps, widths, padded):
        return {"steps": steps, "texts": sum(map(len, widths)), "padded_tokens": _padded(padded),
                "real_tokens": sum(map(sum, widths))}

    return {"pairwise": counts(len(pw), pw_w, pw_w), "distinct": counts(len(db), d_w, d_w),
            "chunked": counts(len(db), d_w, chunks)}


def time_way(way: str, init: str, tok, pairs, ids, chosen, rejected, cfg, steps: int,
             seed: int) -> float:
    """Median seconds per optimiser step of `steps` steps (+1 warm-up) of one member."""
    import torch

    from rlhf.pipeline.reward.scorer import autocast, forward_scores, fp32_head, pad_rows
    from rlhf.pipeline.reward.train import init_rm, prompt_batches

    model = init_rm(init, seed=seed)
    model.config.pad_token_id = tok.pad_token_id
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=0.0)
    rng = random.Random(seed)
    pad = tok.pad_token_id
    precision = "bf16" if way.endswith("_bf16") else "fp32"
    if precision == "bf16":
        fp32_head(model)
    if way == "pairwise":  # both texts of every pair, one padded batch of 2 x 32 a step
        order = list(range(len(pairs)))
        rng.shuffle(order)
        batches = [order[s * cfg.batch_size:(s + 1) * cfg.batch_size] for s in range(steps + 1)]
    else:
        batches = prompt_batches(pairs, cfg.batch_size, rng)
    times = []
    for s in range(steps + 1):
        b = batches[s % len(batches)]
        t0 = time.perf_counter()
        with autocast(precision):
            if way == "pairwise":
                x, mask = pad_rows([ids[chosen[i]] for i in b] + [ids[rejected[i]] for i in b],
                                   pad)
                rc, rr = torch.chunk(model(input_ids=x, attention_mask=mask).logits[:, 0], 2)
            else:
                uniq = sorted({side[i] for i in b for side in (chosen, rejected)})
                pos = {t: k for k, t in enumerate(uniq)}
                chunk = 16 if way.startswith("chunked") else len(uniq)
                scores = forward_scores(model, [ids[t] for t in uniq], pad, chunk=chunk)
                rc = scores[[pos[chosen[i]] for i in b]]
                rr = scores[[pos[rejected[i]] for i in b]]
            (-torch.nn.functional.logsigmoid(rc - rr).mean()).backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifacts", type=Path, default=Path("artifacts"))
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    ap.add_argument("--ways", nargs="+", default=list(WAYS), choices=WAYS)
    args = ap.parse_args()

    import torch

    from rlhf.pipeline.config import load_config
    from rlhf.pipeline.models.policy import load_tokenizer, quiet_hf
    from rlhf.pipeline.reward.scorer import encode_texts
    from rlhf.pipeline.reward.stage import training_data
    from rlhf.pipeline.reward.train import distinct_texts, resolve_backbone
    from rlhf.pipeline.world.judge import gold_score

    quiet_hf()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = load_config(args.params, "reward")
    data = training_data(cfg, args.artifacts / "store" / "preferences", gold_score)
    init = resolve_backbone(cfg.backbone, args.artifacts / "models" / "sft")
    tok = load_tokenizer(init)
    pairs = data.train_pairs
    texts, chosen, rejected = distinct_texts(pairs)
    ids = encode_texts(tok, [t[0] for t in texts], [t[1] for t in texts], cfg.train.max_length)
    counts = epoch_counts(pairs, ids, chosen, rejected, cfg.train.batch_size, cfg.seed, 16)
    counts["chunked_bf16"] = counts["chunked"]
    load = os.getloadavg()[0]
    for way in args.ways:
        sec = time_way(way, init, tok, pairs, ids, chosen, rejected, cfg.train, args.steps,
                       cfg.seed)
        c = counts[way]
        print(json.dumps({"way": way, "pairs": len(pairs), **c, "seconds_per_step": round(sec, 3),
                          "epoch_seconds": round(sec * c["steps"], 1),
                          "threads": torch.get_num_threads(), "load_average": round(load, 2)}),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
