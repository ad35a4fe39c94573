"""Tiered rollout and RM evolution's own figures in bench/economy/ (seed 001 §4.1,
seed 000 §3.4): computed in the job from the run's `rollouts` (debug texts), `rm_scores` and
`human_labels` rows before its work folder goes, saved in the result JSON under `tiers`, and
reported in BENCHMARKS.md by `report_section` (report.write_report calls it).

Per run (`job_figures`), every training sample judged by the setup's gold judge:
- Level-2 share (seed: < 7 %), escalations by trigger, human labels;
- bad-case catch rate: of the samples in the run's worst 10 % by gold ("gold-bad"), the share
  Level 2 re-scored (seed: 92 %); and the share of escalated samples that were gold-bad;
- the light RM's Spearman against gold over the run, per 20-step window, on every sample it
  scored (its `rm_scores` rows), with the RM versions live in the window: static (Level 0+2
  arm) against evolving (the RM evolution arm), swaps counted from the run's events.

    .venv/bin/python -m bench.economy --arms plain level02 rm_evolution --report /tmp/B.md
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

WINDOW_STEPS = 20
BAD_QUANTILE = 0.10


def _r(x, n=4):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else round(x, n)


def job_figures(work: Path, run_id: str, setup: dict, judge=None) -> dict:
    from rlhf.pipeline.models.judges import WorldGoldJudge, score_all
    from rlhf.pipeline.reward.onpolicy import spearman
    from rlhf.store.hashing import hex_key
    from rlhf.store.io import read_table

    judge = judge or WorldGoldJudge()
    rolls = [r for r in read_table("rollouts", work / "rollouts").to_pylist()
             if r["run_id"] == run_id and r["response_text"] is not None]
    texts = [r for r in rolls if r["scorer"] not in ("fallback",)]
    gold = score_all(judge, [r["prompt_text"] for r in texts], [r["response_text"] for r in texts])
    # rollouts hold the response's 64-bit key; rm_scores and human_labels its full hash
    key = {(r["step"], r["prompt_id"], r["response_key"]): g for r, g in zip(texts, gold)}
    floor = float(np.quantile(gold, BAD_QUANTILE)) if gold else None
    bad = [g <= floor for g in gold] if gold else []
    l2 = [r["tier"] == 2 for r in texts]
    n_bad, n_l2 = sum(bad), sum(l2)
    triggers: dict[str, int] = {}
    for r in texts:
        for f in r["flags"]:
            if f.startswith("l2_"):
                triggers[f[3:]] = triggers.get(f[3:], 0) + 1
    out = {"samples": len(texts), "level2": n_l2, "level2_share": _r(n_l2 / max(1, len(texts))),
           "triggers": triggers, "gold_bad_floor": _r(floor), "gold_bad": n_bad,
           "bad_caught": sum(b and e for b, e in zip(bad, l2)),
           "catch_rate": _r(sum(b and e for b, e in zip(bad, l2)) / n_bad) if n_bad else None,
           "escalated_bad_share": (_r(sum(b and e for b, e in zip(bad, l2)) / n_l2)
                                   if n_l2 else None),
           "gated": sum(r["scorer"] == "gated" for r in texts)}
    hl = work / "human_labels"
    if hl.is_dir():
        labels = [x for x in read_table("human_labels", hl).to_pylist() if x["run_id"] == run_id]
        out["human_labels"] = len(labels)
        # keyed by sample, not step: an RM check labels samples of its last few steps
        by_sample = {(k[1], k[2]): g for k, g in key.items()}
        pairs = [(x["score"], by_sample[(x["prompt_id"], hex_key(x["response_hash"]))])
                 for x in labels if (x["prompt_id"], hex_key(x["response_hash"])) in by_sample]
        out["human_vs_gold_spearman"] = (_r(spearman([a for a, _ in pairs], [b for _, b in pairs]))
                                         if len(pairs) >= 3 else None)
    scores = [s for s in read_table("rm_scores", work / "rm_scores").to_pylist()
              if s["run_id"] == run_id and s["rm_name"] == "light_rm"]
    win: dict[int, list] = {}
    for s in scores:
        g = key.get((s["step"], s["prompt_id"], hex_key(s["response_hash"])))
        if g is not None:
            win.setdefault((s["step"] - 1) // WINDOW_STEPS * WINDOW_STEPS + 1, []).append(
                (s["score"], g, s["rm_version"]))
    out["light_vs_gold_by_window"] = {
        str(k): {"n": len(v), "spearman": _r(spearman([a for a, _, _ in v], [b for _, b, _ in v])),
                 "rm_versions": len({x for _, _, x in v})} for k, v in sorted(win.items())}
    events = work / "events.jsonl"
    swaps = []
    if events.is_file():
        for line in events.read_text().splitlines():
            e = json.loads(line)
            if e.get("kind", e.get("event")) == "rm_swap":
                swaps.append({k: e.get(k) for k in ("step", "reason", "spearman", "reference",
                                                    "drop")})
    out["rm_swaps"] = swaps
    return out


def report_section(runs: dict, baseline: str) -> list[str]:
    """BENCHMARKS.md lines: per arm with `tiers` figures, mean ± sd over its seeds."""
    arms = {a: [r for r in rs if r.get("tiers")] for a, rs in runs.items()}
    arms = {a: rs for a, rs in arms.items() if rs}
    if not arms:
        return []

    def ms(rs, k):
        xs = [r["tiers"].get(k) for r in rs if r["tiers"].get(k) is not None]
        if not xs:
            return "-"
        return f"{np.mean(xs):.3f} ± {np.std(xs, ddof=1):.3f}" if len(xs) > 1 else f"{xs[0]:.3f}"

    lines = ["", "## Tiered rollout and RM evolution", "",
             "Every training sample judged by the gold judge (debug rollouts); gold-bad = the "
             f"run's worst {int(BAD_QUANTILE * 100)} % by gold. Level 2 re-scores with the strong "
             "RM (through the reward stage's score map onto the light scale); the light RM's "
             "Spearman vs gold is over every sample it scored in the window. Mean ± sd over "
             "seeds.", "",
             "| arm | seeds | Level-2 share | catch rate of gold-bad | escalated that were bad "
             "| gated | strong-RM calls | light-RM calls | human labels | RM swaps |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for a, rs in arms.items():
        calls = {k: np.mean([r["cost"].get(f"{k}_rm_calls", 0) for r in rs])
                 for k in ("strong", "light", "human")}
        lines.append(f"| {a} | {len(rs)} | {ms(rs, 'level2_share')} | {ms(rs, 'catch_rate')} | "
                     f"{ms(rs, 'escalated_bad_share')} | {ms(rs, 'gated')} | "
                     f"{calls['strong']:.0f} | {calls['light']:.0f} | {calls['human']:.0f} | "
                     f"{np.mean([len(r['tiers']['rm_swaps']) for r in rs]):.1f} |")
    lines += ["", "Light RM's Spearman vs gold by step window (mean over seeds):", "",
              "| arm | " + " | ".join(f"steps {k}+" for k in _windows(arms)) + " |",
              "|---|" + "---|" * len(_windows(arms))]
    for a, rs in arms.items():
        cells = []
        for k in _windows(arms):
            xs = [r["tiers"]["light_vs_gold_by_window"].get(k, {}).get("spearman") for r in rs]
            xs = [x for x in xs if x is not None]
            cells.append(f"{np.mean(xs):.3f}" if xs else "-")
        lines.append(f"| {a} | " + " | ".join(cells) + " |")
    trig = {}
    for a, rs in arms.items():
        for r in rs:
            for t, n in r["tiers"]["triggers"].items():
                trig.setdefault(a, {}).setdefault(t, []).append(n)
    if trig:
        lines += ["", "Escalations by trigger (a sample may meet several; mean per run): " + "; ".join(
            f"{a}: " + ", ".join(f"{t} {np.mean(v):.0f}" for t, v in sorted(d.items()))
            for a, d in trig.items())]
    return lines


def _windows(arms: dict) -> list[str]:
    ks = {k for rs in arms.values() for r in rs for k in r["tiers"]["light_vs_gold_by_window"]}
    return sorted(ks, key=int)
