"""The reward stage's report: what the trained RMs are worth, measured after they are saved.

Annotator drift by time window; held-out pair margins and accuracies (also what calibration
uses); fresh samples of unseen prompts scored by each RM against the gold judge (Spearman,
light vs strong, sizes and the speed ratio, how often the confidence gate passes); the
on-policy figures at PPO's sampling settings with the strong-to-light score map; and an RM
trained and tested on the external (hh-rlhf) pairs. Every function takes the trained scorers;
none trains the stage's RMs (reward/stage.py does, and calls the held-out, drift and external
steps; the fresh and on-policy figures are `make report`'s, reward/figures.py).
"""

from __future__ import annotations

import math
import random
import time
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlhf.pipeline.reward.onpolicy import spearman

if TYPE_CHECKING:
    from rlhf.pipeline.reward.stage import RewardConfig


def _accuracy(margins) -> float:
    return float((margins > 0).float().mean()) if margins.numel() else float("nan")


def annotator_drift(rows: Sequence[dict], window_days: float) -> dict[str, Any]:
    """Mean label by annotator by time window, and each annotator's drift per day.

    The drift is the least-squares slope of (label - gold score) against days since the first
    label: the gold judge is fixed, so a slope is the annotator moving, not the responses."""
    rows = [r for r in rows if r["source"] == "annotator" and r["labeled_at"] is not None]
    if not rows:
        return {"windows": [], "drift_per_day": {}}
    t0 = min(r["labeled_at"] for r in rows)
    cells: dict[tuple[str, int], list[dict]] = defaultdict(list)
    per_annotator: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in rows:
        days = (r["labeled_at"] - t0).total_seconds() / 86400
        cells[(r["annotator_id"], int(days // window_days))].append(r)
        if r["gold_score"] is not None:
            per_annotator[r["annotator_id"]].append((days, r["score"] - r["gold_score"]))
    windows = []
    for (ann, w), rs in sorted(cells.items()):
        windows.append({
            "annotator_id": ann, "window": w, "n": len(rs),
            "mean_label": sum(r["score"] for r in rs) / len(rs),
            "mean_gold": (sum(r["gold_score"] for r in rs) / len(rs)
                          if all(r["gold_score"] is not None for r in rs) else None),
        })
    drift = {}
    for ann, pts in sorted(per_annotator.items()):
        if len(pts) < 3:
            continue
        mx = sum(x for x, _ in pts) / len(pts)
        my = sum(y for _, y in pts) / len(pts)
        sxx = sum((x - mx) ** 2 for x, _ in pts)
        drift[ann] = (sum((x - mx) * (y - my) for x, y in pts) / sxx) if sxx > 0 else 0.0
    return {"windows": windows, "drift_per_day": drift}


def _gold_pairs(pairs: Sequence[dict]) -> list[dict]:
    """The pairs re-ordered by the gold judge (gold ties dropped)."""
    out = []
    for p in pairs:
        a, b = p.get("gold_chosen"), p.get("gold_rejected")
        if a is None or b is None or a == b:
            continue
        out.append(p if a > b else {**p, "chosen": p["rejected"], "rejected": p["chosen"]})
    return out


def _pair_margins(scorer, pairs: Sequence[dict]):
    """[members, n_pairs] member reward margins chosen - rejected."""
    prompts = [p["prompt"] for p in pairs]
    return (scorer.member_rewards(prompts, [p["chosen"] for p in pairs])
            - scorer.member_rewards(prompts, [p["rejected"] for p in pairs]))


def _timed(fn, repeats: int = 2) -> tuple[Any, float]:
    best, out = math.inf, None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return out, best


def fresh_samples(cfg: RewardConfig, policy, tokenizer, eval_prompts: Sequence[str],
                  demos_path) -> tuple[list[str], list[str], list[bool]]:
    """(prompts, responses, is_policy_sample): `eval_k` fresh policy samples per unseen prompt,
    plus `eval_demo_candidates` unseen demonstrations of its topic (the quality range the RM
    must order; seed 001 §5.1 tests the RM on fresh, unseen prompts)."""
    from rlhf.pipeline.models.policy import sample

    fresh = sample(policy, tokenizer, list(eval_prompts), n=cfg.eval_k,
                   max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                   seed=cfg.seed + 2, batch_size=cfg.batch_size, engine=cfg.engine)
    prompts = [p for p, ss in zip(eval_prompts, fresh) for _ in ss]
    responses = [s.response for ss in fresh for s in ss]
    is_policy = [True] * len(responses)
    if cfg.eval_demo_candidates:
        if demos_path is None:
            raise ValueError("reward.eval_demo_candidates needs --demos")
        from rlhf.pipeline.preferences import demo_candidates

        extra = demo_candidates(eval_prompts, demos_path, cfg.eval_demo_candidates, cfg.seed + 7)
        for p, e in zip(eval_prompts, extra):
            prompts += [p] * len(e)
            responses += e
            is_policy += [False] * len(e)
    return prompts, responses, is_policy


def fresh_figures(cfg: RewardConfig, strong, light, policy, ptok, eval_prompts: Sequence[str],
                  demos_path, judge, log) -> dict[str, Any]:
    """Step 5: fresh samples of unseen prompts: each RM against the judge, light vs strong,
    sizes and the speed ratio, the confidence gate."""
    from rlhf.pipeline.models.judges import score_all

    log(f"sampling {len(eval_prompts)} x {cfg.eval_k} fresh responses on unseen prompts")
    f_prompts, f_resps, f_policy = fresh_samples(cfg, policy, ptok, eval_prompts, demos_path)
    gold = score_all(judge, f_prompts, f_resps)
    memo, strong.memo = strong.memo, {}  # an empty memo: the timing is of real scoring
    (s_out, t_strong) = _timed(lambda: strong(f_prompts, f_resps), repeats=1)
    (l_out, t_light) = _timed(lambda: light(f_prompts, f_resps))
    strong.memo.update(memo)
    s_rew, s_conf = s_out
    l_rew, _ = l_out
    s_min, _ = strong(f_prompts, f_resps, aggregation="min")
    gold_ref = sum(gold) / len(gold) if gold else 0.0
    sign_ok = [(float(r) > 0) == (g > gold_ref) for r, g in zip(s_rew, gold)]
    pol = [i for i, f in enumerate(f_policy) if f]
    return {
        "n_fresh_samples": len(f_resps),
        "n_fresh_policy_samples": len(pol),
        "spearman_strong_vs_gold": spearman(s_rew.tolist(), gold),
        "spearman_strong_vs_gold_policy_only": spearman([float(s_rew[i]) for i in pol],
                                                        [gold[i] for i in pol]),
        "gold_mean_fresh_policy": sum(gold[i] for i in pol) / len(pol) if pol else None,
        "spearman_strong_min_vs_gold": spearman(s_min.tolist(), gold),
        "spearman_members_vs_gold": [spearman(m.tolist(), gold)
                                     for m in strong.member_rewards(f_prompts, f_resps)],
        "spearman_light_vs_gold": spearman(l_rew.tolist(), gold),
        "spearman_light_vs_strong": spearman(l_rew.tolist(), s_rew.tolist()),
        "overfit_flag": spearman(s_rew.tolist(), gold) < 0.7,  # seed 001 §5.1
        "strong_params": strong.n_params,
        "light_params": light.n_params,
        "size_ratio": strong.n_params / light.n_params,
        "strong_seconds": round(t_strong, 4),
        "light_seconds": round(t_light, 4),
        "speed_ratio": t_strong / t_light if t_light > 0 else float("nan"),
        "gate_pass_share": float((s_conf >= cfg.confidence_gate).float().mean())
        if len(s_conf) else None,
        "sign_accuracy_by_confidence": _sign_bins(s_conf.tolist(), sign_ok),
    }


def onpolicy_headlines(onpolicy: dict[str, Any]) -> dict[str, Any]:
    """The on-policy figures the metrics file lists (HEADLINES in cli/common.py)."""
    out = {}
    for rm in ("strong", "light"):
        out[f"spearman_{rm}_vs_gold_onpolicy"] = onpolicy[rm]["spearman"]
        out[f"spearman_{rm}_vs_gold_onpolicy_within_prompt"] = onpolicy[rm][
            "spearman_within_prompt"]
        out[f"hack_agreement_{rm}"] = onpolicy[rm]["hacks"]["all"]["agreement"]
    return out


def onpolicy_figures(cfg: RewardConfig, policy, tokenizer, prompts: Sequence[str], strong, light,
                     judge, sampling, log, score_map=None) -> dict[str, Any]:
    """Each RM's Spearman vs gold on `onpolicy_k` fresh SFT samples per ppo-split prompt at
    PPO's sampling settings, overall and within a prompt (pipeline/reward/onpolicy.py); and how
    the strong-to-light `score_map` the reward stage fitted (pipeline/reward/score_map.py) fits
    these samples, which it was not fitted on."""
    from rlhf.pipeline.decode import Sampling
    from rlhf.pipeline.models.policy import engine_on
    from rlhf.pipeline.reward.onpolicy import onpolicy_report, onpolicy_set

    sampling = sampling or Sampling(cfg.temperature, 1.0, cfg.max_new_tokens)
    log(f"sampling {len(prompts)} x {cfg.onpolicy_k} responses as PPO samples them "
        f"(T {sampling.temperature}, top-p {sampling.top_p}) for the on-policy Spearman")
    data = onpolicy_set(policy, tokenizer, prompts, cfg.onpolicy_k, sampling.temperature,
                        sampling.top_p, sampling.max_new_tokens, cfg.seed + 3, cfg.batch_size,
                        judge, engine=cfg.engine)
    out: dict[str, Any] = {"n_prompts": len(prompts), "k": cfg.onpolicy_k,
                           "sampling": {"temperature": sampling.temperature,
                                        "top_p": sampling.top_p,
                                        "max_new_tokens": sampling.max_new_tokens,
                                        "engine": engine_on(cfg.engine, policy)},
                           "gold_mean": sum(data.gold) / max(len(data), 1)}
    from rlhf.pipeline.reward.augment import hack_probe

    probe = [i for g in data.groups for i in g[:2]]  # 2 samples a prompt: the probe's budget
    probe_p, probe_r = [data.prompts[i] for i in probe], [data.responses[i] for i in probe]
    scored = {}
    for name, scorer in (("strong", strong), ("light", light)):
        rewards, _ = scorer(data.prompts, data.responses)
        scored[name] = [float(x) for x in rewards]
        out[name] = onpolicy_report(scored[name], data)
        # does the RM prefer a hacked twin of PPO's own samples (a repeat, keyword salad, a
        # cut) over the sample, where the judge does not?
        out[name]["hacks"] = hack_probe(probe_p, probe_r,
                                        lambda ps, rs, s=scorer: s(ps, rs)[0].tolist(), judge,
                                        seed=cfg.seed + 9)
    if score_map is not None and len(data):
        out["score_map"] = score_map.report(scored["strong"], scored["light"])
    return out


def _sign_bins(conf: Sequence[float], ok: Sequence[bool],
               edges=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0001)) -> list[dict]:
    """Per confidence bin: how often the reward's sign (vs the baseline) matches gold's side of
    the gold mean, i.e. whether the per-sample confidence PPO gates on is earned."""
    rows = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = [o for c, o in zip(conf, ok) if lo <= c < hi]
        rows.append({"lo": lo, "hi": min(hi, 1.0), "n": len(sel),
                     "accuracy": sum(sel) / len(sel) if sel else None})
    return rows


def external_accuracy(cfg: RewardConfig, rows: Sequence[dict], init: str, tok, strong, log,
                      checkpoints: Path | None = None) -> dict[str, Any]:
    """An RM trained on the external sources' train pairs, tested on their held-out pairs; and
    the strong (task) RM's zero-shot accuracy on the same held-out pairs. With `checkpoints`,
    the side RM is kept there once trained and a rerun after a kill loads it (reward/keep.py)."""
    from rlhf.pipeline.config import effective
    from rlhf.pipeline.preferences import expand_pairs
    from rlhf.pipeline.reward.keep import fingerprint, kept_or_trained
    from rlhf.pipeline.reward.scorer import RMEnsemble
    from rlhf.pipeline.reward.train import RmTrainConfig, init_rm, train_rm

    out: dict[str, Any] = {}
    ext = [r for r in rows if r["source"] in cfg.external_sources]
    if not ext:
        return {"skipped": "no external rankings in the preferences table (realdata absent?)"}
    pairs = expand_pairs(ext)
    train = [p for p in pairs if p["split"] == "train"]
    held = [p for p in pairs if p["split"] == "heldout"]
    if cfg.external_train_pairs:
        train = sorted(train, key=lambda p: p["prompt_id"] + p["chosen"][:20])
        train = random.Random(cfg.seed).sample(train, min(len(train), cfg.external_train_pairs))
    if not train or not held:
        return {"skipped": "external pairs lack a train or a held-out part"}
    t0 = time.perf_counter()
    tcfg = RmTrainConfig(epochs=cfg.external_epochs, learning_rate=cfg.train.learning_rate,
                         batch_size=cfg.train.batch_size, max_length=cfg.external_max_length,
                         warmup_ratio=cfg.train.warmup_ratio, weight_decay=cfg.train.weight_decay,
                         center_rewards_coefficient=cfg.train.center_rewards_coefficient)

    def fit():
        log(f"training an RM on {len(train)} external pairs ({', '.join(cfg.external_sources)})")
        model, _ = train_rm(init_rm(init, seed=cfg.seed), tok, train, tcfg, seed=cfg.seed,
                            precision=strong.precision)
        return model, {}

    inputs = fingerprint({"train": effective(tcfg), "seed": cfg.seed, "init": init,
                          "precision": strong.precision, "pairs": train})
    model, _, _ = kept_or_trained(checkpoints, "external", inputs, fit, log, "external side RM")
    ext_scorer = RMEnsemble([model], tok, [0.0], 1.0, "mean", cfg.external_max_length,
                            cfg.batch_size, precision=strong.precision)
    for source in cfg.external_sources:
        h = [p for p in held if p["source"] == source]
        if not h:
            continue
        out[source] = {
            "n_train_pairs": sum(p["source"] == source for p in train),
            "n_test_pairs": len(h),
            "accuracy": _accuracy(_pair_margins(ext_scorer, h)[0]),
            "strong_rm_zero_shot_accuracy": _accuracy(_pair_margins(strong, h).mean(0)),
        }
    out["train_seconds"] = round(time.perf_counter() - t0, 1)
    return out


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, datetime):
        return x.isoformat()
    return x
