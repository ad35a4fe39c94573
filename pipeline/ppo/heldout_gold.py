"""Held-out gold evaluation of a PPO run: the gold judge's scores of the SFT policy and of the
PPO policy on the same held-out prompts, with the same sampling (what `artifacts/metrics/ppo.json`
reports), sampled exactly as PPO samples (`generate.sampling_of(cfg)`; the eval stage and
bench/economy/ use the same settings). The judge is the one params.yaml's `judge:` section names
(pipeline/models/judges.py; the world's gold judge when none is given) and never trains anything.

    rlhf ppo ... --heldout-store artifacts/store     # evaluates after training
    python -c "from rlhf.pipeline.ppo.heldout_gold import gold_eval; \
from rlhf.pipeline.decode import Sampling; \
print(gold_eval('artifacts/models/sft', [('x', 'Why do leaves look green?')], Sampling(0.8, 0.95, 48)))"

Held-out prompts are every member of the eval-split clusters (pipeline/heldout_prompts.py), none of
which PPO (split "ppo") or the reward models (split "reward") saw.
"""

from __future__ import annotations

import math
from pathlib import Path


def gold_eval(policy_path: str | Path, prompts: list[tuple[str, str]], sampling,
              seed: int = 0, batch_size: int = 64, judge=None, per_prompt: bool = False,
              engine: str = "hf") -> dict:
    """One sampled response per prompt (pipeline/models/policy.sample: format_prompt, stop at eos) at
    `sampling` (generation.Sampling), scored by `judge` (a pipeline/models/judges.Judge or a plain
    (prompt, response) -> float; None: the world's gold judge):
    {n, gold_mean, gold_std, response_tokens_mean} (+ `scores`, in prompt order, if
    `per_prompt`). `engine`: the generation engine that samples (generation.get_generator);
    the ppo stage passes its own `ppo.engine`, so the held-out figure is sampled as PPO
    samples."""
    from rlhf.pipeline.models.judges import WorldGoldJudge, score_all
    from rlhf.pipeline.models.policy import load_policy, sample

    judge = judge if judge is not None else WorldGoldJudge()
    model, tok = load_policy(policy_path)
    texts = [t for _, t in prompts]
    outs = sample(model, tok, texts, n=1, max_new_tokens=sampling.max_new_tokens,
                  temperature=sampling.temperature, top_p=sampling.top_p, seed=seed,
                  batch_size=batch_size, engine=engine)
    scores = score_all(judge, texts, [o[0].response for o in outs])
    n = len(scores)
    mean = sum(scores) / n if n else float("nan")
    std = math.sqrt(sum((x - mean) ** 2 for x in scores) / (n - 1)) if n > 1 else 0.0
    res = {"n": n, "gold_mean": round(mean, 4), "gold_std": round(std, 4),
           "response_tokens_mean": round(sum(o[0].n_tokens for o in outs) / max(n, 1), 2)}
    if per_prompt:
        res["scores"] = [float(x) for x in scores]
    return res


def compare(sft_path: str | Path, ppo_path: str | Path, store_root: str | Path, sampling,
            seed: int, judge=None, engine: str = "hf") -> dict:
    """SFT vs PPO policy on the held-out prompts of `store_root` (pool + similar tables), both
    sampled alike (the same seed: a paired comparison), scored by `judge` (None: world gold);
    the report names the judge."""
    from rlhf.pipeline.decode import resolve_engine
    from rlhf.pipeline.heldout_prompts import held_out_prompts
    from rlhf.pipeline.models.judges import WorldGoldJudge

    prompts = held_out_prompts(store_root)
    if not prompts:
        raise ValueError(f"no held-out (eval-split) prompts in {store_root}")
    judge = judge if judge is not None else WorldGoldJudge()
    # gold_eval samples on the CPU (load_policy): the report names the engine `auto` resolved to
    engine = resolve_engine(engine, "cpu")
    sft = gold_eval(sft_path, prompts, sampling, seed, judge=judge, engine=engine)
    ppo = gold_eval(ppo_path, prompts, sampling, seed, judge=judge, engine=engine)
    return {"judge": judge.name, "n_prompts": len(prompts), "sft": sft, "ppo": ppo,
            "gold_gain": round(ppo["gold_mean"] - sft["gold_mean"], 4),
            "sampling": {"temperature": sampling.temperature, "top_p": sampling.top_p,
                         "max_new_tokens": sampling.max_new_tokens, "seed": seed,
                         "engine": engine}}


def rollouts_used(rollouts: str | Path, run_id: str) -> int:
    """Rows of the run in the `rollouts` table (every generated response, fallbacks included)."""
    import pyarrow.parquet as pq
    from rlhf.store.rollouts import run_shards

    return sum(pq.ParquetFile(p).metadata.num_rows for _, _, p in run_shards(rollouts, run_id))


def escalated_rollouts(rollouts: str | Path, run_id: str) -> int:
    """Rows of the run re-scored by the strong RM (tier 2, seed 001 §4.1 Level 2)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from rlhf.store.rollouts import run_shards

    return sum(int(pc.sum(pc.equal(pq.read_table(p, columns=["tier"])["tier"], 2)).as_py() or 0)
               for _, _, p in run_shards(rollouts, run_id))


def run_report(cfg, last: dict, policy: str | Path, out: str | Path, rollouts: str | Path,
               run_id: str, heldout_store: str | Path | None = None, judge=None) -> dict:
    """What `rlhf ppo` reports of a finished run: the six seed metrics of its last step, the
    rollouts it used and escalated, and, with a judge and a held-out store, the held-out gold
    of the SFT policy against the PPO policy (`compare`, sampled as PPO samples)."""
    from rlhf.pipeline.ppo.generate import sampling_of
    from rlhf.pipeline.ppo.records import CSV_COLUMNS

    report = {"ppo": {k: last.get(k) for k in CSV_COLUMNS},
              "rollouts": rollouts_used(rollouts, run_id),
              "escalated_rollouts": escalated_rollouts(rollouts, run_id)}
    if judge is not None and heldout_store is not None:
        report["heldout"] = compare(policy, Path(out) / "policy", heldout_store, sampling_of(cfg),
                                    cfg.eval_seed, judge, engine=cfg.engine)
    return report
