"""The benchmark's arms: each arm's trainer, the config it starts from and the switches on top
(`ARMS`), the families the report names a best arm of, and the --quick budget.

    .venv/bin/python -c "from bench.economy.arms import ARMS; print(list(ARMS))"
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Arm:
    trainer: str = "ppo"  # ppo (ours) | grpo | rloo (TRL)
    base: str = "seed"  # "plain": plain(params.yaml ppo); "seed": params.yaml ppo as it is
    overrides: dict = field(default_factory=dict)  # PPOConfig fields on top (a feature's switches)
    stratified: bool = False  # batches from the difficulty table, as the ppo stage draws them
    peer: dict = field(default_factory=dict)  # a TRL peer's options (economy_peers.train_peer)


# the switches, composed into its arms below. Issue 27 §6: with the native engine the default
# of the ppo stage, a switch's arm on plain PPO runs on it too (`NATIVE`): the same sampled
# distribution as plain PPO's `model.generate`, so only the switch changes what is learned,
# while a row the switch stops early leaves the batch and its compute is saved
NATIVE = {"engine": "native"}
LEVEL02 = {"escalate_below": 0.6, "escalate_score_quantile": 0.1, "escalate_high_risk": True,
           "escalate_max_share": 0.07, "escalate_map": "fitted", "human_labels_per_step": 1}
EVOLVE = {"rm_evolve_on": True}
ALL_ECONOMY = {"prune_on": True, "prune_ngram": 0, "prune_percentile": 40.0,
               "prune_treatment": "truncation", "schedule_on": True, **LEVEL02,
               "escalate_uncertain": True, **EVOLVE, "debug_rollouts": True}

ARMS: dict[str, Arm] = {
    "plain": Arm(base="plain"),
    "seed": Arm(base="seed", stratified=True),
    # seed 000 §3.2's light critic with reward-aware attention, on top of seed PPO (off there)
    "light_critic": Arm(base="seed", stratified=True,
                        overrides={"critic": "light", "critic_layers": 3,
                                   "reward_attention_on": True}),
    # critics defined relative to the policy (critic.py): its first layers copied and trained,
    # or shared and frozen under one trainable block (critic_layers 0: a quarter of the policy's)
    "trunk_critic": Arm(base="seed", stratified=True,
                        overrides={"critic": "trunk", "critic_layers": 0}),
    "trunk_critic_k2": Arm(base="seed", stratified=True,
                           overrides={"critic": "trunk", "critic_layers": 2}),
    "shared_critic": Arm(base="seed", stratified=True,
                         overrides={"critic": "shared", "critic_layers": 0,
                                    "reward_attention_on": True}),
    "shared_critic_k2": Arm(base="seed", stratified=True,
                            overrides={"critic": "shared", "critic_layers": 2}),
    # prompt_scheduler: the prompt-embedding rollout scheduler alone on plain PPO
    # (so its figures are against the baseline's own seeds); debug_rollouts keeps the texts the
    # staleness check scores with the gold judge (it changes no update)
    "scheduler": Arm(base="plain", overrides={**NATIVE, "schedule_on": True,
                                              "debug_rollouts": True}),
    # the same with a looser low threshold: at the seed's 0.3 (a tenth of a standardised
    # variance ~1) the 7-of-10 rule skipped 4 of 644 decisions in a 40-step seed-0 calibration;
    # 0.9 skipped ~15 % when replayed on that run's rewards (trigger-rate calibration only)
    "scheduler_loose": Arm(base="plain", overrides={**NATIVE, "schedule_on": True,
                                                    "debug_rollouts": True,
                                                    "schedule_low": 0.9, "schedule_high": 1.5}),
    # seed 000 §3.1 levels two and three (pipeline/ppo/features/sample_economy.py) on seed PPO
    "pruning": Arm(base="seed", stratified=True, overrides={"prune_on": True}),
    "resampling": Arm(base="seed", stratified=True, overrides={"resample_on": True}),
    "pruning_resampling": Arm(base="seed", stratified=True,
                              overrides={"prune_on": True, "resample_on": True}),
    "pruning_literal": Arm(base="seed", stratified=True,
                           overrides={"prune_on": True, "prune_rule": "literal"}),
    "pruning_literal_truncation": Arm(base="seed", stratified=True, overrides={
        "prune_on": True, "prune_rule": "literal", "prune_treatment": "truncation"}),
    "pruning_norep": Arm(base="seed", stratified=True, overrides={
        "prune_on": True, "prune_ngram": 0, "prune_percentile": 40.0}),
    "pruning_norep_truncation": Arm(base="seed", stratified=True, overrides={
        "prune_on": True, "prune_ngram": 0, "prune_percentile": 40.0,
        "prune_treatment": "truncation"}),
    # the Level 0-2 tiers (pipeline/ppo/features/tiers.py): Level 0's high-risk route, a low
    # light score (bottom 10 % of the recent ones) and the confidence gate trigger Level 2, at
    # most 7 % of a batch (the seed's goal: one rollout in 16), on the light scale through the
    # reward stage's score map; one sample a step to the human queue. Level 0's token budget is
    # left out: its complexity head is below the majority class (docs/README.md)
    "level02": Arm(base="plain", overrides={**NATIVE, **LEVEL02, "debug_rollouts": True}),
    # the light RM that evolves (pipeline/ppo/features/rm_evolution.py): the confidence gate keeps
    # unsure samples out of the update, a Spearman drop re-trains and swaps the light RM
    "rm_evolution": Arm(base="plain", overrides={**NATIVE, **EVOLVE, "rm_gate_mask_on": True,
                                                 "debug_rollouts": True}),
    # RM evolution alone, every sample trained on (the gate kept 14 % of them in rm_evolution:
    # the calibrated light RM is below 0.6 on most of the policy's own samples)
    "rm_evolution_ungated": Arm(base="plain", overrides={**NATIVE, **EVOLVE,
                                                         "debug_rollouts": True}),
    # the same with the annotator pool labelling every check sample (human labels, as the seed's
    # evolving RM has), not the strong RM, which the policy learns to fool as it does the light
    "rm_evolution_human": Arm(base="plain", overrides={**NATIVE, **EVOLVE,
                                                       "rm_label_source": "annotators",
                                                       "debug_rollouts": True}),
    # every rollout-economy feature together, on seed PPO (stratified batches), and the same
    # without the confidence gate's loss mask (which kept 14-16 % of the samples)
    "all_economy": Arm(base="seed", stratified=True, overrides={
        **ALL_ECONOMY, "rm_gate_mask_on": True}),
    "all_economy_ungated": Arm(base="seed", stratified=True, overrides=ALL_ECONOMY),
    "grpo": Arm(trainer="grpo", base="plain"),
    # DAPO's dynamic sampling on GRPO (veRL `filter_groups`): groups whose rewards do not vary
    # are dropped after generation and the batch is refilled from new prompts; every token
    # generated, the dropped groups' included, is counted
    "grpo_dapo": Arm(trainer="grpo", base="plain", peer={"filter_groups": True}),
    "rloo": Arm(trainer="rloo", base="plain"),
    # the peers' estimators inside our trainer (advantages.py): 4 prompts x 4 samples a step, no
    # critic run, so they combine with our economy features; DAPO's dynamic sampling on GRPO
    "grpo_ours": Arm(base="plain", overrides={**NATIVE, "advantage_estimator": "grpo",
                                              "group_size": 4, "whiten_advantages": False}),
    "rloo_ours": Arm(base="plain", overrides={**NATIVE, "advantage_estimator": "rloo",
                                              "group_size": 4, "whiten_advantages": False}),
    "dapo_ours": Arm(base="plain", overrides={**NATIVE, "advantage_estimator": "grpo",
                                              "group_size": 4, "whiten_advantages": False,
                                              "dynamic_sampling_on": True}),
    # the rollout engine (pipeline/decode/native.py): the same distribution, produced with less compute
    "engine_native": Arm(base="plain", overrides=NATIVE),
    "spec_lookup": Arm(base="plain", overrides={"engine": "native", "draft": "lookup",
                                                "draft_k": 4}),
    # self-speculative drafts (pipeline/decode/draft_model.py): the policy's first quarter of layers
    # with its head drafts 4 tokens from q, verified exactly (min(1, p/q), residual max(0, p-q))
    "spec_model": Arm(base="plain", overrides={"engine": "native", "draft": "model",
                                               "draft_k": 4, "draft_layers": 0}),
    # SPEC-RL's sample reuse (not exact): a prompt's previous response drafted and kept with
    # min(1, e^0.5 p / q_old), the rest sampled afresh at the first rejection
    "spec_reuse": Arm(base="plain", overrides={"engine": "native", "draft": "reuse",
                                               "draft_k": 4}),
    # seed 000 §2.2's replay buffer alone on plain PPO: half of each batch from the last 2,000
    # rollouts, trained with their stored old log-probs (the seed: final reward 17.3 % lower)
    "replay": Arm(base="plain", overrides={**NATIVE, "replay_on": True, "replay_size": 2000,
                                           "replay_fraction": 0.5}),
}
BASELINE = "plain"
# the rollout-economy families: the report names each family's best arm (gold at equal tokens);
# bench/params.yaml's `headline` runs that one of each under `make bench`
FAMILIES = {"peers": ("grpo", "grpo_dapo", "rloo"),
            "group estimators (ours)": ("grpo_ours", "rloo_ours", "dapo_ours"),
            "engine": ("engine_native", "spec_lookup", "spec_model", "spec_reuse", "replay"),
            "seed switches": ("seed",),
            "critic": ("light_critic", "trunk_critic", "trunk_critic_k2", "shared_critic",
                       "shared_critic_k2"), "scheduler": ("scheduler", "scheduler_loose"),
            "pruning": ("pruning", "resampling", "pruning_resampling", "pruning_literal",
                        "pruning_literal_truncation", "pruning_norep",
                        "pruning_norep_truncation"),
            "tiers": ("level02",),
            "rm evolution": ("rm_evolution", "rm_evolution_ungated", "rm_evolution_human"),
            "all economy": ("all_economy", "all_economy_ungated")}
# the setup's path keys of the feature inputs (features/inputs.py) the arms may read
SETUP_KEY = {"pool_embeddings": "embeddings", "rm_strong": "strong_reward",
             "score_map": "score_map", "routes": "routes"}


def reads(arm: Arm, key: str) -> bool:
    """Whether `arm` switches on a feature that reads input `key` (a setup path key): the
    feature registry says which switches read which input."""
    from rlhf.pipeline.ppo.features.registry import input_switches

    return any(arm.overrides.get(s) not in (None, False, 0, 0.0, "none")
               for s in input_switches().get(SETUP_KEY[key], ()))
PEER_GROUP = 4  # GRPO / RLOO samples per prompt (16 rollouts a step = 4 prompts x 4)
EVAL_POINTS = 6  # checkpoints per run besides SFT

# --quick: a tiny world (economy_world.py) and a budget that runs in seconds
QUICK_PPO = {"batch_size": 4, "mini_batch_size": 2, "ppo_epochs": 1, "max_new_tokens": 16,
             "max_prompt_tokens": 16, "learning_rate": 1e-3, "critic_learning_rate": 1e-3,
             "critic_hidden_size": 32, "critic_layers": 0, "critic_heads": 4,
             "critic_max_tokens": 16, "kl_warmup_steps": 3, "gradnorm_reference_steps": 2}
QUICK_STEPS = 8
QUICK_POINTS = 4


def arm_config(base_cfg, arm: Arm, seed: int, steps: int, points: int, tokens: int):
    """The PPOConfig an arm x seed trains with. Our trainer stops at `total_steps`; when its
    config grows a generated-token budget (`total_tokens`), the run also stops there, as the
    peers do. Until then the report cuts every curve at the token budget."""
    from dataclasses import fields

    from rlhf.pipeline.ppo.config import plain, with_values

    cfg = plain(base_cfg) if arm.base == "plain" else base_cfg
    cfg = with_values(cfg, **arm.overrides)
    budget = {"total_tokens": tokens} if "total_tokens" in {f.name for f in fields(cfg)} else {}
    return replace(cfg, seed=seed, total_steps=steps,
                   checkpoint_every=max(1, steps // points), **budget)
