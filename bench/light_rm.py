"""Which distilled light RM for the embedded default: light-vs-strong Spearman, size and speed.

Distils one light RM per variant from the strong ensemble the reward stage saved, on the
stage's own distillation set (`reward.distill.distill_set`: SFT rollouts and topic demonstrations
of the pool's ppo-split prompts plus the training rankings, labelled by the strong RM) through
the stage's own `build_light` / `distill`, and measures what the stage reports: Spearman against
the strong RM on fresh samples of unseen prompts (seed 001 §5.1 / §4.2: the seed's light RM
reaches 0.91; the issue asks >= 0.9 at >= 3x the speed), distillation seconds, parameters, and
the scoring-time ratio strong / light on those samples.

Needs the artifacts of `dvc repro reward`:

    .venv/bin/python bench/light_rm.py
    .venv/bin/python bench/light_rm.py --variant strong:2:3:0.0002 --variant sft:1:10:0.002

Each --variant is INIT:LAYERS:EPOCHS:LEARNING_RATE (INIT as params.yaml `reward.light.init`
takes it: `sft` = the first layers of the tiny SFT policy with the policy's tokenizer, `strong` =
the first layers of strong member 0 with MiniLM's). Figures, not a pass/fail test; the machine's
load average is printed beside the timings.
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

DEFAULT_VARIANTS = ("sft:1:10:0.002", "strong:1:4:0.0002", "strong:2:2:0.0003",
                    "strong:2:3:0.0002")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--artifacts", default="artifacts", type=Path)
    ap.add_argument("--params", default="params.yaml", type=Path)
    ap.add_argument("--variant", action="append", help="INIT:LAYERS:EPOCHS:LR (repeatable)")
    ap.add_argument("--out", type=Path, help="also write the rows as JSON here")
    args = ap.parse_args()

    import torch
    from rlhf.pipeline.config import load_config
    from rlhf.pipeline.models.policy import load_policy, load_tokenizer, quiet_hf
    from rlhf.pipeline.reward.distill import build_light, distill, distill_set
    from rlhf.pipeline.reward.onpolicy import spearman
    from rlhf.pipeline.reward.report import fresh_samples
    from rlhf.pipeline.reward.scorer import RMEnsemble, encode_texts, load_ensemble
    from rlhf.pipeline.reward.stage import eval_prompts_of
    from rlhf.store.io import read_table

    quiet_hf()
    a = args.artifacts
    demos = a / "world" / "demonstrations.jsonl"
    cfg = load_config(args.params, "reward")
    rows = [r for r in read_table("preferences", a / "store" / "preferences").to_pylist()
            if r["source"] == "annotator"]
    strong_dir = a / "models" / "rm_strong"
    strong = load_ensemble(strong_dir)
    policy, ptok = load_policy(a / "models" / "sft")
    rollout_prompts, eval_prompts = eval_prompts_of(cfg, a / "store" / "pool", demos,
                                                    {r["prompt_id"] for r in rows})
    from rlhf.pipeline.ppo.generate import sampling_of

    d_prompts, d_resps, groups, _ = distill_set(cfg, policy, ptok, rollout_prompts, rows,
                                                demos, sampling_of(load_config(args.params, "ppo")))
    targets, _ = strong(d_prompts, d_resps)
    f_prompts, f_resps, f_policy = fresh_samples(cfg, policy, ptok, eval_prompts, demos)
    t0 = time.perf_counter()
    s_rew = strong(f_prompts, f_resps)[0].tolist()
    strong_s = time.perf_counter() - t0
    pol = [i for i, f in enumerate(f_policy) if f]
    print(f"{len(d_prompts)} distillation labels in {len(groups)} groups, {len(f_resps)} fresh "
          f"samples ({len(pol)} policy) of {len(eval_prompts)} unseen prompts; strong RM "
          f"{strong.n_params / 1e6:.1f}M params scores them in {strong_s:.2f} s; torch threads "
          f"{torch.get_num_threads()}")

    results = []
    for spec in args.variant or DEFAULT_VARIANTS:
        init, layers, epochs, lr = spec.split(":")
        lcfg = replace(cfg.light, init=init, num_layers=int(layers), epochs=int(epochs),
                       learning_rate=float(lr))
        tok = strong.tokenizer if init == "strong" else load_tokenizer(a / "models" / "sft")
        ids = encode_texts(tok, d_prompts, d_resps, cfg.train.max_length)
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        model, _ = distill(build_light(lcfg, str(a / "models" / "sft"), cfg.seed,
                                       str(strong_dir / "member_0")),
                           tok, ids, targets, groups, lcfg, seed=cfg.seed)
        train_s = time.perf_counter() - t0
        light = RMEnsemble([model], tok, [0.0], 1.0, "mean", cfg.train.max_length, cfg.batch_size)
        # both timed now, under the same machine load (the strong scorer has no memo: it
        # really scores the texts again)
        best = float("inf")
        for _ in range(2):
            t0 = time.perf_counter()
            l_rew = light(f_prompts, f_resps)[0].tolist()
            best = min(best, time.perf_counter() - t0)
        t0 = time.perf_counter()
        strong(f_prompts, f_resps)
        strong_s = time.perf_counter() - t0
        row = {
            "variant": spec, "params": light.n_params,
            "spearman_vs_strong": round(spearman(l_rew, s_rew), 3),
            "spearman_vs_strong_policy_only": round(spearman([l_rew[i] for i in pol],
                                                             [s_rew[i] for i in pol]), 3),
            "distill_seconds": round(train_s, 1),
            "score_seconds": round(best, 2),
            "strong_score_seconds": round(strong_s, 2),
            "speed_ratio": round(strong_s / best, 1),
            "load_average": [round(load0, 2), round(os.getloadavg()[0], 2)],
        }
        results.append(row)
        print(json.dumps(row))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
