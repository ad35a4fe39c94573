"""How well the reward models rank PPO's own distribution: Spearman against the gold judge over
SFT samples of the ppo-split prompts at PPO's sampling settings, overall and within a prompt
(pipeline/reward/onpolicy.py), and whether it prefers reward-hacking twins of those samples
(a sentence repeated, keyword salad, cut short: reward/augment.hack_probe), for the RM folders of `dvc repro reward` (or any given).

    .venv/bin/python bench/onpolicy_rm.py                       # rm_light and rm_strong
    .venv/bin/python bench/onpolicy_rm.py --rm artifacts/models/rm_light --k 6

Figures, not a test; the reward stage reports the same numbers for the RMs it trains.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--artifacts", default="artifacts", type=Path)
    ap.add_argument("--params", default="params.yaml", type=Path)
    ap.add_argument("--rm", action="append", type=Path, help="RM scorer folder (repeatable)")
    ap.add_argument("--k", type=int, default=6, help="samples per prompt")
    ap.add_argument("--seed", type=int, default=123)
    ap.add_argument("--out", type=Path, help="also write the rows as JSON here")
    args = ap.parse_args()

    from rlhf.pipeline.config import load_config
    from rlhf.pipeline.models.policy import load_policy, quiet_hf
    from rlhf.pipeline.models.scoring import load_scorer
    from rlhf.pipeline.reward.augment import hack_probe
    from rlhf.pipeline.reward.onpolicy import onpolicy_report, onpolicy_set
    from rlhf.pipeline.world.judge import gold_score
    from rlhf.store.io import read_table

    quiet_hf()
    a = args.artifacts
    ppo = load_config(args.params, "ppo")
    prompts = sorted(r["text"] for r in read_table("pool", a / "store/pool").to_pylist()
                     if r["split"] == "ppo")
    policy, tok = load_policy(a / "models/sft")
    t0 = time.perf_counter()
    data = onpolicy_set(policy, tok, prompts, args.k, ppo.temperature, ppo.top_p,
                        ppo.max_new_tokens, args.seed, 64)
    print(f"{len(prompts)} prompts x {args.k} samples at T={ppo.temperature} top_p={ppo.top_p} "
          f"({time.perf_counter() - t0:.0f}s); gold mean {sum(data.gold) / len(data):.3f}, "
          f"max {max(data.gold):.2f}")
    rows = []
    for rm in args.rm or [a / "models/rm_light", a / "models/rm_strong"]:
        scorer = load_scorer(rm)
        scores, _ = scorer.score(data.prompts, data.responses)
        row = {"rm": str(rm), **onpolicy_report([float(s) for s in scores], data)}
        # reward-hacking twins of the first 2 samples per prompt (as the reward stage probes)
        probe = [i for g in data.groups for i in g[:2]]
        row["hacks"] = hack_probe([data.prompts[i] for i in probe],
                                  [data.responses[i] for i in probe],
                                  lambda ps, rs, s=scorer: s.score(ps, rs)[0].tolist(),
                                  gold_score, seed=0)
        rows.append(row)
        print(json.dumps(row))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
