"""PPOConfig: the typed mirror of the `ppo:` section of params.yaml, checked at load.

Every switch defaults to off, so a `ppo:` section that sets none of them is plain PPO (the
baseline the benchmarks compare against); params.yaml turns the features on. Which fields are a
feature's is declared by the feature registry (features/registry.py), not here: `PLAIN_PPO`,
`plain` and `features_on` derive from it. A feature registered from outside this file declares
its own `ppo:` keys (`ConfigField`); they live in `extra` and read like any other field
(`cfg.my_switch`); `with_values` sets either kind.

    rlhf params check
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from rlhf.pipeline.config import ConfigError
from rlhf.pipeline.ppo.schedules import DEFAULT_LAMBDA_EPS_TABLE, check_lambda_eps_table


@dataclass(frozen=True)
class PPOConfig:
    seed: int = 0
    total_steps: int = 40
    # a budget of generated tokens (every token the policy sampled, accounting.py): the run
    # stops after the step that reaches it (0 = none; `total_steps` still bounds the run), so
    # arms that spend fewer tokens a step can be compared at an equal budget (bench/economy.py)
    total_tokens: int = 0
    batch_size: int = 8  # prompts per step (per process)
    mini_batch_size: int = 4  # rollouts per optimiser step
    ppo_epochs: int = 2
    # sampling (seed 001 §5.1: temperature > 0.3 and top_p <= 0.95, else repeated responses)
    temperature: float = 0.8
    top_p: float = 0.95
    max_new_tokens: int = 24
    max_prompt_tokens: int = 64
    generation_timeout_s: float = 15.0  # seed 000 §4.3: a stuck rollout falls back
    # optimisation
    learning_rate: float = 1e-4
    critic_learning_rate: float = 3e-4
    max_grad_norm: float = 1.0
    gamma: float = 1.0
    gae_lambda: float = 0.95
    # the advantage estimator (advantages.py): "gae" with the critic (PPO), or a group estimator
    # over `group_size` samples of each prompt with no critic: "rloo" (leave-one-out baseline),
    # "grpo" (the group's mean and std); with group_size k a step draws batch_size / k prompts
    advantage_estimator: Literal["gae", "rloo", "grpo"] = "gae"
    group_size: int = 1
    clip_range: float = 0.2
    clip_range_value: float = 0.2
    whiten_advantages: bool = True
    kl_coef: float = 0.05
    # "full" = exact KL over the whole vocabulary; k1/k2/k3 = Schulman's estimators on sampled
    # tokens (all from full-vocabulary log-probs, never truncated: seed 000 §5.4)
    kl_estimator: Literal["full", "k1", "k2", "k3"] = "full"
    # seed 000 §3.3: dynamic λ-ε table, rows (first step, λ, ε)
    lambda_eps_table_on: bool = False
    lambda_eps_table: tuple[tuple[int, float, float], ...] = DEFAULT_LAMBDA_EPS_TABLE
    # seed 001 §5.2: ε from the batch KL to the reference
    adaptive_clip_on: bool = False
    adaptive_clip_kl_low: float = 0.02
    adaptive_clip_kl_high: float = 0.1
    adaptive_clip_low: float = 0.02
    adaptive_clip_high: float = 0.1
    adaptive_clip_between: Literal["keep", "interpolate"] = "keep"
    # what "the batch KL" is: "sequence" = the mean over rollouts of the KL summed over a
    # response (what TRL and OpenRLHF log as the KL); "token" = the mean per-token KL. At the
    # start of a run the policy is the reference, so every per-token KL is below 0.02 and the
    # seed's rule pins ε at 0.02, which keeps it there (docs/ppo.md)
    adaptive_clip_kl: Literal["sequence", "token"] = "sequence"
    # seed 001 §5.1: kl_coef from 0 to kl_coef over the first steps
    kl_warmup_on: bool = False
    kl_warmup_steps: int = 100
    # seed 000 §5.1: reward collapse -> kl_coef 2.0 and an RM-refresh event
    collapse_detector_on: bool = False
    collapse_mean_drop: float = 0.30
    collapse_std_rise: float = 2.00
    collapse_kl_coef: float = 2.0
    collapse_hold_steps: int = 20
    # seed 000 §3.3: gradient-norm histogram diagnostics
    gradnorm_diagnostics_on: bool = True
    gradnorm_reference_steps: int = 10
    gradnorm_shift_decades: float = 1.0
    gradnorm_bimodal_separation: float = 2.0
    # seed 001 §5.2: keep dropout active while sampling rollouts
    rollout_dropout_on: bool = False
    rollout_dropout: float = 0.1
    # critic (seed 000 §3.2)
    # full: a copy of the policy with a value head; trunk: the policy's embeddings (frozen) and
    # first critic_layers layers (trained) + a value head; shared: those layers frozen with one
    # trainable attention block + a value head; light: a from-scratch encoder (critic.py)
    critic: Literal["light", "full", "trunk", "shared"] = "full"
    critic_hidden_size: int = 1024  # light only
    critic_layers: int = 3  # light: encoder layers; trunk/shared: policy layers (0 = a quarter)
    critic_heads: int = 8
    critic_max_tokens: int = 256
    critic_huber_delta: float = 1.0
    critic_kl_reg_coef: float = 0.01
    reward_attention_on: bool = False  # light/shared critic: weights keys by the RM's prefix scores
    reward_attention_high: float = 1.2
    reward_attention_low: float = 0.8
    reward_attention_frac: float = 0.25
    # seed 001 §4.1 Level-2 escalation: a valid rollout whose light-RM confidence is below this
    # is re-scored by the strong RM (`rlhf ppo --strong-reward`) and PPO uses the strong score.
    # The seed triggers Level 2 on a low score or a high-risk topic; we use the RM's own doubt,
    # the confidence gate of seed 000 §3.4 (0.6). 0 = never (and no strong RM: never).
    escalate_below: float = 0.0
    # Level 2's other triggers (pipeline/ppo/features/tiers.py). A valid rollout also escalates
    # when its light-RM score is below the `escalate_score_quantile` quantile of the Level-1
    # scores of the last `escalate_window` steps and this one (the seed's 3.2 / 5.0 as a quantile
    # of the run's own distribution; 0 = off), when Level 0 routes its prompt as a high-risk topic
    # (`escalate_high_risk`, `rlhf ppo --routes`), or when its topic cluster is one the rollout
    # scheduler marked high-uncertainty (`escalate_uncertain`, needs ppo.schedule_on). At most
    # `escalate_max_share` of a batch escalates (the lowest light scores first; seed: < 7%).
    escalate_score_quantile: float = 0.0
    escalate_high_risk: bool = False
    escalate_uncertain: bool = False
    escalate_window: int = 20
    escalate_max_share: float = 1.0
    # "fitted": an escalated sample's strong score goes through the strong-to-light score map the
    # reward stage fitted (rm_strong/score_map.json; pipeline/reward/score_map.py), so it is on
    # its batch-mates' light-RM scale; "none": the strong RM's own scale (two scales in a batch)
    escalate_map: Literal["none", "fitted"] = "none"
    # the human queue: up to this many Level-2 samples a step (lowest light scores first) are
    # labelled by the world's annotator pool (params.yaml preferences.annotators; `rlhf ppo
    # --human-labels`), stored with annotator and time in `human_labels`, and feed RM evolution
    human_labels_per_step: int = 0
    # Level 0: generate at most the route's token budget for each prompt (router
    # section of params.yaml, `rlhf ppo --routes`; max_new_tokens stays the ceiling)
    route_budget_on: bool = False
    # RM evolution (seed 000 §3.4, §5.1; pipeline/ppo/features/rm_evolution.py).
    # rm_gate_mask_on: a sample whose final confidence is below the light RM's gate (0.6) and
    # that Level 2 did not re-score is kept out of the step's update and queued for fine-tuning.
    rm_gate_mask_on: bool = False
    # rm_evolve_on: every `rm_check_every` steps, `rm_check_samples` samples of the current
    # policy from the last steps are labelled (human labels where the queue has them, else the
    # strong RM through the score map) and the light RM's Spearman against those labels is
    # compared with its first check's; a relative drop above `rm_drop` (or the reward-collapse
    # detector's rm_refresh) fine-tunes the light RM on the queue and those labels
    # (`rm_finetune_epochs` at `rm_finetune_lr`) and hot-swaps it (a new rm_version)
    rm_evolve_on: bool = False
    # who labels a check's samples: "strong" (the strong RM through the score map; the human
    # queue's labels where it has them) or "annotators" (the world's annotator pool labels every
    # check sample: human labels, counted as human_rm_calls and stored in `human_labels`)
    rm_label_source: Literal["strong", "annotators"] = "strong"
    rm_check_every: int = 10
    rm_check_samples: int = 48
    rm_drop: float = 0.05
    rm_queue_max: int = 256
    rm_finetune_epochs: int = 2
    rm_finetune_lr: float = 1e-4
    # records
    checkpoint_every: int = 10
    csv_every: int = 10  # seed 000 §4.4: one CSV line every 10 steps
    debug_rollouts: bool = False  # seed 001 §5.2: full text only in debug rollout mode
    attn_implementation: Literal["auto", "eager", "sdpa", "flash_attention_2"] = "auto"
    # held-out gold evaluation of the SFT and the PPO policy after training (`rlhf ppo
    # --heldout-store`, pipeline/ppo/heldout_gold.py): both sampled as PPO samples (temperature,
    # top_p, max_new_tokens above), the same as the eval stage and bench/economy.py
    heldout_eval: bool = True
    eval_seed: int = 0
    # scale-out (pipeline/ppo/engines.py): "none" = one process, or plain data parallel (DDP)
    # under torchrun / accelerate launch; "zero3" = the policy and the critic each their own
    # DeepSpeed ZeRO-3 engine, the reference an inference engine, settings from `rlhf ppo
    # --deepspeed-config` (configs/deepspeed_zero3.json: optimizer state offloaded to the CPU,
    # parameters not, fp16 communication; seed 000 §4.1, §5.5). Needs `pip install deepspeed`.
    sharding: Literal["none", "zero3"] = "none"
    # minibatches whose gradients add up to one optimiser step: a divisor of the minibatches per
    # PPO step (ppo_epochs x batch_size / mini_batch_size); with zero3 a multiple of the number
    # of processes (seed 000 §5.5)
    gradient_accumulation_steps: int = 1
    # rollout economy II: the prompt-embedding rollout scheduler (seed 001 §4.3,
    # pipeline/ppo/features/scheduler.py; `rlhf ppo --embeddings`). For a candidate prompt, its
    # `schedule_neighbours` nearest historical prompts (MiniLM cosine; itself first when it has
    # history); a prompt's variance is the sample variance of its last `schedule_window` rewards
    # (>= 2 needed). If >= `schedule_min_low` of them are below `schedule_low` -> skip (estimate:
    # the neighbours' mean reward), unless exploration retries it; neighbours' mean variance above
    # `schedule_high` -> roll out and mark its topic cluster high-uncertainty. A prompt never
    # rolled out is always rolled out (cold start).
    schedule_on: bool = False
    schedule_neighbours: int = 10
    schedule_min_low: int = 7
    schedule_low: float = 0.3
    schedule_high: float = 0.8
    # "standardised": variances over the run's reward variance (every prompt's last
    # `schedule_window` rewards pooled), so 0.3 / 0.8 mean the same for any RM; "raw": the
    # RM's own units (the seed's literal numbers were on a 0-5 RM scale)
    schedule_scale: Literal["standardised", "raw"] = "standardised"
    schedule_window: int = 4
    # exploration (GRESO-like, seed 000 §2.2 staleness): a prompt the rule skips is rolled out
    # anyway with probability min(1, base + steps since its last rollout / horizon)
    schedule_explore_base: float = 0.05
    schedule_explore_horizon: int = 50
    # rollout economy I (seed 000 §3.1 levels two and three; ppo/features/sample_economy.py)
    # level two: stop a sample after `prune_run` consecutive low-information tokens (inside the
    # batched generate: the tokens it would still have cost are never generated)
    prune_on: bool = False
    # "calibrated": entropy (bits, of the distribution sampled: after temperature and top-p) below
    # the `prune_percentile`-th percentile of the policy's own entropies over the first
    # `prune_calibration_steps` steps, and the token repeats an earlier `prune_ngram`-gram of the
    # response; "literal": the seed's top-`prune_top_k` entropy below log2(V)/2 bits (prunes
    # nearly every sample: a top-k entropy is at most log2(k))
    prune_rule: Literal["calibrated", "literal"] = "calibrated"
    prune_run: int = 5  # the seed's five consecutive tokens
    prune_percentile: float = 20.0
    prune_calibration_steps: int = 1
    prune_ngram: int = 3  # 0 = no repetition test
    prune_top_k: int = 50  # literal rule only
    # what a pruned sample is in the update: "drop" (the seed: no gradient, null reward),
    # "truncation" (a terminal state with the light RM's score of the truncated text), "failure"
    # (a terminal state with the lowest reward an unpruned sample of the batch earned)
    prune_treatment: Literal["drop", "truncation", "failure"] = "drop"
    # level three: samples below the batch mean - `resample_sigma` std are cut at the first token
    # the light RM rates low (bottom `resample_low_frac` of its per-token score increments) and
    # the rest regenerated by the current policy; at most `resample_max_share` of the batch a step
    resample_on: bool = False
    resample_sigma: float = 1.0
    resample_low_frac: float = 0.25
    resample_max_share: float = 0.25
    # DAPO's dynamic sampling (features/dynamic_sampling.py), group estimators only: groups whose
    # rewards do not vary are dropped after scoring and the batch refilled with fresh prompts,
    # at most `dynamic_sampling_rounds` refills a step (every token generated is counted)
    dynamic_sampling_on: bool = False
    dynamic_sampling_rounds: int = 3
    # --- rollout engine ---
    # pipeline/generation.py get_generator: "hf" (model.generate: every row lives until the
    # batch's last one ends), "native" (pipeline/engine.py: a stopped row leaves the batch, and
    # the sampled tokens' log-probs replace the old-log-prob forward), "static" (pipeline/decode/
    # static.py: static shapes, a CUDA graph per batch bucket; docs/engine.md), "vllm" (not built)
    engine: Literal["hf", "native", "static", "vllm"] = "hf"
    # --- the old-log-prob guard (pipeline/decode/logprob_guard.py) --- every
    # `logprob_guard_every` steps whose engine log-probs would be reused, `logprob_guard_rows`
    # rows are recomputed by the trainer's forward; above `logprob_guard_tol` (max |delta log p|)
    # the trainer runs its own pass (0 = off: the engine's log-probs are trusted)
    logprob_guard_every: int = 0
    logprob_guard_rows: int = 4
    logprob_guard_tol: float = 1e-3
    # pipeline/drafters.py, native only: "lookup" (n-gram drafts from the context and recent
    # responses, verified exactly), "model" (the policy's own first `draft_layers` layers with
    # its head draft from a distribution q, verified exactly: pipeline/draft_model.py), "reuse"
    # (SPEC-RL's rule on stored old responses: an arm, not exact); up to `draft_k` drafted
    # tokens per row and forward
    draft: Literal["none", "lookup", "reuse", "model"] = "none"
    draft_k: int = 4
    draft_layers: int = 0  # the draft model's layers (0 = a quarter of the policy's)
    # seed 000 §2.2's replay buffer (features/replay.py): once it holds enough, round(
    # `replay_fraction` x batch_size) rows of each step are drawn from the last `replay_size`
    # valid rollouts and trained with their stored old log-probs (the seed's buffer: 2,000)
    replay_on: bool = False
    replay_size: int = 2000
    replay_fraction: float = 0.5
    # the keys of features registered outside this class ((key, value) pairs; `with_values`)
    extra: tuple[tuple[str, Any], ...] = ()

    def __getattr__(self, name: str):  # only reached when `name` is not a declared field
        if name.startswith("_"):
            raise AttributeError(name)
        from rlhf.pipeline.ppo.features.registry import extension_fields

        try:
            given = dict(object.__getattribute__(self, "extra"))
        except AttributeError:
            raise AttributeError(name) from None
        if name in given:
            return given[name]
        ext = extension_fields()
        if name in ext:
            return ext[name].default
        raise AttributeError(f"PPOConfig has no field {name!r}")

    @classmethod
    def split(cls, data: dict) -> dict:
        """`data` with the keys of registered extension features moved into `extra`."""
        from rlhf.pipeline.ppo.features.registry import extension_fields

        ext, own = extension_fields(), {f.name for f in fields(cls)}
        moved = {k: v for k, v in data.items() if k not in own and k in ext}
        if not moved:
            return data
        for k, v in moved.items():
            if not isinstance(v, ext[k].type) or (ext[k].type is int and isinstance(v, bool)):
                raise ConfigError(f"ppo.{k} must be {ext[k].type.__name__}, got {v!r}")
        rest = {k: v for k, v in data.items() if k not in moved}
        return {**rest, "extra": tuple(sorted({**dict(rest.get("extra", ())), **moved}.items()))}

    def __post_init__(self) -> None:
        # YAML gives lists; keep the table hashable and immutable like the rest of the config
        object.__setattr__(self, "lambda_eps_table",
                           tuple(tuple(row) for row in self.lambda_eps_table))
        # seed 001 §5.1 asserts `temperature > 0.3 and top_p < 0.95`; the issue allows 0.95
        if not self.temperature > 0.3:
            raise ConfigError(
                f"ppo.temperature must be > 0.3 (seed 001 §5.1: lower sampling temperatures make "
                f"rollouts repeat themselves), got {self.temperature}")
        if not 0.0 < self.top_p <= 0.95:
            raise ConfigError(
                f"ppo.top_p must be in (0, 0.95] (seed 001 §5.1), got {self.top_p}")
        if self.batch_size % self.mini_batch_size:
            raise ConfigError(f"ppo.batch_size ({self.batch_size}) must be a multiple of "
                              f"ppo.mini_batch_size ({self.mini_batch_size})")
        if self.mini_batch_size < 2 and self.whiten_advantages:
            raise ConfigError("ppo.mini_batch_size must be >= 2 to whiten advantages")
        if self.total_tokens < 0:
            raise ConfigError(f"ppo.total_tokens must be >= 0 (0 = no token budget), "
                              f"got {self.total_tokens}")
        for name in ("total_steps", "ppo_epochs", "max_new_tokens", "checkpoint_every",
                     "csv_every", "critic_max_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"ppo.{name} must be >= 1, got {getattr(self, name)}")
        if self.draft != "none" and self.engine != "native":  # --- rollout engine ---
            raise ConfigError(f"ppo.draft {self.draft!r} needs ppo.engine: native, "
                              f"got {self.engine!r}")
        if self.draft_k < 1:
            raise ConfigError(f"ppo.draft_k must be >= 1, got {self.draft_k}")
        self._check_replay()
        if self.gradient_accumulation_steps < 1:
            raise ConfigError(f"ppo.gradient_accumulation_steps must be >= 1, "
                              f"got {self.gradient_accumulation_steps}")
        minibatches = self.ppo_epochs * (self.batch_size // self.mini_batch_size)
        if minibatches % self.gradient_accumulation_steps:
            raise ConfigError(f"ppo.gradient_accumulation_steps ({self.gradient_accumulation_steps})"
                              f" must divide the minibatches per PPO step (ppo_epochs x batch_size"
                              f" / mini_batch_size = {minibatches})")
        if not 0.0 <= self.escalate_below <= 1.0:
            raise ConfigError(f"ppo.escalate_below is a confidence in [0, 1], "
                              f"got {self.escalate_below}")
        if not 0.0 <= self.rollout_dropout < 1.0:
            raise ConfigError(f"ppo.rollout_dropout must be in [0, 1), got {self.rollout_dropout}")
        if self.critic_hidden_size % self.critic_heads:
            raise ConfigError("ppo.critic_hidden_size must be a multiple of ppo.critic_heads")
        if self.critic_layers < (1 if self.critic == "light" else 0):
            raise ConfigError(f"ppo.critic_layers must be >= 1 for the light critic, >= 0 for "
                              f"trunk/shared (0 = a quarter of the policy's), "
                              f"got {self.critic_layers}")
        if self.reward_attention_on and self.critic == "trunk":
            raise ConfigError("ppo.reward_attention_on needs critic light or shared (the trunk "
                              "critic's attention is the policy's own)")
        self._check_schedule()
        self._check_tiers()
        if self.dynamic_sampling_rounds < 1:
            raise ConfigError(f"ppo.dynamic_sampling_rounds must be >= 1, "
                              f"got {self.dynamic_sampling_rounds}")
        if self.group_size < 1 or self.batch_size % self.group_size:
            raise ConfigError(f"ppo.group_size ({self.group_size}) must be >= 1 and divide "
                              f"ppo.batch_size ({self.batch_size})")
        if self.advantage_estimator != "gae" and self.group_size < 2:
            raise ConfigError(f"ppo.advantage_estimator {self.advantage_estimator} needs "
                              f"ppo.group_size >= 2 samples of each prompt")
        for name in ("prune_run", "prune_calibration_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"ppo.{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 < self.prune_percentile < 100.0:
            raise ConfigError(f"ppo.prune_percentile is a percentile in (0, 100), "
                              f"got {self.prune_percentile}")
        if self.prune_ngram < 0:
            raise ConfigError(f"ppo.prune_ngram must be >= 0 (0 = no repetition test), "
                              f"got {self.prune_ngram}")
        if self.prune_top_k < 2:
            raise ConfigError(f"ppo.prune_top_k must be >= 2, got {self.prune_top_k}")
        if not 0.0 <= self.resample_sigma <= 5.0:
            raise ConfigError(f"ppo.resample_sigma (standard deviations below the batch mean) "
                              f"must be in [0, 5], got {self.resample_sigma}")
        for name in ("resample_low_frac", "resample_max_share"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ConfigError(f"ppo.{name} is a fraction in (0, 1], got {getattr(self, name)}")
        try:
            check_lambda_eps_table(self.lambda_eps_table)
        except ValueError as exc:
            raise ConfigError(f"ppo.{exc}") from None


    def _check_tiers(self) -> None:
        """Level 0 / 2 and RM evolution; each error names its key."""
        for name in ("escalate_score_quantile", "rm_drop"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"ppo.{name} must be in [0, 1), got {getattr(self, name)}")
        if not 0.0 < self.escalate_max_share <= 1.0:
            raise ConfigError(f"ppo.escalate_max_share is a share of the batch in (0, 1], "
                              f"got {self.escalate_max_share}")
        for name in ("escalate_window", "rm_check_every", "rm_queue_max", "rm_finetune_epochs"):
            if getattr(self, name) < 1:
                raise ConfigError(f"ppo.{name} must be >= 1, got {getattr(self, name)}")
        if self.rm_check_samples < 4:
            raise ConfigError(f"ppo.rm_check_samples must be >= 4 (a Spearman needs samples), "
                              f"got {self.rm_check_samples}")
        if self.human_labels_per_step < 0:
            raise ConfigError(f"ppo.human_labels_per_step must be >= 0, "
                              f"got {self.human_labels_per_step}")
        if not 0.0 < self.rm_finetune_lr < 1.0:
            raise ConfigError(f"ppo.rm_finetune_lr must be in (0, 1), got {self.rm_finetune_lr}")
        if self.escalate_uncertain and not self.schedule_on:
            raise ConfigError("ppo.escalate_uncertain reads the rollout scheduler's "
                              "high-uncertainty clusters: it needs ppo.schedule_on")

    def _check_replay(self) -> None:
        """The replay buffer's fields (features/replay.py)."""
        if not 0.0 < self.replay_fraction < 1.0:
            raise ConfigError(f"ppo.replay_fraction is a share of the batch in (0, 1) (fresh "
                              f"rollouts must keep filling the buffer), got {self.replay_fraction}")
        if not self.replay_on:
            return
        n = round(self.replay_fraction * self.batch_size)
        if not 1 <= n < self.batch_size:
            raise ConfigError(f"ppo.replay_fraction x ppo.batch_size must round to between 1 and "
                              f"batch_size - 1 rows, got {self.replay_fraction} x "
                              f"{self.batch_size}")
        if self.replay_size < n:
            raise ConfigError(f"ppo.replay_size ({self.replay_size}) must hold at least the "
                              f"{n} rows a step replays")
        if self.advantage_estimator != "gae" or self.group_size != 1:
            raise ConfigError("ppo.replay_on needs advantage_estimator gae with group_size 1 "
                              "(a group estimator compares fresh samples of one prompt)")

    @property
    def level2_on(self) -> bool:
        """Whether any Level-2 trigger is on (escalation needs a strong RM then)."""
        return (self.escalate_below > 0 or self.escalate_score_quantile > 0
                or self.escalate_high_risk or self.escalate_uncertain)

    def _check_schedule(self) -> None:
        """The scheduler's fields; each error names its key in the ppo section."""
        if self.schedule_neighbours < 1:
            raise ConfigError(f"ppo.schedule_neighbours must be >= 1, "
                              f"got {self.schedule_neighbours}")
        if not 1 <= self.schedule_min_low <= self.schedule_neighbours:
            raise ConfigError(f"ppo.schedule_min_low must be in [1, ppo.schedule_neighbours = "
                              f"{self.schedule_neighbours}], got {self.schedule_min_low}")
        if not self.schedule_low > 0:
            raise ConfigError(f"ppo.schedule_low (a variance threshold) must be > 0, "
                              f"got {self.schedule_low}")
        if not self.schedule_high >= self.schedule_low:
            raise ConfigError(f"ppo.schedule_high must be >= ppo.schedule_low "
                              f"({self.schedule_low}), got {self.schedule_high}")
        if self.schedule_scale == "standardised" and self.schedule_low >= 1.0:
            raise ConfigError(f"ppo.schedule_low must be < 1 with ppo.schedule_scale "
                              f"standardised (a share of the run's reward variance), "
                              f"got {self.schedule_low}")
        if self.schedule_window < 2:
            raise ConfigError(f"ppo.schedule_window must be >= 2 (a variance needs two "
                              f"rewards), got {self.schedule_window}")
        if not 0.0 <= self.schedule_explore_base <= 1.0:
            raise ConfigError(f"ppo.schedule_explore_base is a probability in [0, 1], "
                              f"got {self.schedule_explore_base}")
        if self.schedule_explore_horizon < 1:
            raise ConfigError(f"ppo.schedule_explore_horizon must be >= 1 (steps), "
                              f"got {self.schedule_explore_horizon}")

