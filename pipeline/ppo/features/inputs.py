"""The artifacts rollout-economy features read, each with the loader that turns its path into
what the feature uses. `rlhf ppo` gets one `--<key>` option per input (cli/ppo.py)."""

from __future__ import annotations

from pathlib import Path

from rlhf.pipeline.ppo.features.registry import Input, register_input


def _strong(ctx, path: Path):
    """The strong RM in the ppo stage's device and dtype, as the light one (`ctx.compute`)."""
    from rlhf.pipeline.models.scoring import load_scorer

    return load_scorer(path, name="strong_rm", compute=ctx.compute)


def _space(ctx, path: Path):
    from rlhf.pipeline.ppo.features.prompt_scheduler import load_prompt_space

    return load_prompt_space(path, ctx.prompts, ctx.prompts_path)


def _routes(ctx, path: Path):
    from rlhf.pipeline.route import load_routes

    return load_routes(path)


def _score_map(ctx, path: Path):
    from rlhf.pipeline.reward.score_map import ScoreMap

    return ScoreMap.load(path)


def _annotators(ctx, path: Path | None):
    """(AnnotatorPool, start) of the human queue from the params file's preferences section."""
    from rlhf.pipeline.config import load_config, read_params

    keys = ("annotators", "seed", "labels")
    prefs = (load_config(ctx.params, "preferences", keys)
             if "preferences" in read_params(ctx.params) else None)
    if prefs is None or prefs.labels != "annotators":
        raise ValueError("the human queue needs the world's annotator pool (preferences.labels: "
                         "annotators); a user's own data has none")
    return annotator_pool(prefs)


STRONG_REWARD = register_input(Input(
    "strong_reward", "the strong RM folder (Level 2 re-scores with it; RM evolution's labels)",
    _strong))
EMBEDDINGS = register_input(Input(
    "embeddings", "the pool's embeddings, the dedup stage's `pool_embeddings` table folder",
    _space))
ROUTES = register_input(Input(
    "routes", "Level 0's routes, the route stage's `routes` table folder", _routes))
SCORE_MAP = register_input(Input(
    "score_map", "the strong-to-light score map (score_map.json; default: the strong RM "
    "folder's)", _score_map))
ANNOTATORS = register_input(Input(
    "annotators", "the world's annotator pool (params preferences.annotators)", _annotators,
    from_params=True))


def annotator_pool(prefs_cfg):
    """(AnnotatorPool, start) of the human queue: params.yaml `preferences.annotators`, the
    world's pool that labelled the RM's preferences (gold plus noise, bias and drift), labelling
    PPO's samples from 30 days after that campaign's start (its drift carried on)."""
    from datetime import UTC, datetime, timedelta

    from rlhf.pipeline.world.annotators import AnnotatorPool

    a = prefs_cfg.annotators
    start = datetime.fromisoformat(a.start).replace(tzinfo=UTC)
    pool = AnnotatorPool(a.n_annotators, a.noise_std, dict(a.bias), a.drift_per_day,
                         prefs_cfg.seed, start)
    return pool, start + timedelta(days=30)
