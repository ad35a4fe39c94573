"""Rollout-economy features, one module each, registered in `registry.py` (read it first).

    python -c "from rlhf.pipeline.ppo.features import FEATURES; print(list(FEATURES))"
"""

from rlhf.pipeline.ppo.features.registry import (FEATURES, INPUTS, ConfigField,  # noqa: F401
                                                 Feature, FeatureContext, Input, Table,
                                                 build_hooks, register, register_input,
                                                 unregister)
from rlhf.pipeline.ppo.features import inputs, loop  # noqa: F401,E402  (registration order)
from rlhf.pipeline.ppo.features import tiers, prompt_scheduler, sample_economy  # noqa: F401,E402
from rlhf.pipeline.ppo.features import rm_evolution, dynamic_sampling  # noqa: F401,E402
from rlhf.pipeline.ppo.features import drafts, replay  # noqa: F401,E402
