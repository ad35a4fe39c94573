"""The `reward_figures` stage (`make report`, reports/dvc.yaml): the reward models' figures that
no later stage reads, measured on the RMs the `reward` stage saved.

1. Fresh samples of unseen (eval-split) prompts (`eval_k` SFT samples + `eval_demo_candidates`
   demonstrations each): each RM's Spearman against the gold judge (seed 001 §5.1: below 0.7
   means overfit), light vs strong, sizes and the speed ratio, the confidence gate.
2. On PPO's own distribution (`onpolicy_k` SFT samples per ppo-split prompt at PPO's sampling
   settings): each RM's Spearman vs gold, overall and within a prompt, the hacked-twin probe,
   and how the strong-to-light score map (fitted by the reward stage on its distillation
   rollouts) fits these fresh samples.

They left `make run` for `make report`: together ~2 minutes of the reward stage on 2 cores,
and nothing downstream depends on them.

    rlhf reward-figures --strong artifacts/models/rm_strong --light artifacts/models/rm_light \
        --sft artifacts/models/sft --preferences artifacts/store/preferences \
        --pool artifacts/store/pool --demos artifacts/world/demonstrations.jsonl \
        --metrics artifacts/metrics/reward_figures.json
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlhf.pipeline.reward.report import fresh_figures, onpolicy_figures, onpolicy_headlines
from rlhf.pipeline.reward.stage import RewardConfig, _Phases, eval_prompts_of


def run(cfg: RewardConfig, strong_dir: str | Path, light_dir: str | Path, sft_dir: str | Path,
        preferences_dir: str | Path, pool_dir: str | Path | None = None,
        demos_path: str | Path | None = None,
        judge: Callable[[str, str], float] | None = None,
        log: Callable[[str], None] = lambda msg: None, ppo_sampling=None) -> dict[str, Any]:
    """The figures of both RMs (steps 1 and 2 above); `phase_seconds` times each. The prompts
    are the reward stage's: the eval split and the ppo split without the prompts the RMs
    were trained on. `ppo_sampling` (decode.Sampling): how PPO samples, for step 2."""
    import torch
    from rlhf.pipeline.models.policy import load_policy, quiet_hf
    from rlhf.pipeline.reward.score_map import FILENAME, ScoreMap
    from rlhf.pipeline.reward.scorer import load_ensemble
    from rlhf.store.io import read_table

    quiet_hf()
    t_start = time.perf_counter()
    torch.manual_seed(cfg.seed)
    if judge is None:
        from rlhf.pipeline.world.judge import gold_score as judge
    strong, light = load_ensemble(strong_dir), load_ensemble(light_dir)
    strong.memo = {}  # the figures score the same texts several ways: once each
    rows = read_table("preferences", preferences_dir).select(["prompt_id", "source"]).to_pylist()
    exclude = {r["prompt_id"] for r in rows if r["source"] in cfg.train_sources}
    rollout_prompts, eval_prompts = eval_prompts_of(cfg, pool_dir, demos_path, exclude)
    policy, ptok = load_policy(sft_dir)
    step = _Phases()
    metrics: dict[str, Any] = {"judge": getattr(judge, "name", "world_gold")}
    metrics.update(step("fresh_figures", fresh_figures, cfg, strong, light, policy, ptok,
                        eval_prompts, demos_path, judge, log))
    if cfg.onpolicy_k:  # on PPO's own distribution: SFT samples as PPO samples them
        smap = (ScoreMap.load(strong_dir) if (Path(strong_dir) / FILENAME).is_file() else None)
        metrics["onpolicy"] = step("onpolicy_figures", onpolicy_figures, cfg, policy, ptok,
                                   rollout_prompts, strong, light, judge, ppo_sampling, log, smap)
        metrics.update(onpolicy_headlines(metrics["onpolicy"]))
    metrics["phase_seconds"] = step.seconds
    metrics["seconds"] = round(time.perf_counter() - t_start, 1)
    return metrics
