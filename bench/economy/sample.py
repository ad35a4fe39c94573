"""Rollout economy inside a sample in the benchmark (bench/economy): what a job measures beside gold
and tokens (the `Probe`), and the report's tables of it (`section`, called by write_report).

The Probe is a post-scoring hook that runs after every other one and changes nothing the run
does (it saves and restores the torch RNG, spends nothing in the accounting): per step it scores
every row's final text with the world's gold judge, finishes a copy of each pruned sample offline
with the same policy (no hooks, the remaining token budget) to know its gold and the tokens the
stop saved, and keeps the first draw's reward and gold of each resampled row. A job's result json
gets the summary under "sample_economy".

Definitions used in the report:
- useful-rollout share: rollouts that reach the update and are not pruned, over rollouts started
  (first draws plus regenerations); for an arm without the probe, rollouts trained / started;
- pruning precision against gold: of the pruned samples, finished offline, the share whose gold
  is below the median gold of the same step's unpruned samples ("gold-bad"); the same share
  among the unpruned samples themselves (the base rate, about 0.5) is beside it;
- resampling bias: mean light-RM reward and gold of the resampled rows' first draws, of their
  regenerations, and of the rows never resampled.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import torch
from rlhf.pipeline.ppo.hooks import HookBase


class Probe(HookBase):
    name = "economy_probe"

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    @torch.no_grad()
    def after_score(self, ctx, r, cost) -> None:
        from rlhf.pipeline.ppo.features.sample_economy import continue_from_prefix
        from rlhf.pipeline.ppo.generate import sampling_of
        from rlhf.pipeline.models.text import response_of
        from rlhf.pipeline.world.judge import gold_score

        rng = torch.get_rng_state()
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        try:
            tok = ctx.tokenizer
            pruned = r.extras.get("pruned") or [False] * len(r)
            resampled = r.extras.get("resampled") or [False] * len(r)
            first = r.extras.get("first_draw") or {}
            rows = [i for i, p in enumerate(pruned) if p]
            finished: dict[int, tuple[float, int]] = {}
            if rows:
                pre = [r.response[i][r.response_mask[i]].tolist() for i in rows]
                with ctx.generation() as model:
                    model.eval()
                    cont = continue_from_prefix(model, tok, r, rows, pre,
                                                sampling_of(ctx.cfg), r.query.device)
                for i, p, c in zip(rows, pre, cont):
                    text = response_of(tok.decode(p + c, skip_special_tokens=True))
                    finished[i] = (gold_score(r.prompts[i], text), len(c))
            out = []
            for i in range(len(r)):
                row = {"p": bool(pruned[i]), "s": bool(resampled[i]), "v": bool(r.valid[i]),
                       "rw": float(r.scores[i]) if bool(r.valid[i]) else None,
                       "g": gold_score(r.prompts[i], r.responses[i]),
                       "gen": int(r.extras["generated_tokens"][i])}
                if i in finished:
                    row["gf"], row["saved"] = finished[i]
                if i in first:
                    row["r0"] = first[i]["reward"]
                    row["g0"] = gold_score(r.prompts[i], first[i]["response"])
                out.append(row)
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"step": ctx.step, "rows": out}) + "\n")
        finally:
            torch.set_rng_state(rng)
            if cuda is not None:
                torch.cuda.set_rng_state_all(cuda)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def summarize(path: Path, cost: dict) -> dict:
    """The run's sample-economy figures from the probe's lines and the run's cost totals."""
    steps = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    rows = [row for s in steps for row in s["rows"]]
    bad, base = [], []
    for s in steps:
        kept = [x["g"] for x in s["rows"] if not x["p"] and x["v"]]
        if not kept:
            continue
        med = statistics.median(kept)
        base += [g < med for g in kept]
        bad += [x["gf"] < med for x in s["rows"] if x["p"] and "gf" in x]
    pruned = [x for x in rows if x["p"]]
    res = [x for x in rows if x["s"]]
    never = [x for x in rows if not x["s"] and not x["p"] and x["v"]]
    started = cost.get("rollouts_started") or len(rows)
    saved = sum(x.get("saved", 0) for x in pruned)
    generated = cost.get("tokens_generated", 0)
    return {
        "rows": len(rows), "rollouts_started": started,
        "useful": sum(x["v"] and not x["p"] for x in rows),
        "useful_share": sum(x["v"] and not x["p"] for x in rows) / max(started, 1),
        "pruned": len(pruned), "pruned_share": len(pruned) / max(len(rows), 1),
        "pruned_tokens": sum(x["gen"] for x in pruned),
        "tokens_saved": saved,
        "tokens_saved_share": saved / max(generated + saved, 1),
        "precision": _mean([float(b) for b in bad]), "base_rate": _mean([float(b) for b in base]),
        "gold_pruned_finished": _mean([x.get("gf") for x in pruned]),
        "gold_unpruned": _mean([x["g"] for x in rows if not x["p"] and x["v"]]),
        "resampled": len(res), "resampled_share": len(res) / max(len(rows), 1),
        "tokens_regenerated": cost.get("tokens_regenerated", 0),
        "reward_first": _mean([x.get("r0") for x in res]),
        "reward_regen": _mean([x["rw"] for x in res]),
        "gold_first": _mean([x.get("g0") for x in res]),
        "gold_regen": _mean([x["g"] for x in res]),
        "reward_never": _mean([x["rw"] for x in never]),
        "gold_never": _mean([x["g"] for x in never]),
        # what the update saw against what the first draws were (the selection's bias)
        "batch_reward_first": _mean([x.get("r0", x["rw"]) for x in rows if x["v"]]),
        "batch_reward_used": _mean([x["rw"] for x in rows if x["v"]]),
        "batch_gold_first": _mean([x.get("g0", x["g"]) for x in rows if x["v"]]),
        "batch_gold_used": _mean([x["g"] for x in rows if x["v"]]),
        "steps": len(steps),
    }


