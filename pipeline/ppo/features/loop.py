"""The seed features that act inside the loop's math, not through a hook: the schedules
(schedules.py: the λ-ε table, adaptive clip, KL warm-up, the collapse detector), rollout dropout
(generate.py) and the light critic with its reward-aware attention (critic.py). Registered so
that their switches are plain PPO's like every other feature's, and the benchmark knows their
code; each declares its `ppo:` keys here (ConfigField: type, default, range, help).

    python -c "from rlhf.pipeline.ppo.features import FEATURES; print(FEATURES['light_critic'])"
"""

from __future__ import annotations

from typing import Literal

from rlhf.pipeline.config import ConfigError
from rlhf.pipeline.ppo.features.registry import ConfigField, Feature, register
from rlhf.pipeline.ppo.schedules import DEFAULT_LAMBDA_EPS_TABLE, check_lambda_eps_table
from rlhf.pipeline.ranges import COUNT, FRACTION_LT1, NONNEG, POS, PROB

SCHEDULES = ("pipeline/ppo/schedules.py", "pipeline/ppo/update.py")


def _check_table(cfg) -> None:
    try:
        check_lambda_eps_table(cfg.lambda_eps_table)
    except ValueError as exc:
        raise ConfigError(f"ppo.{exc}") from None


def _check_critic(cfg) -> None:
    if cfg.critic_hidden_size % cfg.critic_heads:
        raise ConfigError("ppo.critic_hidden_size must be a multiple of ppo.critic_heads")
    if cfg.critic_layers < (1 if cfg.critic == "light" else 0):
        raise ConfigError(f"ppo.critic_layers must be >= 1 for the light critic, >= 0 for "
                          f"trunk/shared (0 = a quarter of the policy's), got {cfg.critic_layers}")


def _check_reward_attention(cfg) -> None:
    if cfg.reward_attention_on and cfg.critic == "trunk":
        raise ConfigError("ppo.reward_attention_on needs critic light or shared (the trunk "
                          "critic's attention is the policy's own)")


LAMBDA_EPS_FIELDS = (
    ConfigField("lambda_eps_table_on", bool, False,
                help='seed 000 §3.3: dynamic λ-ε table, rows (first step, λ, ε)'),
    ConfigField("lambda_eps_table", tuple[tuple[int, float, float], ...], DEFAULT_LAMBDA_EPS_TABLE,
                range=(NONNEG, PROB, POS)),
)

ADAPTIVE_CLIP_FIELDS = (
    ConfigField("adaptive_clip_on", bool, False,
                help='seed 001 §5.2: ε from the batch KL to the reference'),
    ConfigField("adaptive_clip_kl_low", float, 0.02, range=NONNEG),
    ConfigField("adaptive_clip_kl_high", float, 0.1, range=NONNEG),
    ConfigField("adaptive_clip_low", float, 0.02, range=POS),
    ConfigField("adaptive_clip_high", float, 0.1, range=POS),
    ConfigField("adaptive_clip_between", Literal["keep", "interpolate"], "keep"),
    ConfigField("adaptive_clip_kl", Literal["sequence", "token"], "sequence",
                help='what "the batch KL" is: "sequence" = the mean over rollouts of the KL '
                     'summed over a response (what TRL and OpenRLHF log as the KL); "token" = the'
                     ' mean per-token KL. At the start of a run the policy is the reference, so '
                     "every per-token KL is below 0.02 and the seed's rule pins ε at 0.02, which "
                     'keeps it there (docs/ppo.md)'),
)

KL_WARMUP_FIELDS = (
    ConfigField("kl_warmup_on", bool, False,
                help='seed 001 §5.1: kl_coef from 0 to kl_coef over the first steps'),
    ConfigField("kl_warmup_steps", int, 100, range=COUNT),
)

COLLAPSE_FIELDS = (
    ConfigField("collapse_detector_on", bool, False,
                help='seed 000 §5.1: reward collapse -> kl_coef 2.0 and an RM-refresh event'),
    ConfigField("collapse_mean_drop", float, 0.3, range=POS),
    ConfigField("collapse_std_rise", float, 2.0, range=POS),
    ConfigField("collapse_kl_coef", float, 2.0, range=POS),
    ConfigField("collapse_hold_steps", int, 20, range=COUNT),
)

ROLLOUT_DROPOUT_FIELDS = (
    ConfigField("rollout_dropout_on", bool, False,
                help='seed 001 §5.2: keep dropout active while sampling rollouts'),
    ConfigField("rollout_dropout", float, 0.1, range=FRACTION_LT1),
)

