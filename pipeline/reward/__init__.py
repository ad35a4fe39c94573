"""Reward models: the strong RM ensemble, its confidence, the distilled light RM, and the scorer
PPO calls. The stage is `rlhf reward` (`rlhf.pipeline.reward.stage`); the scorer API is

    from rlhf.pipeline.reward import load_scorer
    scorer = load_scorer("artifacts/models/rm_light")
    rewards, confidence = scorer(prompts, responses)   # torch.float32 [B], [B]

(see `rlhf.pipeline.reward.scorer` for the details).
"""

from rlhf.pipeline.reward.scorer import Scorer, load_scorer

__all__ = ["Scorer", "load_scorer"]
