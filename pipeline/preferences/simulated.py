"""The annotator mode (`labels: annotators`): the SFT policy samples `k` responses per
reward-split prompt (plus demonstrations of its topic) and the world's `AnnotatorPool` ranks
them, the labelling clock advancing through the campaign."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from rlhf.pipeline.preferences.config import PreferencesConfig, split_of
from rlhf.pipeline.preferences.external import external_rows
from rlhf.pipeline.preferences.pairs import _agreement, expand_pairs
from rlhf.pipeline.preferences.prompts import prompts_from_demonstrations, reward_prompts_from_pool
from rlhf.pipeline.models.text import clean
from rlhf.store.hashing import content_hash, hash_fraction


def default_world() -> tuple[Callable, Callable[[str, str], float]]:
    from rlhf.pipeline.world.annotators import AnnotatorPool
    from rlhf.pipeline.world.judge import gold_score

    return AnnotatorPool, gold_score


def topic_of(prompt: str) -> str | None:
    """The world's topic of a prompt (None when it has none or the world is not installed)."""
    try:
        from rlhf.pipeline.world.judge import infer_topic
    except ImportError:
        return None
    topic = infer_topic(prompt)
    return topic.name if topic is not None else None


def demo_candidates(prompts: Sequence[str], demos_path: str | Path, n: int,
                    seed: int) -> list[list[str]]:
    """`n` demonstration responses per prompt, drawn from the demonstrations of its topic.

    A weak SFT policy's samples barely differ in quality, so rankings of them alone teach the RM
    little; demonstrations of the same topic (of every quality: good, filler, wrong-topic, ...)
    put the whole quality range into each ranking. Deterministic per (seed, prompt)."""
    import random

    from rlhf.pipeline.sft import read_demonstrations

    by_topic: dict[str, list[str]] = defaultdict(list)
    every: list[str] = []
    for r in read_demonstrations(demos_path):
        by_topic[str(r.get("topic"))].append(clean(r["response"]))
        every.append(clean(r["response"]))
    out = []
    for p in prompts:
        bank = by_topic.get(str(topic_of(p))) or every
        rng = random.Random(f"{seed}|{content_hash(p)}")
        out.append(rng.sample(bank, min(n, len(bank))))
    return out


def annotate(prompts: Sequence[tuple[str, str]], responses: Sequence[Sequence[str]],
             cfg: PreferencesConfig, pool_cls, judge,
             origins: Sequence[Sequence[str]] | None = None) -> list[dict]:
    """Rank each prompt's responses with one annotator of the pool, the clock advancing."""
    a = cfg.annotators
    start = datetime.fromisoformat(a.start).replace(tzinfo=UTC)
    pool = pool_cls(n_annotators=a.n_annotators, noise_std=a.noise_std, bias=dict(a.bias),
                    drift_per_day=a.drift_per_day, seed=cfg.seed, start=start)
    rows = []
    for i, ((pid, prompt), resps) in enumerate(zip(prompts, responses)):
        when = start + timedelta(days=i / a.labels_per_day)
        label = pool.label(prompt, list(resps), when)
        rank_of = {idx: pos for pos, idx in enumerate(label.ranking)}
        labeled_at = label.labeled_at
        if labeled_at.tzinfo is None:
            labeled_at = labeled_at.replace(tzinfo=UTC)
        rid = content_hash(f"{pid}|{label.annotator_id}|{labeled_at.isoformat()}")[:16]
        split = split_of(pid, cfg.heldout_fraction)
        for j, resp in enumerate(resps):
            rows.append({
                "ranking_id": rid, "prompt_id": pid, "prompt": prompt,
                "response_hash": content_hash(resp), "response": resp,
                "annotator_id": label.annotator_id, "labeled_at": labeled_at,
                "score": float(label.scores[j]), "rank": rank_of[j], "source": "annotator",
                "response_source": origins[i][j] if origins else "policy",
                "split": split, "gold_score": float(judge(prompt, resp)),
            })
    return rows


