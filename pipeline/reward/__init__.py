"""Reward models: the strong RM ensemble, its confidence, the distilled light RM, and the
`RMEnsemble` PPO's scorer wraps (models/scoring.py). The stage is `rlhf reward`
(`rlhf.pipeline.reward.stage`); the ensemble API is

    from rlhf.pipeline.reward import load_ensemble
    scorer = load_ensemble("artifacts/models/rm_light")
    rewards, confidence = scorer(prompts, responses)   # torch.float32 [B], [B]

(see `rlhf.pipeline.reward.scorer` for the details).
"""

from rlhf.pipeline.reward.scorer import RMEnsemble, load_ensemble

__all__ = ["RMEnsemble", "load_ensemble"]
