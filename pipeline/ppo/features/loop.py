"""The seed features that act inside the loop's math, not through a hook: the schedules
(schedules.py: the λ-ε table, adaptive clip, KL warm-up, the collapse detector), rollout dropout
(generate.py) and the light critic with its reward-aware attention (critic.py). Registered so
that their switches are plain PPO's like every other feature's, and the benchmark knows their
code."""

from __future__ import annotations

from rlhf.pipeline.ppo.features.registry import Feature, register

SCHEDULES = ("pipeline/ppo/schedules.py", "pipeline/ppo/update.py")

register(Feature("lambda_eps_table", {"lambda_eps_table_on": False},
                 help="dynamic λ-ε table by step (seed 000 §3.3)", params=("lambda_eps_table",),
                 modules=SCHEDULES))
register(Feature("adaptive_clip", {"adaptive_clip_on": False},
                 help="ε from the batch KL to the reference (seed 001 §5.2)",
                 params=("adaptive_clip_kl_low", "adaptive_clip_kl_high", "adaptive_clip_low",
                         "adaptive_clip_high", "adaptive_clip_between", "adaptive_clip_kl"),
                 modules=SCHEDULES))
register(Feature("kl_warmup", {"kl_warmup_on": False},
                 help="kl_coef from 0 over the first steps (seed 001 §5.1)",
                 params=("kl_warmup_steps",), modules=SCHEDULES))
register(Feature("collapse_detector", {"collapse_detector_on": False},
                 help="reward collapse: kl_coef up and an RM-refresh event (seed 000 §5.1)",
                 params=("collapse_mean_drop", "collapse_std_rise", "collapse_kl_coef",
                         "collapse_hold_steps"),
                 modules=SCHEDULES + ("pipeline/ppo/diagnostics.py",)))
register(Feature("rollout_dropout", {"rollout_dropout_on": False},
                 help="dropout kept active while sampling rollouts (seed 001 §5.2)",
                 params=("rollout_dropout",), modules=("pipeline/ppo/generate.py",)))
register(Feature("light_critic", {"critic": "full"},
                 help="a critic lighter than the policy instead of a full copy: its first layers "
                      "(trunk, shared) or seed 000 §3.2's encoder (light)",
                 params=("critic_hidden_size", "critic_layers", "critic_heads",
                         "critic_max_tokens"),
                 modules=("pipeline/ppo/critic.py",)))
register(Feature("reward_attention", {"reward_attention_on": False},
                 help="light critic: keys weighted by the RM's prefix scores (seed 000 §3.2)",
                 params=("reward_attention_high", "reward_attention_low",
                         "reward_attention_frac"),
                 modules=("pipeline/ppo/critic.py",)))
register(Feature("native_engine", {"engine": "hf"},
                 help="our own decode loop: a stopped row leaves the batch, and the sampled "
                      "log-probs replace the old-log-prob pass (the same distribution)",
                 modules=("pipeline/decode", "pipeline/ppo/generate.py")))