def _f(x, d=3, pct=False):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{100 * x:.1f} %" if pct else f"{x:.{d}f}"


def _avg(rs, key):
    vals = [r["sample_economy"].get(key) for r in rs if r["sample_economy"].get(key) is not None]
    return sum(vals) / len(vals) if vals else None


def pairwise(runs: dict[str, list[dict]], sft_gold: float, baseline: str,
             arms: tuple[str, ...]) -> list[str]:
    """Each arm against `baseline` alone, at the pair's own equal tokens (the fewer final tokens
    of the two arms' runs), not at the fewest of every arm in the report: gold there, and the
    tokens the arm needs to reach the baseline's mean gold there, as a ratio with its bootstrap
    interval (stats.py)."""
    import numpy as np

    from . import stats as st

    if baseline not in runs:
        return []
    out = ["", (f"Pairwise against `{baseline}` at the pair's own equal tokens (the fewer final "
                "tokens of the two arms; the table above compares every arm at the fewest of "
                "any arm in the report):"), "",
           (f"| arm | seeds | equal tokens | gold there: arm / {baseline} | gain over SFT: arm / "
            f"{baseline} | tokens to {baseline}'s gold there: ratio [95 % CI] | to 95 % of it |"),
           "|---|---|---|---|---|---|---|"]

    def points(res):
        return [(0, sft_gold)] + [(p["tokens"], p["gold_mean"]) for p in res["points"]]

    for arm in arms:
        if arm not in runs or arm == baseline:
            continue
        t_eq = min(r["points"][-1]["tokens"] for r in runs[arm] + runs[baseline])
        grid = np.unique(np.concatenate([np.linspace(0, t_eq, 401), [t_eq]]))
        i_eq = int(np.searchsorted(grid, t_eq))
        base = np.array([st.curve(points(r), grid) for r in runs[baseline]])
        c = np.array([st.curve(points(r), grid) for r in runs[arm]])
        def ratio(fraction):
            r = st.ratio_with_interval(grid, base, c, i_eq, fraction)
            hi = "∞" if not math.isfinite(r["ci_high"]) else f"{r['ci_high']:.2f}"
            return (f"{r['ratio']:.2f} [{r['ci_low']:.2f}, {hi}]"
                    if math.isfinite(r["tokens_arm"]) else "not reached")

        g_arm, g_base = float(np.nanmean(c[:, i_eq])), float(np.nanmean(base[:, i_eq]))
        out.append(f"| {arm} | {len(c)} | {t_eq:,.0f} | {g_arm:.4f} / {g_base:.4f} | "
                   f"{g_arm - sft_gold:+.3f} / {g_base - sft_gold:+.3f} | {ratio(1.0)} | "
                   f"{ratio(0.95)} |")
    return out + [""]