def run(cfg: PreferencesConfig, policy_dir: str | Path, out_dir: str | Path,
        pool_dir: str | Path | None = None, demos_path: str | Path | None = None,
        realdata: str | Path | None = None, world: tuple[Callable, Callable] | None = None,
        progress=None, compute=None) -> dict[str, Any]:
    """The `preferences` stage: sample, annotate, read external rankings, write the table.
    `compute`: the policy's device and dtype (pipeline/models/compute.py; None: float32 on the CPU)."""
    from rlhf.pipeline.models.policy import engine_on, load_policy, quiet_hf, sample
    from rlhf.store.io import staged_folders, write_shard

    quiet_hf()
    if pool_dir is not None and Path(pool_dir).is_dir():
        prompts, prompt_source = reward_prompts_from_pool(pool_dir), "pool:reward"
    elif demos_path is not None:
        prompts = prompts_from_demonstrations(demos_path, "reward")
        prompt_source = "demonstrations:reward"
    else:
        raise ValueError("give --pool (a pool table folder) or --demos")
    if cfg.max_prompts:
        prompts = sorted(prompts, key=lambda x: hash_fraction("cap:" + x[0]))[: cfg.max_prompts]
        prompts.sort()
    if not prompts:
        raise ValueError("no prompts to sample responses for")
    pool_cls, judge = world or default_world()
    model, tok = load_policy(policy_dir, compute)
    counted: dict = {}
    samples = sample(model, tok, [t for _, t in prompts], n=cfg.k, max_new_tokens=cfg.max_new_tokens,
                     temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed,
                     batch_size=cfg.batch_size, progress=progress, engine=cfg.engine,
                     cost=counted)
    responses = [[s.response for s in ss] for ss in samples]
    origins = [["policy"] * len(r) for r in responses]
    if cfg.demo_candidates:
        if demos_path is None:
            raise ValueError("preferences.demo_candidates needs --demos")
        extra = demo_candidates([t for _, t in prompts], demos_path, cfg.demo_candidates, cfg.seed)
        responses = [r + e for r, e in zip(responses, extra)]
        origins = [o + ["demonstration"] * len(e) for o, e in zip(origins, extra)]
    rows = annotate(prompts, responses, cfg, pool_cls, judge, origins)
    ext_rows, ext_counts = ([], {}) if realdata is None else external_rows(realdata, cfg)
    out_dir = Path(out_dir)
    with staged_folders([out_dir]) as staged:  # both shards appear together, or neither
        write_shard("preferences", rows, staged[out_dir] / "part-00000.parquet")
        write_shard("preferences", ext_rows, staged[out_dir] / "part-00001.parquet")
    pairs = expand_pairs(rows)
    n_distinct = sum(len(set(r)) for r in responses)
    metrics = {
        "prompt_source": prompt_source,
        "n_prompts": len(prompts),
        "k": cfg.k,
        "demo_candidates": cfg.demo_candidates,
        "mean_gold_policy": _mean([r["gold_score"] for r in rows
                                   if r["response_source"] == "policy"]),
        "mean_gold_demonstration": _mean([r["gold_score"] for r in rows
                                          if r["response_source"] == "demonstration"]),
        "n_responses": len(rows),
        "distinct_response_share": n_distinct / max(1, len(rows)),
        "n_rankings": len({r["ranking_id"] for r in rows}),
        "n_pairs": len(pairs),
        "n_pairs_heldout": sum(p["split"] == "heldout" for p in pairs),
        "n_annotators": len({r["annotator_id"] for r in rows}),
        "annotator_gold_agreement": _agreement(pairs),
        "mean_gold_score": sum(r["gold_score"] for r in rows) / max(1, len(rows)),
        "external": ext_counts,
        "n_external_pairs": len(expand_pairs(ext_rows)),
        "sampling": {"engine": engine_on(cfg.engine, model), **counted},  # the policy's counted forwards
    }
    return metrics


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None
