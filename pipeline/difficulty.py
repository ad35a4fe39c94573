"""Difficulty scores 0-10 per pool prompt, and the stratified batch sampler PPO draws batches with.

Seed 000 §4.2 layer three: the baseline (SFT) policy answers every pool prompt once; from the
response length (tokens), the standard deviation of its token log-probabilities and the reward
model's score, a weighted composite scaled to 0-10 is the prompt's difficulty, bucketed
low 0-3 / mid 4-6 / high 7-10. Seed 000 §3.1 prompt diversity: every rollout batch covers every
difficulty bucket and every topic cluster, as evenly as the pool allows (`StratifiedSampler`,
pipeline/samplers.py; this stage reports its coverage on the new table).

    rlhf difficulty --pool artifacts/store/pool --policy artifacts/models/sft \
        --reward-model artifacts/models/rm_strong --out artifacts/store/difficulty \
        --metrics artifacts/metrics/difficulty.json

The composite and the buckets are pure (numpy only); the stage's `run` imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from rlhf.pipeline import ranges
from rlhf.pipeline.samplers import coverage, sampler_from_table

BUCKETS: tuple[str, ...] = ("low", "mid", "high")


@dataclass(frozen=True)
class DifficultyConfig:
    """params.yaml `difficulty`: weights of the composite and the baseline's generation."""

    w_length: float = 1.0  # weight of the response length (longer = harder)
    w_logprob_std: float = 1.0  # weight of the std of token log-probs (policy unsure = harder)
    w_rm: float = 1.0  # weight of the RM score (lower score = harder)
    clip_quantile: float = 0.05  # each feature is min-max scaled between its q and 1-q quantiles
    max_new_tokens: int = 48
    temperature: float = 1.0  # the baseline samples, so log-probs show its uncertainty
    top_p: float = 1.0
    batch_size: int = 64  # generation / scoring batch
    # the rollout engine that samples (pipeline/decode get_generator): "native" (a stopped row
    # leaves the batch; the same distribution as "hf"), "hf" (model.generate) or "auto" (per device,
    # the fastest exact engine measured on that device kind: native on a CPU, hf on CUDA until the
    # static step's GPU figures exist, ppo.engine says why; recorded as resolved)
    engine: Literal["auto", "hf", "native"] = "native"
    seed: int = 0
    sampler_batch_size: int = 16  # the sampler's default batch size in the coverage report

    def __post_init__(self):
        ranges.check_fields("difficulty", self)
        if self.w_length + self.w_logprob_std + self.w_rm <= 0:
            raise ValueError("at least one weight must be > 0")


# ---------------------------------------------------------------------------------------------
# The composite (pure)