def with_values(cfg: PPOConfig, **values) -> PPOConfig:
    """`dataclasses.replace` that also sets registered extension keys (`PPOConfig.extra`)."""
    return replace(cfg, **PPOConfig.split({**values, "extra": cfg.extra}))


def __getattr__(name: str):
    if name == "PLAIN_PPO":  # the switches that make a run something other than plain PPO
        from rlhf.pipeline.ppo.features.registry import plain_values

        return plain_values()
    raise AttributeError(name)


def plain(cfg: PPOConfig) -> PPOConfig:
    """`cfg` with every feature switch at its plain-PPO value (budget, sampling, learning rates
    and the rest unchanged): the baseline every rollout-economy claim is a ratio against.
    Diagnostics that never change an update (gradnorm_diagnostics_on, debug_rollouts) are not
    switches."""
    from rlhf.pipeline.ppo.features.registry import plain_values

    return with_values(cfg, **plain_values())


def features_on(cfg: PPOConfig) -> dict[str, object]:
    """{switch: value} of the switches where `cfg` differs from plain PPO."""
    from rlhf.pipeline.ppo.features.registry import plain_values

    return {k: getattr(cfg, k) for k, v in plain_values().items() if getattr(cfg, k) != v}


# the fields of the loop itself, owned by no feature (a test checks every field is one or the
# other, so a feature cannot add a field without declaring it)
CORE_FIELDS = (
    "seed", "total_steps", "total_tokens", "batch_size", "mini_batch_size", "ppo_epochs",
    "temperature", "top_p", "max_new_tokens", "max_prompt_tokens", "generation_timeout_s",
    "learning_rate", "critic_learning_rate", "max_grad_norm", "gamma", "gae_lambda",
    "advantage_estimator", "group_size", "clip_range", "clip_range_value", "whiten_advantages",
    "kl_coef", "kl_estimator", "gradnorm_diagnostics_on", "gradnorm_reference_steps",
    "gradnorm_shift_decades", "gradnorm_bimodal_separation", "critic_huber_delta",
    "critic_kl_reg_coef", "checkpoint_every", "csv_every", "debug_rollouts",
    "attn_implementation", "heldout_eval", "eval_seed", "sharding",
    "gradient_accumulation_steps", "extra")


def attn_implementation(requested: str = "auto") -> str:
    """flash_attention_2 when flash_attn imports (GPU runs), else PyTorch SDPA."""
    if requested != "auto":
        return requested
    try:
        import flash_attn  # noqa: F401
    except Exception:  # ImportError, or a broken CUDA build
        return "sdpa"
    return "flash_attention_2"


def check_gradient_accumulation(steps: int, world_size: int) -> None:
    """ConfigError unless gradient accumulation is a multiple of the world size (seed 000 §5.5:
    otherwise ZeRO-3's all-gathers do not line up with the update cadence)."""
    if steps < 1 or steps % world_size:
        raise ConfigError(f"gradient_accumulation_steps ({steps}) must be a positive multiple of "
                          f"the number of processes ({world_size}) (seed 000 §5.5)")
