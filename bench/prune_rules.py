"""Pruning rules of seed 000 §3.1 level two on the SFT policy's own samples: share of
samples each rule stops, tokens it saves and its precision against the gold judge, without
training (what the rules do before PPO moves the policy; bench/economy measures them during
training).

    .venv/bin/python bench/prune_rules.py --artifacts /work/benchart --out /tmp/prune_rules.json

The SFT policy samples the first `--prompts` prompts of the pool (PPO's split), in batches of
`ppo.batch_size`, exactly as PPO samples (ppo.temperature / top_p / max_new_tokens), each batch
seeded alike for every rule so the rules see the same draws until one stops a row. The calibrated
threshold comes from the first `--calibration` batches (the hook's own calibration, as in a run).
Every pruned sample is finished offline by the same policy (no hooks, its remaining budget): its
gold is what the stop threw away, the tokens it took are what the stop saved. Precision = share of
pruned samples whose finished gold is below the median gold of the same batch's unpruned samples;
base rate = that share among the unpruned.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RLHF_TORCH_THREADS", "1")

RULES = {  # name: PPOConfig overrides on top of prune_on
    "literal (seed: top-50 entropy < log2(V)/2)": {"prune_rule": "literal"},
    "calibrated p20 + trigram repeat (default)": {},
    "calibrated p50 + bigram repeat": {"prune_percentile": 50.0, "prune_ngram": 2},
    "calibrated p40, no repetition test": {"prune_percentile": 40.0, "prune_ngram": 0},
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--artifacts", type=Path, default=Path("artifacts"))
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--out", type=Path, default=Path("prune_rules.json"))
    ap.add_argument("--prompts", type=int, default=128)
    ap.add_argument("--calibration", type=int, default=2, help="batches for the threshold")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlhf.pipeline.config import load_section
    from rlhf.pipeline.models.policy import set_threads
    from rlhf.pipeline.ppo.generate import generate_rollout, sampling_of
    from rlhf.pipeline.ppo.features.sample_economy import EntropyStop, continue_from_prefix
    from rlhf.pipeline.samplers import load_prompts
    from rlhf.pipeline.models.scoring import load_scorer
    from rlhf.pipeline.models.text import response_of
    from rlhf.pipeline.world.judge import gold_score

    set_threads()
    base = load_section(args.params, "ppo")
    sft = args.artifacts / "models" / "sft"
    tok = AutoTokenizer.from_pretrained(sft)
    model = AutoModelForCausalLM.from_pretrained(sft).eval()
    rm = load_scorer(args.artifacts / "models" / "rm_light")
    prompts = load_prompts(args.artifacts / "store" / "pool")[: args.prompts]
    B, dev = base.batch_size, torch.device("cpu")
    batches = [prompts[i:i + B] for i in range(0, len(prompts), B)]

    calib = EntropyStop(replace(base, prune_on=True, prune_calibration_steps=args.calibration),
                        tok.eos_token_id, tok.pad_token_id)
    for k in range(args.calibration):
        torch.manual_seed(args.seed * 1000 + 10_000 + k)
        generate_rollout(model, tok, batches[k % len(batches)], base, "sft", dev, hooks=[calib],
                         step=k + 1)
    entropies = torch.tensor(calib.calibration)
    result = {"n_prompts": len(prompts), "batch_size": B, "vocab": int(model.config.vocab_size),
              "calibration_tokens": len(entropies),
              "entropy_bits_percentiles": {p: round(float(torch.quantile(entropies, p / 100)), 4)
                                           for p in (5, 10, 20, 30, 40, 50, 70, 90)},
              "share_zero_entropy": round(float((entropies <= 1e-6).float().mean()), 4),
              "rules": {}}
    for name, over in RULES.items():
        cfg = replace(base, prune_on=True, **over)
        hook = EntropyStop(cfg, tok.eos_token_id, tok.pad_token_id)
        if cfg.prune_rule == "calibrated":
            hook.load_state_dict({"threshold": float(torch.quantile(
                entropies, cfg.prune_percentile / 100)), "calibration": []})
        n = pruned = generated = saved = 0
        bad, base_rate, gold_p, gold_u = [], [], [], []
        rm_trunc, rm_fin, rm_kept = [], [], []  # what truncation / finishing / the rest earn
        for k, batch in enumerate(batches):
            torch.manual_seed(args.seed * 1000 + k)
            r = generate_rollout(model, tok, batch, cfg, "sft", dev, hooks=[hook], step=99)
            rows = [i for i, p in enumerate(r.extras["pruned"]) if p]
            n += len(r)
            pruned += len(rows)
            generated += sum(r.extras["generated_tokens"])
            kept = [gold_score(r.prompts[i], r.responses[i]) for i in range(len(r))
                    if i not in rows and "timeout" not in r.flags[i]]
            gold_u += kept
            finished = []
            ok = [i for i in range(len(r)) if i not in rows and "timeout" not in r.flags[i]]
            if ok:
                rm_kept += [float(x) for x in rm.score([r.prompts[i] for i in ok],
                                                       [r.responses[i] for i in ok])[0]]
            if rows:
                pre = [r.response[i][r.response_mask[i]].tolist() for i in rows]
                cont = continue_from_prefix(model, tok, r, rows, pre, sampling_of(cfg), dev)
                texts = []
                for i, p, c in zip(rows, pre, cont):
                    texts.append(response_of(tok.decode(p + c, skip_special_tokens=True)))
                    finished.append(gold_score(r.prompts[i], texts[-1]))
                    saved += len(c)
                ps = [r.prompts[i] for i in rows]
                rm_trunc += [float(x) for x in rm.score(ps, [r.responses[i] for i in rows])[0]]
                rm_fin += [float(x) for x in rm.score(ps, texts)[0]]
            gold_p += finished
            if kept:
                med = statistics.median(kept)
                bad += [g < med for g in finished]
                base_rate += [g < med for g in kept]

        def mean(x):
            return round(sum(x) / len(x), 4) if x else None

        result["rules"][name] = {
            "threshold_bits": hook.threshold, "overrides": over, "samples": n, "pruned": pruned,
            "pruned_share": round(pruned / n, 4), "tokens_generated": generated,
            "tokens_saved": saved, "tokens_saved_share": round(saved / (generated + saved), 4),
            "precision": mean([float(b) for b in bad]),
            "base_rate": mean([float(b) for b in base_rate]),
            "gold_pruned_finished": mean(gold_p), "gold_unpruned": mean(gold_u),
            # light-RM reward: of the truncation (the `truncation` treatment's reward), of the
            # finished copy, of the unpruned samples (`failure` gives the batch's lowest)
            "reward_truncated": mean(rm_trunc), "reward_pruned_finished": mean(rm_fin),
            "reward_unpruned": mean(rm_kept)}
        print(name, json.dumps(result["rules"][name]), flush=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "rules"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
