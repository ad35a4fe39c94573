"""How far an engine's old log-probs are from the trainer's forward over the same
tokens (what the old-log-prob guard, pipeline/decode/logprob_guard.py, checks at run time):
mean and max |delta log p| over the response tokens, and the PPO ratio exp(trainer - engine) at
the first epoch (1 when they agree), per engine, one sampled batch.

    RLHF_TORCH_THREADS=1 .venv/bin/python bench/logprob_mismatch.py \
        --policy artifacts/models/sft --prompts artifacts/store --batch 16
    (bench/gpu_device.sh runs it on the GPU in bf16 after the engine timing)
"""

from __future__ import annotations

import argparse
import json

import torch
from rlhf.pipeline.decode import (
    Sampling,
    cut_at_eos,
    encode_prompts,
    get_generator,
    pad_responses,
    response_logits,
    token_logprobs,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", required=True)
    ap.add_argument("--prompts", default=None, help="a store root (default: synthetic prompts)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--engines", nargs="+", default=["native", "static"])
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, choices=sorted(DTYPES))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(args.policy).eval()
    tok = AutoTokenizer.from_pretrained(args.policy)
    if args.dtype:
        model = model.to(DTYPES[args.dtype])
    dev = torch.device(args.device)
    model = model.to(dev)
    if args.prompts:
        from rlhf.pipeline.heldout_prompts import held_out_prompts

        texts = [t for _, t in held_out_prompts(args.prompts)][: args.batch]
    else:
        texts = [f"tell me about item {i}" for i in range(args.batch)]
    enc = {k: v.to(dev) for k, v in encode_prompts(tok, texts).items()}
    sampling = Sampling(0.8, 0.95, args.max_new_tokens)
    report = {"policy": args.policy, "dtype": str(next(model.parameters()).dtype),
              "device": str(dev), "batch": args.batch, "engines": {}}
    for name in args.engines:
        torch.manual_seed(0)
        with torch.no_grad():
            made = get_generator(name).generate(model, tok, enc, sampling)
            rows = [cut_at_eos(g, tok.eos_token_id, tok.pad_token_id) or [tok.eos_token_id]
                    for g in made.tokens.tolist()]
            resp, mask = pad_responses(rows, tok.pad_token_id)
            resp, mask = resp.to(dev), mask.to(dev)
            logits = response_logits(model, enc["input_ids"], enc["attention_mask"], resp, mask,
                                     sampling.temperature)
            mine = token_logprobs(logits, resp)
        T = resp.shape[1]
        d = (made.logprobs[:, :T].float() - mine.float())[mask]
        ratio = torch.exp(-d)
        report["engines"][name] = {
            "tokens": int(mask.sum()), "mean_abs": float(d.abs().mean()),
            "max_abs": float(d.abs().max()), "ratio_min": float(ratio.min()),
            "ratio_max": float(ratio.max())}
        r = report["engines"][name]
        print(f"{name:8s} tokens {r['tokens']:5d}  |delta log p| mean {r['mean_abs']:.2e} "
              f"max {r['max_abs']:.2e}  first-epoch ratio [{r['ratio_min']:.6f}, "
              f"{r['ratio_max']:.6f}]")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