def scale_feature(values: Sequence[float], clip_quantile: float = 0.0) -> np.ndarray:
    """Min-max scale to [0, 1] between the q and 1-q quantiles (clipped); constant -> 0.5."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return x
    lo, hi = np.quantile(x, [clip_quantile, 1.0 - clip_quantile])
    if hi - lo <= 1e-12:
        return np.full_like(x, 0.5)
    return np.clip((x - lo) / (hi - lo), 0.0, 1.0)


def difficulty_scores(lengths: Sequence[float], logprob_stds: Sequence[float],
                      rm_scores: Sequence[float], w_length: float = 1.0,
                      w_logprob_std: float = 1.0, w_rm: float = 1.0,
                      clip_quantile: float = 0.0) -> np.ndarray:
    """Difficulty in [0, 10] per prompt: 10 * weighted mean of the scaled features.

    Long responses, spread-out token log-probs (the policy is unsure) and a low RM score all make
    a prompt harder, so the RM score enters as 1 - scaled score. The composite is then min-max
    scaled over the pool, so the easiest prompt scores 0 and the hardest 10 (seed 000 §4.2: 0-10).
    """
    n = len(lengths)
    if not (len(logprob_stds) == len(rm_scores) == n):
        raise ValueError("lengths, logprob_stds and rm_scores must have the same length")
    if n == 0:
        return np.zeros(0)
    weights = np.array([w_length, w_logprob_std, w_rm], dtype=np.float64)
    if (weights < 0).any() or weights.sum() <= 0:
        raise ValueError("weights must be >= 0 with a positive sum")
    feats = np.stack([
        scale_feature(lengths, clip_quantile),
        scale_feature(logprob_stds, clip_quantile),
        1.0 - scale_feature(rm_scores, clip_quantile),
    ])
    composite = weights @ feats / weights.sum()
    return 10.0 * scale_feature(composite, 0.0) if np.ptp(composite) > 1e-12 else np.full(n, 5.0)


def bucket_of(score: float) -> str:
    """low 0-3, mid 4-6, high 7-10 (seed 000 §4.2), on the score rounded half up to an integer."""
    level = int(np.floor(float(score) + 0.5))
    if level <= 3:
        return "low"
    if level <= 6:
        return "mid"
    return "high"


# ---------------------------------------------------------------------------------------------
# The stage


def _pool_rows(pool_dir, demos_path) -> tuple[list[dict[str, Any]], str]:
    """Pool prompts (prompt_id, text, split, topic_cluster), or the demonstrations' prompts with
    their topic as the cluster when there is no pool."""
    if pool_dir is not None and Path(pool_dir).is_dir():
        from rlhf.store.io import read_table

        rows = read_table("pool", pool_dir).select(
            ["prompt_id", "text", "split", "topic_cluster"]).to_pylist()
        return sorted(rows, key=lambda r: r["prompt_id"]), "pool"
    if demos_path is None:
        raise ValueError("give --pool (a pool table folder) or --demos")
    from rlhf.pipeline.models.text import clean
    from rlhf.pipeline.sft import read_demonstrations
    from rlhf.store.hashing import content_hash

    topic_of: dict[str, str] = {}
    for r in read_demonstrations(demos_path):
        topic_of.setdefault(clean(r["prompt"]), str(r.get("topic", "")))
    topics = sorted(set(topic_of.values()))
    rows = [{"prompt_id": content_hash(t), "text": t, "split": "demonstrations",
             "topic_cluster": topics.index(topic)} for t, topic in topic_of.items()]
    return sorted(rows, key=lambda r: r["prompt_id"]), "demonstrations"


def _draw(cfg: DifficultyConfig, model, tok, texts: list[str], batches, progress, cost: dict):
    from rlhf.pipeline.models.policy import sample

    return sample(model, tok, texts, n=1, max_new_tokens=cfg.max_new_tokens,
                  temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed,
                  batch_size=cfg.batch_size, progress=progress, engine=cfg.engine, cost=cost,
                  batches=batches)


def _draw_in_worker(cfg: DifficultyConfig, policy_dir: str, texts: list[str],
                    batches: list[int], compute=None) -> tuple[list[list], dict]:
    """A worker process's share of `baseline_samples`: the policy loaded here, `batches` drawn.
    -> (samples per prompt, [] outside the share; their counted forwards)"""
    from rlhf.pipeline.models.policy import load_policy

    model, tok = load_policy(policy_dir, compute)
    cost: dict = {}
    return _draw(cfg, model, tok, texts, batches, None, cost), cost


def baseline_samples(cfg: DifficultyConfig, model, tok, policy_dir: str | Path, texts: list[str],
                     progress=None, compute=None) -> tuple[list, dict]:
    """(one sample of `model` per text, the engine's counted forwards). Where cores allow
    (pipeline/workers.py: `make run`, one process per core) this process and a spawned one
    share the batches, every n-th each: a batch's seed is (seed, batch) whichever process draws
    it, so the samples are the inline run's (tests/test_reward_stage.py)."""
    from rlhf.pipeline.progress import advance_or_bar
    from rlhf.pipeline.workers import worker_count, worker_pool

    n_batches = -(-len(texts) // cfg.batch_size)
    n = worker_count(n_batches)  # processes, this one included
    shares = [list(range(i, n_batches, n)) for i in range(n)]
    cost: dict = {}
    with advance_or_bar(progress, "sampling 1 per prompt", len(texts), "prompts") as advance, \
            worker_pool(n_batches, beside_stage=True) as workers:
        jobs = ([workers.submit(_draw_in_worker, cfg, str(policy_dir), texts, share, compute)
                 for share in shares[1:]] if workers is not None else [])
        outs = _draw(cfg, model, tok, texts, shares[0] if jobs else None, advance, cost)
        for job, share in zip(jobs, shares[1:]):
            theirs, their_cost = job.result()
            outs = [mine or drawn for mine, drawn in zip(outs, theirs)]
            for k, v in their_cost.items():
                cost[k] = cost.get(k, 0) + v
            advance(sum(len(texts[b * cfg.batch_size:(b + 1) * cfg.batch_size]) for b in share))
    return [o[0] for o in outs], cost


def run(cfg: DifficultyConfig, policy_dir: str | Path, reward_model: str | Path,
        out_dir: str | Path, pool_dir: str | Path | None = None,
        demos_path: str | Path | None = None, progress=None, compute=None) -> dict[str, Any]:
    """The `difficulty` stage: one baseline response per prompt, the composite, the buckets.
    `compute`: the policy's and the RM's device and dtype (pipeline/models/compute.py; None: float32 on
    the CPU)."""
    from rlhf.pipeline.models.policy import engine_on, load_policy, quiet_hf
    from rlhf.pipeline.reward.scorer import load_ensemble
    from rlhf.store.io import staged_folders, write_shard

    quiet_hf()
    rows, source = _pool_rows(pool_dir, demos_path)
    if not rows:
        raise ValueError("no prompts to score")
    model, tok = load_policy(policy_dir, compute)
    texts = [r["text"] for r in rows]
    samples, counted = baseline_samples(cfg, model, tok, policy_dir, texts, progress, compute)
    scorer = load_ensemble(reward_model, batch_size=cfg.batch_size, compute=compute)
    rm, _ = scorer(texts, [s.response for s in samples])
    lengths = [s.n_tokens for s in samples]
    stds = [s.logprob_std for s in samples]
    scores = difficulty_scores(lengths, stds, rm.tolist(), cfg.w_length, cfg.w_logprob_std,
                               cfg.w_rm, cfg.clip_quantile)
    table = []
    for r, n, sd, q, sc in zip(rows, lengths, stds, rm.tolist(), scores.tolist()):
        table.append({"prompt_id": r["prompt_id"], "text": r["text"], "split": r["split"],
                      "topic_cluster": int(r["topic_cluster"]), "length": int(n),
                      "logprob_std": float(sd), "rm_score": float(q), "score": float(sc),
                      "bucket": bucket_of(sc)})
    out_dir = Path(out_dir)
    with staged_folders([out_dir]) as staged:  # the old table stays whole until the new one is
        write_shard("difficulty", table, staged[out_dir] / "part-00000.parquet")

    bucket_counts = {b: sum(t["bucket"] == b for t in table) for b in BUCKETS}
    sampler = sampler_from_table(table, cfg.sampler_batch_size, cfg.seed)
    by_b = {t["prompt_id"]: t["bucket"] for t in table}
    by_c = {t["prompt_id"]: t["topic_cluster"] for t in table}
    n_b = sum(v > 0 for v in bucket_counts.values())
    n_c = len(set(by_c.values()))
    full = 0
    n_batches = 20
    for _ in range(n_batches):
        cov = coverage(sampler.next_batch(), by_b, by_c)
        full += len(cov["buckets"]) == n_b and len(cov["clusters"]) == n_c
    corr = np.corrcoef(np.array([lengths, stds, rm.tolist()]), scores) if len(table) > 2 else None
    metrics = {
        "prompt_source": source,
        "n_prompts": len(table),
        "bucket_counts": bucket_counts,
        "n_topic_clusters": n_c,
        "mean_score": float(np.mean(scores)),
        "mean_length": float(np.mean(lengths)),
        "mean_logprob_std": float(np.mean(stds)),
        "mean_rm_score": float(rm.mean()),
        "corr_score_length": float(corr[0, 3]) if corr is not None else None,
        "corr_score_logprob_std": float(corr[1, 3]) if corr is not None else None,
        "corr_score_rm": float(corr[2, 3]) if corr is not None else None,
        "sampler_batch_size": cfg.sampler_batch_size,
        "sampler_full_coverage_share": full / n_batches,
        "sampling": {"engine": engine_on(cfg.engine, model), **counted},  # the policy's counted forwards
    }
    metrics = {k: (None if isinstance(v, float) and v != v else v) for k, v in metrics.items()}
    return metrics