CRITIC_FIELDS = (
    ConfigField("critic", Literal["light", "full", "trunk", "shared"], "full",
                help='critic (seed 000 §3.2) full: a copy of the policy with a value head; trunk:'
                     " the policy's embeddings (frozen) and first critic_layers layers (trained) "
                     '+ a value head; shared: those layers frozen with one trainable attention '
                     'block + a value head; light: a from-scratch encoder (critic.py)'),
    ConfigField("critic_hidden_size", int, 1024, range=COUNT,
                help='light only'),
    ConfigField("critic_layers", int, 3, range=NONNEG,
                help='light: encoder layers; trunk/shared: policy layers (0 = a quarter)'),
    ConfigField("critic_heads", int, 8, range=COUNT),
    ConfigField("critic_max_tokens", int, 256, range=COUNT),
)

REWARD_ATTENTION_FIELDS = (
    ConfigField("reward_attention_on", bool, False,
                help="light/shared critic: weights keys by the RM's prefix scores"),
    ConfigField("reward_attention_high", float, 1.2, range=POS),
    ConfigField("reward_attention_low", float, 0.8, range=NONNEG),
    ConfigField("reward_attention_frac", float, 0.25, range=PROB),
)

ENGINE_FIELDS = (
    ConfigField("engine", Literal["auto", "hf", "native", "static", "vllm"], "hf",
                help='pipeline/decode get_generator: "hf" (model.generate: every row lives '
                     'until the batch\'s last one ends), "native" (pipeline/decode/native.py: a '
                     'stopped row leaves the batch, and the sampled tokens\' log-probs replace '
                     'the old-log-prob forward), "static" (pipeline/decode/static.py: static '
                     'shapes, a CUDA graph per batch bucket; docs/engine.md), "vllm" (not '
                     'built), "auto" (per device, the fastest exact engine measured on that '
                     'device kind: "native" on a CPU (0.41x the seconds of hf + the '
                     'old-log-prob pass), "hf" on CUDA until the static step\'s GPU figures '
                     'exist (the only GPU figures, bench/data/gpu/device_run2.log on an H200, '
                     'have native 2.7x slower than hf); bench/gpu_device.sh measures static, '
                     'which will decide; the run records the engine it resolved to)'),
    ConfigField("logprob_guard_every", int, 0, range=NONNEG,
                help="the old-log-prob guard (pipeline/decode/logprob_guard.py): every "
                     "`logprob_guard_every` steps whose engine log-probs would be reused, "
                     "`logprob_guard_rows` rows are recomputed by the trainer's forward; above "
                     "`logprob_guard_tol` (max |delta log p|) the trainer runs its own pass "
                     "(0 = off: the engine's log-probs are trusted)"),
    ConfigField("logprob_guard_rows", int, 4, range=COUNT),
    ConfigField("logprob_guard_tol", float, 1e-3, range=POS),
)

register(Feature("lambda_eps_table", ("lambda_eps_table_on",),
                 help="dynamic λ-ε table by step (seed 000 §3.3)", fields=LAMBDA_EPS_FIELDS,
                 follows="kl_estimator", check=_check_table, modules=SCHEDULES))
register(Feature("adaptive_clip", ("adaptive_clip_on",),
                 help="ε from the batch KL to the reference (seed 001 §5.2)",
                 fields=ADAPTIVE_CLIP_FIELDS, follows="kl_estimator", modules=SCHEDULES))
register(Feature("kl_warmup", ("kl_warmup_on",),
                 help="kl_coef from 0 over the first steps (seed 001 §5.1)",
                 fields=KL_WARMUP_FIELDS, follows="kl_estimator", modules=SCHEDULES))
register(Feature("collapse_detector", ("collapse_detector_on",),
                 help="reward collapse: kl_coef up and an RM-refresh event (seed 000 §5.1)",
                 fields=COLLAPSE_FIELDS, follows="kl_estimator",
                 modules=SCHEDULES + ("pipeline/ppo/diagnostics.py",)))
register(Feature("rollout_dropout", ("rollout_dropout_on",),
                 help="dropout kept active while sampling rollouts (seed 001 §5.2)",
                 fields=ROLLOUT_DROPOUT_FIELDS, follows="gradnorm_bimodal_separation",
                 modules=("pipeline/ppo/generate.py",)))
register(Feature("light_critic", ("critic",),
                 help="a critic lighter than the policy instead of a full copy: its first layers "
                      "(trunk, shared) or seed 000 §3.2's encoder (light)",
                 fields=CRITIC_FIELDS, follows="gradnorm_bimodal_separation", check=_check_critic,
                 modules=("pipeline/ppo/critic.py",)))
register(Feature("reward_attention", ("reward_attention_on",),
                 help="light critic: keys weighted by the RM's prefix scores (seed 000 §3.2)",
                 fields=REWARD_ATTENTION_FIELDS, follows="critic_kl_reg_coef",
                 check=_check_reward_attention, modules=("pipeline/ppo/critic.py",)))
register(Feature("native_engine", ("engine",),
                 help="our own decode loop: a stopped row leaves the batch, and the sampled "
                      "log-probs replace the old-log-prob pass (the same distribution)",
                 fields=ENGINE_FIELDS, follows="dynamic_sampling_rounds",
                 modules=("pipeline/decode", "pipeline/ppo/generate.py")))
