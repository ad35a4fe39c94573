"""Torch threads and RM precision on this machine: the pipeline's kinds of work timed at 1 and at
2 (or --threads) intra-op threads, each in a fresh process: a MiniLM reward-model training step
(the strong ensemble and the light RM's distillation), MiniLM scoring (the RMs' reports, PPO's
rewards, eval), both also under bf16 autocast (`reward.precision`, pipeline/reward/scorer.py),
the sft stage's trainer with SDPA and eager attention (`compute.stages.sft.attn_implementation`;
seconds per step over its `--repeats` + 1 steps) and the tiny SFT policy's sampling (preferences,
reward rollouts, ppo, eval).

    .venv/bin/python bench/threads.py --artifacts artifacts          # on an otherwise idle CPU

Prints one JSON line per (work, threads): seconds per unit, median of `--repeats`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

WORK = ("rm_train_step", "rm_train_step_bf16", "rm_score_64", "rm_score_64_bf16",
        "sft_train_step", "sft_train_step_eager", "policy_sample_16")


def _one(work: str, threads: int, artifacts: Path, repeats: int) -> dict:
    import statistics
    import time

    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    times = []
    if work.startswith("rm_"):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from rlhf.pipeline.reward.scorer import autocast, fp32_head

        folder = artifacts / "models" / "rm_strong" / "member_0"
        tok = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForSequenceClassification.from_pretrained(folder)
        precision = "bf16" if work.endswith("_bf16") else "fp32"
        if precision == "bf16":
            fp32_head(model)
        n = 64  # a training batch of 32 pairs is 64 texts; a scoring batch is 64
        enc = tok(["a question about the water cycle and a long answer " * 6] * n,
                  truncation=True, max_length=128, padding="max_length", return_tensors="pt")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
        for _ in range(repeats + 1):
            t = time.perf_counter()
            if work.startswith("rm_train_step"):
                with autocast(precision):
                    loss = model(**enc).logits.float().pow(2).mean()
                    loss.backward()
                opt.step()
                opt.zero_grad()
            else:
                with torch.no_grad(), autocast(precision):
                    model(**enc)
            times.append(time.perf_counter() - t)
    elif work.startswith("sft_train_step"):
        # the sft stage's own trainer (TRL SFTTrainer, length-grouped batches of the world's
        # demonstrations): masked, padded batches, where SDPA's CPU kernel is the slower one
        import tempfile

        from trl import SFTConfig, SFTTrainer

        from rlhf.pipeline.sft import SftConfig, _to_dataset, build_model, read_demonstrations
        from rlhf.pipeline.models.policy import quiet_trainer

        world = artifacts / "world"
        cfg = SftConfig()
        model, tok = build_model(cfg, world / "tokenizer", world / "model_config")
        model.set_attn_implementation("eager" if work.endswith("_eager") else "sdpa")
        rows = read_demonstrations(world / "demonstrations.jsonl")[:32 * (repeats + 1)]
        with tempfile.TemporaryDirectory() as tmp:
            args = SFTConfig(output_dir=tmp, max_steps=repeats + 1, learning_rate=cfg.learning_rate,
                             per_device_train_batch_size=32, max_length=128,
                             completion_only_loss=True, train_sampling_strategy="group_by_length",
                             report_to="none", use_cpu=True, save_strategy="no",
                             eval_strategy="no", logging_strategy="no", disable_tqdm=True)
            trainer = SFTTrainer(model=model, args=args, train_dataset=_to_dataset(rows, tok),
                                 processing_class=tok)
            quiet_trainer(trainer)
            t = time.perf_counter()
            trainer.train()
        return {"work": work, "threads": threads,
                "seconds": round((time.perf_counter() - t) / (repeats + 1), 4)}  # a mean
    else:
        from rlhf.pipeline.models.policy import load_policy, sample

        policy, tok = load_policy(artifacts / "models" / "sft")
        prompts = ["Explain how the water cycle works."] * 16
        for i in range(repeats + 1):
            t = time.perf_counter()
            sample(policy, tok, prompts, n=1, max_new_tokens=48, temperature=1.0, top_p=1.0,
                   seed=i, batch_size=16)
            times.append(time.perf_counter() - t)
    return {"work": work, "threads": threads, "seconds": round(statistics.median(times[1:]), 4)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifacts", type=Path, default=Path("artifacts"))
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(_one(args.one[0], int(args.one[1]), args.artifacts, args.repeats)))
        return 0
    env = {**os.environ, "OMP_NUM_THREADS": "", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("OMP_NUM_THREADS")
    for work in WORK:
        for n in args.threads:
            subprocess.run([sys.executable, __file__, "--artifacts", str(args.artifacts),
                            "--repeats", str(args.repeats), "--one", work, str(n)],
                           check=True, env={**env, "RLHF_TORCH_THREADS": str(n)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