SAMPLE_ARMS = ("seed", "pruning", "resampling", "pruning_resampling", "pruning_literal",
               "pruning_literal_truncation", "pruning_norep", "pruning_norep_truncation")


def section(runs: dict[str, list[dict]], sft_gold: float | None = None,
            baseline: str = "plain") -> list[str]:
    """The report's lines for the sample-economy arms (empty when none ran)."""
    lines = ["### Inside a sample: pruning and resampling", "",
             ("Definitions: bench/economy/sample.py. *useful* = rollouts that reach the update and "
              "are not pruned, over rollouts started (regenerations included); *tokens saved* = "
              "what the pruned samples would still have generated (a copy finished offline by "
              "the same policy), over generated + saved; *precision* = share of pruned samples "
              "whose finished gold is below the median gold of the same step's unpruned samples "
              "(base rate: that share among the unpruned). Means over seeds."), "",
             ("| arm | seeds | useful share | pruned share | tokens saved | precision (base rate) "
              "| gold: pruned finished / unpruned | resampled share | regenerated tokens |"),
             "|---|---|---|---|---|---|---|---|---|"]
    any_row = False
    for arm, rs in runs.items():
        with_probe = [r for r in rs if r.get("sample_economy")]
        if not with_probe:
            cost = [r["cost"] for r in rs]
            share = _mean([c["rollouts_trained"] / max(c["rollouts_started"], 1) for c in cost
                           if c.get("rollouts_started")])
            lines.append(f"| {arm} | {len(rs)} | {_f(share, pct=True)} | – | – | – | – | – | – |")
            continue
        any_row = True
        lines.append(
            f"| {arm} | {len(with_probe)} | {_f(_avg(with_probe, 'useful_share'), pct=True)} | "
            f"{_f(_avg(with_probe, 'pruned_share'), pct=True)} | "
            f"{_f(_avg(with_probe, 'tokens_saved'), 0)} "
            f"({_f(_avg(with_probe, 'tokens_saved_share'), pct=True)}) | "
            f"{_f(_avg(with_probe, 'precision'), 2)} ({_f(_avg(with_probe, 'base_rate'), 2)}) | "
            f"{_f(_avg(with_probe, 'gold_pruned_finished'))} / "
            f"{_f(_avg(with_probe, 'gold_unpruned'))} | "
            f"{_f(_avg(with_probe, 'resampled_share'), pct=True)} | "
            f"{_f(_avg(with_probe, 'tokens_regenerated'), 0)} |")
    if not any_row:
        return []
    lines += ["", "Resampling bias (means over seeds; reward = light RM, gold = the world's judge):",
              "", ("| arm | resampled rows: reward first draw → regenerated | gold first → "
                   "regenerated | rows never resampled: reward / gold | batch reward first → "
                   "used | batch gold first → used |"), "|---|---|---|---|---|---|"]
    for arm, rs in runs.items():
        w = [r for r in rs if r.get("sample_economy") and r["sample_economy"]["resampled"]]
        if not w:
            continue
        lines.append(
            f"| {arm} | {_f(_avg(w, 'reward_first'))} → {_f(_avg(w, 'reward_regen'))} | "
            f"{_f(_avg(w, 'gold_first'))} → {_f(_avg(w, 'gold_regen'))} | "
            f"{_f(_avg(w, 'reward_never'))} / {_f(_avg(w, 'gold_never'))} | "
            f"{_f(_avg(w, 'batch_reward_first'))} → {_f(_avg(w, 'batch_reward_used'))} | "
            f"{_f(_avg(w, 'batch_gold_first'))} → {_f(_avg(w, 'batch_gold_used'))} |")
    if sft_gold is not None:
        lines += pairwise(runs, sft_gold, baseline, SAMPLE_ARMS)
    return lines + [""]
