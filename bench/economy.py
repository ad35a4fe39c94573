"""The rollout-economy benchmark: held-out gold against generated tokens, arm by arm, seed by
seed, written to BENCHMARKS.md (docs/benchmarks.md; how sample efficiency is reported:
docs/methods.md).

    .venv/bin/python bench/economy.py --jobs 2          # every arm x seeds 0 1 2 -> BENCHMARKS.md
    .venv/bin/python bench/economy.py --arms plain seed   # two arms, one job at a time
    .venv/bin/python bench/economy.py --report-only         # the report from the saved results
    .venv/bin/python bench/economy.py --quick --out /tmp/q  # tiny world, 2 arms, 1 seed, < 90 s

Arms (`ARMS`): `plain` = plain(params.yaml ppo), every feature switch off; `seed` = params.yaml's
ppo section as the ppo stage runs it (stratified batches from the difficulty table); `grpo` and
`rloo` = current TRL's trainers on the same SFT policy, light RM, prompts, sampling and budget
(bench/economy_peers.py). A rollout-economy feature becomes an arm by adding one line here:
its PPOConfig switches on top of `seed` (the feature alone) or of another arm.

Every arm x seed trains with the same budget: `--steps` PPO steps of `batch_size` rollouts and at
most `--tokens` generated tokens (default: steps x batch_size x max_new_tokens, the most `steps`
PPO steps can generate; the peers stop there, our trainer only at `--steps` until its config has
a token budget, and no comparison goes past it). Its saved checkpoints are scored by the gold judge on the held-out
prompts (pipeline/heldout_prompts.py) by `rlhf.pipeline.ppo.heldout_gold.gold_eval`, sampled as PPO
samples (`sampling_of`) with ppo.eval_seed for every policy, the SFT policy being the point at 0
tokens; curves are
interpolated on cumulative generated tokens. Each arm x seed is one subprocess with one torch
thread (RLHF_TORCH_THREADS=1) whose result lands in <out>/results/<arm>/seed<k>.json, so arms run
one at a time and a rerun skips what is there (unless --force) as long as the inputs (hashes of
the SFT policy, the light RM and the prompts) and the budget are unchanged.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RLHF_TORCH_THREADS", "1")

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))


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
    # rollout economy II: the prompt-embedding rollout scheduler alone on plain PPO
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
    # rollout economy III (pipeline/ppo/features/tiers.py): Level 0's high-risk route, a low
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
             "critic_max_tokens": 16, "kl_warmup_steps": 3, "gradnorm_reference_steps": 2,
             "attn_implementation": "eager"}
QUICK_STEPS = 8
QUICK_POINTS = 4


# --------------------------------------------------------------------------- the setup
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


def prepare(args, snapshot: bool = True) -> dict:
    """Snapshot the inputs under <out>/inputs (every job of a report reads the same files, even
    if the artifacts are regenerated meanwhile) and write <out>/setup.json; returns it. Without
    `snapshot` (the DVC stages, whose deps pin the artifacts) the artifacts are read in place,
    feature inputs from their pipeline paths, and setup.json hashes only what every arm reads."""
    from rlhf.pipeline.config import load_section
    from rlhf.pipeline.ppo.generate import sampling_of
    from rlhf.store.hashing import content_hash, tree_hash

    out = args.out
    inputs = out / "inputs"
    base = load_section(args.params, "ppo")
    if args.quick:
        import economy_world

        scratch = Path(tempfile.mkdtemp(prefix="economy-quick-"))
        world = economy_world.build(scratch)
        src = {"sft": world["sft"], "rm_light": world["rm_light"], "pool": world["pool"]}
        held = [tuple(p) for p in json.loads(world["held_out"].read_text())]
        base = replace(base, **QUICK_PPO)
        strong = None
    else:
        from rlhf.pipeline.heldout_prompts import held_out_prompts

        a = args.artifacts
        src = {"sft": a / "models" / "sft", "rm_light": a / "models" / "rm_light",
               "pool": a / "store" / "pool"}
        if (a / "store" / "difficulty").is_dir():
            src["difficulty"] = a / "store" / "difficulty"
        if (a / "store" / "pool_embeddings").is_dir():  # the scheduler arm's prompt space
            src["pool_embeddings"] = a / "store" / "pool_embeddings"
        missing = [str(p) for p in src.values() if not p.exists()]
        if missing:
            raise SystemExit(f"missing inputs (run `dvc repro ppo` first): {', '.join(missing)}")
        held = held_out_prompts(a / "store")
        strong = a / "models" / "rm_strong" if (a / "models" / "rm_strong").is_dir() else None
    if not snapshot:
        return _write_setup(args, base, {k: v for k, v in src.items()
                                         if k not in SETUP_KEY}, held, strong)
    hashes = {k: tree_hash(v) if v.is_dir() else content_hash(v.read_text())[:16]
              for k, v in src.items()}
    # inputs only some arms read: in those arms' specs alone (spec_of), so adding one keeps
    # every other arm's saved results valid
    feature_hashes = {k: hashes.pop(k) for k in SETUP_KEY if k in hashes}
    if strong:  # Level 2 escalation reads it in place (263 MB): hashed, not copied
        feature_hashes["rm_strong"] = tree_hash(strong)
    old = json.loads((out / "setup.json").read_text()) if (out / "setup.json").exists() else {}
    inputs.mkdir(parents=True, exist_ok=True)
    old_hashes = {**old.get("hashes", {}), **old.get("feature_hashes", {})}
    for k, v in src.items():
        dst = inputs / v.name
        if old_hashes.get(k) != {**hashes, **feature_hashes}[k] or not dst.exists():
            shutil.rmtree(dst, ignore_errors=True) if dst.is_dir() else dst.unlink(missing_ok=True)
            (shutil.copytree if v.is_dir() else shutil.copy)(v, dst)
    if args.quick:
        shutil.rmtree(scratch, ignore_errors=True)
    extra_paths = {} if args.quick else tier_inputs(args, inputs, strong, feature_hashes)
    steps = args.steps or (QUICK_STEPS if args.quick else 2 * base.total_steps)
    tokens = args.tokens or steps * base.batch_size * base.max_new_tokens
    setup = {
        "judge": judge_setup(args), "params": str(args.params),
        "quick": bool(args.quick), "steps": steps, "token_budget": tokens, "points": args.points,
        "peer_group": PEER_GROUP,
        "paths": {**{k: str(inputs / v.name) for k, v in src.items()}, **extra_paths},
        "strong_reward": str(strong) if strong else None,
        "hashes": {**hashes, "held_out": content_hash(json.dumps(held))[:16]},
        "feature_hashes": feature_hashes,
        "held_out": held, "base_config": asdict(base), "budget_config": budget_config(base),
        # held-out prompt -> difficulty bucket (its own, else its cluster representative's)
        "held_out_buckets": ({} if args.quick else held_out_buckets(args.artifacts / "store",
                                                                   src.get("difficulty"), held)),
        # held-out gold sampled as PPO samples (the ppo stage's and the eval stage's one rule)
        "eval": {"n_prompts": len(held), **asdict(sampling_of(base)), "seed": base.eval_seed},
    }
    (out / "setup.json").write_text(json.dumps(setup, indent=1))
    return json.loads((out / "setup.json").read_text())  # as the jobs will read it


def _write_setup(args, base, src: dict, held: list, strong: Path | None) -> dict:
    """setup.json of the DVC stages: inputs in place (their hashes: the common ones only, the
    feature inputs are each arm stage's own deps)."""
    from rlhf.pipeline.ppo.generate import sampling_of
    from rlhf.store.hashing import content_hash, tree_hash

    a = args.artifacts
    steps = args.steps or 2 * base.total_steps
    tokens = args.tokens or steps * base.batch_size * base.max_new_tokens
    features = {"pool_embeddings": a / "store" / "pool_embeddings", "routes": a / "store" / "routes",
                "score_map": a / "models" / "rm_strong" / "score_map.json"}
    # no `base_config` here: each arm stage reads the ppo keys its run takes from params.yaml
    # itself (economy_dvc.arm_params), so a seed switch's default stales only the arms based on
    # the seed, never plain PPO's; setup.json holds the budget's keys alone (SETUP_PPO_KEYS)
    setup = {
        "judge": judge_setup(args), "params": str(args.params), "quick": False, "dvc": True,
        "steps": steps, "token_budget": tokens, "points": args.points, "peer_group": PEER_GROUP,
        "budget_config": budget_config(base),
        "paths": {**{k: str(v) for k, v in src.items()}, **{k: str(v) for k, v in
                                                            features.items() if v.exists()}},
        "strong_reward": str(strong) if strong else None,
        "hashes": {**{k: tree_hash(v) if v.is_dir() else content_hash(v.read_text())[:16]
                      for k, v in src.items()}, "held_out": content_hash(json.dumps(held))[:16]},
        "feature_hashes": {}, "held_out": held,
        "held_out_buckets": held_out_buckets(a / "store", src.get("difficulty"), held),
        "eval": {"n_prompts": len(held), **asdict(sampling_of(base)), "seed": base.eval_seed},
    }
    args.setup_path.parent.mkdir(parents=True, exist_ok=True)
    args.setup_path.write_text(json.dumps(setup, indent=1))
    return json.loads(args.setup_path.read_text())


def tier_inputs(args, inputs: Path, strong: Path | None, feature_hashes: dict) -> dict:
    """Issue 15's inputs, made once per results folder from the snapshot: the strong-to-light
    score map (the strong RM folder's, else fitted here exactly as the reward stage's on-policy
    step fits it: `reward.onpolicy_k` SFT samples per ppo prompt at PPO's sampling, both RMs'
    scores, `ScoreMap.fit`) and Level 0's routes (the route stage on the snapshot)."""
    from rlhf.pipeline.config import load_config
    from rlhf.store.hashing import content_hash, tree_hash

    out: dict = {}
    if strong is not None:
        path = inputs / "score_map.json"
        if (strong / "score_map.json").is_file():
            shutil.copy(strong / "score_map.json", path)
        elif not path.is_file():
            from rlhf.pipeline.decode import Sampling
            from rlhf.pipeline.policy import load_policy
            from rlhf.pipeline.ppo.samplers import load_prompts
            from rlhf.pipeline.reward import load_scorer
            from rlhf.pipeline.reward.onpolicy import onpolicy_set
            from rlhf.pipeline.reward.score_map import ScoreMap

            rcfg, ppo = load_config(args.params, "reward"), load_config(args.params, "ppo")
            smp = Sampling(ppo.temperature, ppo.top_p, ppo.max_new_tokens)
            policy, tok = load_policy(inputs / "sft")
            prompts = [t for _, t in load_prompts(inputs / "pool")]
            print(f"fitting the strong-to-light score map on {len(prompts)} x {rcfg.onpolicy_k} "
                  "SFT samples", flush=True)
            data = onpolicy_set(policy, tok, prompts, rcfg.onpolicy_k, smp.temperature,
                                smp.top_p, smp.max_new_tokens, rcfg.seed + 3, rcfg.batch_size,
                                engine=rcfg.engine)
            s = load_scorer(strong)(data.prompts, data.responses)[0].tolist()
            li = load_scorer(inputs / "rm_light")(data.prompts, data.responses)[0].tolist()
            smap = ScoreMap.fit(s, li)
            smap.save(inputs)
            (inputs / "score_map_report.json").write_text(json.dumps(smap.report(s, li)))
        out["score_map"] = str(path)
        feature_hashes["score_map"] = content_hash(path.read_text())[:16]
    a = args.artifacts
    if (inputs / "pool_embeddings").is_dir() and (inputs / "difficulty").is_dir():
        from rlhf.pipeline.router import run as route

        topics = a / "world" / "topics.json"
        if not (inputs / "routes").is_dir():
            route(load_config(args.params, "router"), inputs / "pool", inputs / "pool_embeddings",
                  inputs / "difficulty", inputs / "routes", inputs / "router",
                  topics if topics.is_file() else None)
        out["routes"] = str(inputs / "routes")
        feature_hashes["routes"] = tree_hash(inputs / "routes")
    return out


WORLD_JUDGE = {"kind": "world_gold", "name": "world_gold"}


def judge_setup(args) -> dict:
    """params.yaml's `judge:` (the world's gold judge without one, and with --quick), its model
    folder (`--judge-model`, as the eval stage takes it) and what a result must match."""
    from rlhf.pipeline.config import read_params
    from rlhf.pipeline.judges import load_judge
    from rlhf.store.hashing import tree_hash

    if args.quick or "judge" not in read_params(args.params):
        return {"spec": WORLD_JUDGE}
    from rlhf.pipeline.config import load_config

    cfg = load_config(args.params, "judge")
    model = str(args.judge_model) if args.judge_model else None
    judge = load_judge(cfg, model)  # fails here, before any job, on a judge that cannot load
    src = Path(model or cfg.model) if cfg.kind != "world_gold" else None
    spec = {"kind": cfg.kind, "name": judge.name}
    if src is not None and src.is_dir():
        spec["model_hash"] = tree_hash(src)
    return {"spec": spec, "config": asdict(cfg), "model": model}


# the ppo keys the setup itself reads (the budget, the held-out sampling): the rest each arm
# stage reads on its own (economy_dvc.arm_params)
SETUP_PPO_KEYS = ("total_steps", "batch_size", "max_new_tokens", "temperature", "top_p",
                  "eval_seed")


def budget_config(base) -> dict:
    """The SETUP_PPO_KEYS of `base` (what the report's header and every arm share)."""
    return {k: getattr(base, k) for k in SETUP_PPO_KEYS}


def base_of(setup: dict, arm: Arm):
    """The PPOConfig `arm` starts from, before arm_config: plain(ppo) for arms based on plain
    PPO, the ppo section as it is for the seed's. From setup.json's `base_config` where it holds
    one (the snapshot runs), else read from the params file (the DVC stages, whose params
    declare exactly the keys this takes from it)."""
    from rlhf.pipeline.config import load_section
    from rlhf.pipeline.ppo.config import PPOConfig, plain

    base = (PPOConfig(**setup["base_config"]) if "base_config" in setup
            else load_section(Path(setup["params"]), "ppo"))
    return plain(base) if arm.base == "plain" else base


def spec_of(setup: dict, arm_name: str) -> dict:
    """What a saved result must share with the current setup to be reused."""
    if arm_name == "sft":
        return {"hashes": setup["hashes"], "eval": setup["eval"], "judge": judge_spec(setup)}
    spec = {"arm": asdict(ARMS[arm_name]), "steps": setup["steps"], "points": setup["points"],
            "token_budget": setup["token_budget"], "hashes": setup["hashes"],
            "eval": setup["eval"], "base_config": json.loads(json.dumps(asdict(base_of(setup, ARMS[arm_name])))),
            "judge": judge_spec(setup)}
    used = {k: v for k, v in setup.get("feature_hashes", {}).items()
            if reads(ARMS[arm_name], k)}
    if used:
        spec["feature_hashes"] = used
    return spec


def judge_spec(setup: dict) -> dict:
    """Who gives the verdict (params.yaml `judge:`, pipeline/judges.py): its kind, its name and
    the hash of its model folder, so results of two judges never mix."""
    return setup.get("judge", {}).get("spec", WORLD_JUDGE)


def held_out_buckets(store: Path, difficulty: Path | None, held: list) -> dict[str, str]:
    """{held-out prompt id: difficulty bucket}: the difficulty table covers the pool (every
    split); a `similar` member takes its representative's bucket."""
    if difficulty is None:
        return {}
    from rlhf.store.io import read_table

    bucket = {r["prompt_id"]: r["bucket"] for r in
              read_table("difficulty", difficulty).select(["prompt_id", "bucket"]).to_pylist()}
    rep = {r["prompt_id"]: r["representative_id"] for r in
           read_table("similar", store / "similar").select(
               ["prompt_id", "representative_id"]).to_pylist()}
    out = {}
    for pid, _ in held:
        b = bucket.get(pid) or bucket.get(rep.get(pid, ""))
        if b is not None:
            out[pid] = b
    return out


def result_path(out: Path, arm: str, seed: int | None) -> Path:
    return out / "results" / ("sft.json" if arm == "sft" else f"{arm}/seed{seed}.json")


def spec_matches(saved: dict | None, spec: dict) -> bool:
    """Whether a saved result's spec is the current one. A PPOConfig field that did not exist
    when the result was saved counts as its dataclass default: a new feature switch defaults to
    off (the behaviour the saved run had), so adding one does not invalidate every result; a
    result saved before the judge was recorded was judged by the world's gold judge."""
    if not saved:
        return False
    saved = {"judge": WORLD_JUDGE, **saved}  # saved before the judge was a choice: the world's
    if {k: v for k, v in saved.items() if k != "base_config"} != {
            k: v for k, v in spec.items() if k != "base_config"}:
        return False
    from dataclasses import fields

    from rlhf.pipeline.ppo.config import PPOConfig

    defaults = {f.name: f.default for f in fields(PPOConfig)}
    old, new = saved.get("base_config", {}), spec.get("base_config", {})
    return all(old.get(k, defaults.get(k)) == new.get(k, defaults.get(k))
               for k in set(old) | set(new))


def load_result(path: Path, spec: dict) -> dict | None:
    if not path.exists():
        return None
    res = json.loads(path.read_text())
    return res if spec_matches(res.get("spec"), spec) else None


# --------------------------------------------------------------------------- one job
_JUDGES: dict = {}


def judge_of(setup: dict):
    """The setup's judge (loaded once per job process)."""
    from rlhf.pipeline.judges import load_judge

    j = setup.get("judge") or {}
    if "config" not in j or j["spec"] == WORLD_JUDGE:
        return None  # the world's gold judge (gold_eval's default)
    key = json.dumps(j["spec"], sort_keys=True)
    if key not in _JUDGES:
        _JUDGES[key] = load_judge(judge_config(setup), j.get("model"))
    return _JUDGES[key]


def judge_config(setup: dict):
    """The setup's `judge:` section as a JudgeConfig again (setup.json holds it as plain data)."""
    from rlhf.pipeline.judges import JudgeConfig
    from rlhf.pipeline.reward.train import RmTrainConfig

    cfg = dict(setup["judge"]["config"])
    return JudgeConfig(**{**cfg, "train": RmTrainConfig(**cfg["train"])})


def gold_of(policy_folder: Path, setup: dict) -> dict:
    """Held-out gold; with the setup's difficulty buckets also `by_bucket` (gold mean and count
    per bucket of the held-out prompts: is the hard tail learning too?)."""
    from rlhf.pipeline.decode import Sampling
    from rlhf.pipeline.ppo.heldout_gold import gold_eval

    e = setup["eval"]
    sampling = Sampling(e["temperature"], e["top_p"], e["max_new_tokens"])
    held = [tuple(p) for p in setup["held_out"]]
    g = gold_eval(policy_folder, held, sampling, e["seed"], judge=judge_of(setup),
                  per_prompt=True)
    scores = g.pop("scores")
    buckets = setup.get("held_out_buckets") or {}
    if buckets:
        by: dict[str, list[float]] = {}
        for (pid, _), x in zip(held, scores):
            if pid in buckets:
                by.setdefault(buckets[pid], []).append(x)
        g["by_bucket"] = {b: {"n": len(v), "gold_mean": round(sum(v) / len(v), 4)}
                          for b, v in sorted(by.items())}
    return g


def gold_of_weights(weights: Path, setup: dict, scratch: Path) -> dict:
    """Gold of the SFT architecture with a saved state_dict loaded into it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sft = setup["paths"]["sft"]
    model = AutoModelForCausalLM.from_pretrained(sft, dtype=torch.float32)
    model.load_state_dict(torch.load(weights, map_location="cpu"))
    shutil.rmtree(scratch, ignore_errors=True)
    model.save_pretrained(scratch)
    AutoTokenizer.from_pretrained(sft).save_pretrained(scratch)
    try:
        return gold_of(scratch, setup)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run_job(setup: dict, out: Path, arm_name: str, seed: int | None) -> dict:
    """Train one arm x seed (or evaluate SFT), evaluate its checkpoints, save the result."""
    from rlhf.pipeline.ppo.config import features_on

    if arm_name == "sft":
        t = time.perf_counter()
        g = gold_of(Path(setup["paths"]["sft"]), setup)
        res = {"arm": "sft", "gold": g, "seconds_eval": round(time.perf_counter() - t, 2),
               "spec": spec_of(setup, "sft")}
        return _save(out, "sft", None, res, setup)
    arm = ARMS[arm_name]
    cfg = arm_config(base_of(setup, arm), arm, seed, setup["steps"], setup["points"], setup["token_budget"])
    work = out / "work" / arm_name / f"seed{seed}"
    shutil.rmtree(work, ignore_errors=True)
    paths = setup["paths"]
    stratified = bool(arm.stratified and paths.get("difficulty"))
    t = time.perf_counter()
    sample_economy = None
    if arm.trainer == "ppo":
        from rlhf.pipeline.ppo.trainer import run

        scheduled = getattr(cfg, "schedule_on", False)
        probe = None
        if cfg.prune_on or cfg.resample_on:  # the measurements (economy_sample.py)
            from economy_sample import Probe

            probe = Probe(work / "probe.jsonl")
        tiered = {}
        if any(reads(arm, k) for k in ("rm_strong", "routes")) or cfg.human_labels_per_step:
            tiered = tier_run_args(cfg, arm, paths, work, setup)
        inputs = {"strong_reward": setup["strong_reward"] if reads(arm, "rm_strong") else None,
                  **({"embeddings": paths["pool_embeddings"]} if scheduled else {}),
                  **tiered.pop("inputs", {})}
        run(cfg, paths["sft"], paths["rm_light"], paths["pool"], work, work / "rollouts",
            run_id=f"{arm_name}-seed{seed}", progress=False,
            difficulty=paths["difficulty"] if stratified else None, probe=probe, inputs=inputs,
            tables={**({"schedule": work / "schedule"} if scheduled else {}),
                    **tiered.pop("tables", {})}, **tiered)
        seconds_train = time.perf_counter() - t
        cum = {}
        for line in (work / "metrics.jsonl").read_text().splitlines():
            m = json.loads(line)
            cum[m["step"]] = m
        summary = json.loads((work / "summary.json").read_text())
        cost = {k[:-4]: v for k, v in summary["cost"].items() if k.endswith("_cum")}
        ckpts = [(int(d.name.split("-")[1]), d / "policy.pt")
                 for d in sorted((work / "checkpoints").glob("step-*"))]
        marks = [(step, cum[step]["tokens_generated_cum"], pt,
                  {k[:-4]: v for k, v in cum[step].items() if k.endswith("_cum")})
                 for step, pt in ckpts]
        if probe is not None:
            from economy_sample import summarize

            sample_economy = summarize(probe.path, cost)
    else:
        from economy_peers import train_peer
        from rlhf.pipeline.ppo.samplers import load_prompts

        peer = train_peer(arm.trainer, cfg, Path(paths["sft"]), Path(paths["rm_light"]),
                          load_prompts(Path(paths["pool"])), work, setup["token_budget"],
                          setup["peer_group"], **arm.peer)
        seconds_train = time.perf_counter() - t
        cost = peer["cost"]
        marks = [(c["step"], c["tokens_generated"], Path(c["folder"]) / "policy.pt",
                  c.get("cost", {})) for c in peer["checkpoints"]]
    t = time.perf_counter()
    points = []
    for step, tokens, pt, counts in marks:  # counts: the cumulative cost at that checkpoint
        g = gold_of_weights(pt, setup, work / "eval-policy")
        points.append({"step": step, "tokens": tokens, **g, "cost": counts})
    extra = {}
    if arm.trainer == "ppo" and getattr(cfg, "schedule_on", False):
        from economy_schedule import job_figures  # trigger rate, staleness, SFT by bucket

        extra["schedule"] = job_figures(work, f"{arm_name}-seed{seed}", cfg, setup, gold_of,
                                        judge_of(setup))
    if arm.trainer == "ppo" and (work / "rm_scores").is_dir():
        from economy_tiers import job_figures as tier_figures

        extra["tiers"] = tier_figures(work, f"{arm_name}-seed{seed}", setup, judge_of(setup))
    res = {"arm": arm_name, "seed": seed, "trainer": arm.trainer, **extra,
           "features_on": features_on(cfg) if arm.trainer == "ppo" else {},
           "stratified": stratified,
           "points": points, "cost": cost, "seconds_train": round(seconds_train, 2),
           **({"sample_economy": sample_economy} if sample_economy else {}),
           "seconds_eval": round(time.perf_counter() - t, 2), "spec": spec_of(setup, arm_name)}
    _save(out, arm_name, seed, res, setup)
    if not os.environ.get("ECONOMY_KEEP_WORK"):
        shutil.rmtree(work, ignore_errors=True)
        for empty in (work.parent, work.parent.parent):  # what another job is using stays
            try:
                empty.rmdir()
            except OSError:
                break
    return res


def tier_run_args(cfg, arm: Arm, paths: dict, work: Path, setup: dict) -> dict:
    """`trainer.run` arguments of the arms: the routes, the human queue's pool (params'
    preferences section) and table, the `rm_scores` table the tier figures read, and the score
    map from the inputs (the strong RM folder itself is read in place, 263 MB)."""
    from rlhf.pipeline.config import load_config
    from rlhf.pipeline.ppo.trainer import annotator_pool

    out = {"rm_scores": work / "rm_scores", "inputs": {"score_map": paths.get("score_map")}}
    if reads(arm, "routes"):
        out["inputs"]["routes"] = paths["routes"]
    if cfg.human_labels_per_step or (cfg.rm_evolve_on and cfg.rm_label_source == "annotators"):
        params = Path(setup.get("params", REPO / "params.yaml"))
        out["inputs"]["annotators"] = annotator_pool(load_config(
            params, "preferences", ("annotators", "seed", "labels")))
        out["tables"] = {"human_labels": work / "human_labels"}
    return out


def code_version() -> str:
    """The checkout's commit, `+dirty` when tracked files differ from it."""
    def git(*a):
        return subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True,
                              check=False).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def provenance(paths: list[str]) -> dict:
    """What a result was made by: the commit, the git object id of each file it ran (as it was
    on disk) and the files that differed from the commit (a dirty tree, as far as this job's
    code goes; the DVC lock files and the reports a stage writes do not count)."""
    def git(*a):
        return subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True,
                              check=False).stdout.split()

    head = (git("rev-parse", "HEAD") or ["unknown"])[0]
    on_disk = [p for p in paths if (REPO / p).is_file()]
    ids = dict(zip(on_disk, git("hash-object", "--", *on_disk))) if on_disk else {}
    committed = committed_ids(paths)
    return {"commit": head, "deps": {p: ids.get(p) for p in paths},
            "dirty": sorted(p for p in paths if ids.get(p) != committed.get(p))}


def committed_ids(paths: list[str], commit: str = "HEAD") -> dict[str, str]:
    """{path: git object id at `commit`} of those of `paths` the commit has."""
    if not paths:
        return {}
    proc = subprocess.run(["git", "ls-tree", commit, "--", *paths], cwd=REPO,
                          capture_output=True, text=True, check=False)
    out = {}
    for line in proc.stdout.splitlines():
        meta, path = line.split("\t", 1)
        out[path] = meta.split()[2]
    return out


def job_code(setup: dict, arm: str) -> list[str]:
    """The repository files a job runs (bench/economy_dvc.py: the DVC stage's code deps)."""
    import economy_dvc

    if arm == "sft":
        return sorted(economy_dvc.SHARED_CODE)
    return economy_dvc.arm_code(arm, base_of(setup, ARMS[arm]))


def _save(out: Path, arm: str, seed: int | None, res: dict, setup: dict | None = None) -> dict:
    res["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    res["code"] = code_version()
    if setup is not None:
        res["provenance"] = provenance(job_code(setup, arm))
    res["command"] = os.environ.get("ECONOMY_COMMAND", "")
    path = result_path(out, arm, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(res, indent=1))
    tmp.replace(path)
    return res


# --------------------------------------------------------------------------- the driver
# seconds per PPO step (16 rollouts), per generation batch of a peer and per gold evaluation
# (211 prompts), measured on the embedded default on 2 shared cores, one thread a job (plain
# 2.8 s/step, seed 2.7, GRPO 1.5 with TRL's cached generation, eval 7.5 s); a projection uses
# the saved results' own timings where there are any
DEFAULT_SECONDS = {"ppo_step": 2.8, "peer_step": 1.5, "eval": 7.5, "startup": 15.0}


def projected_seconds(setup: dict, out: Path, jobs: list[tuple[str, int | None]]) -> float:
    total = 0.0
    for arm_name, seed in jobs:
        if arm_name == "sft":
            total += DEFAULT_SECONDS["startup"] + DEFAULT_SECONDS["eval"]
            continue
        done = [r for r in (load_result(p, spec_of(setup, arm_name))
                            for p in (out / "results" / arm_name).glob("seed*.json")) if r]
        if done:
            total += sum(d["seconds_train"] + d["seconds_eval"] for d in done) / len(done)
            total += DEFAULT_SECONDS["startup"]
            continue
        kind = "ppo_step" if ARMS[arm_name].trainer == "ppo" else "peer_step"
        scale = 0.05 if setup["quick"] else 1.0
        total += (DEFAULT_SECONDS["startup"] + scale * (
            setup["steps"] * DEFAULT_SECONDS[kind]
            + (setup["points"] + 1) * DEFAULT_SECONDS["eval"]))
    return total


def drive(args, setup: dict) -> list[str]:
    """Run the missing jobs, `args.jobs` subprocesses at a time; returns the failures."""
    from concurrent.futures import ThreadPoolExecutor

    todo = []
    for arm_name, seed in [("sft", None)] + [(a, s) for a in args.arms for s in args.seeds]:
        spec = spec_of(setup, arm_name)
        if args.force and arm_name != "sft" or load_result(
                result_path(args.out, arm_name, seed), spec) is None:
            todo.append((arm_name, seed))
    est = projected_seconds(setup, args.out, todo)
    print(f"economy: {len(todo)} job(s) to run ({', '.join(f'{a}:{s}' for a, s in todo) or '-'});"
          f" projected {est / 60:.1f} min of one core, ~{est / 60 / max(1, args.jobs):.1f} min "
          f"with --jobs {args.jobs}", flush=True)
    if args.dry_run:
        return []
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)

    def launch(job):
        arm_name, seed = job
        log = logs / f"{arm_name}-{seed}.log"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--out", str(args.out),
               "--job", arm_name, str(-1 if seed is None else seed)]
        t = time.perf_counter()
        with open(log, "w") as fh:
            rc = subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT,
                                 env={**os.environ, "ECONOMY_COMMAND": args.command})
        print(f"economy: {arm_name} seed {seed}: {'ok' if rc == 0 else f'FAILED rc={rc} ({log})'}"
              f" in {time.perf_counter() - t:.0f} s", flush=True)
        return None if rc == 0 else f"{arm_name}:{seed}"

    first = [j for j in todo if j[0] == "sft"]
    failed = [f for f in map(launch, first) if f]
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        failed += [f for f in pool.map(launch, [j for j in todo if j[0] != "sft"]) if f]
    return failed


def dvc_stage(what: list[str]) -> int:
    """One stage of bench/dvc.yaml, run from bench/ (paths repository-relative, so a clone
    elsewhere hashes the same setup)."""
    import economy_dvc

    bp = economy_dvc.bench_params()
    os.chdir(BENCH)
    args = argparse.Namespace(
        artifacts=Path("../artifacts"), params=Path("../params.yaml"), quick=False,
        judge_model=None, steps=bp["steps"] or None, tokens=bp["tokens"] or None,
        points=bp["points"], out=Path("."), setup_path=Path("results/setup.json"))
    stage = what[0]
    if stage == "setup":
        prepare(args, snapshot=False)
        return 0
    setup = json.loads(args.setup_path.read_text())
    if stage in ("report", "report_all"):
        from economy_report import write_report

        arms = bp["headline"] if stage == "report" else list(ARMS)
        unknown = sorted(set(arms) - set(ARMS))
        if unknown:
            raise SystemExit(f"bench/params.yaml headline: unknown arm(s) {', '.join(unknown)}")
        report = Path("../BENCHMARKS.md") if stage == "report" else Path("BENCHMARKS_ALL.md")
        command = "make bench" if stage == "report" else "make bench-all"
        write_report(setup, Path("."), report, arms, BASELINE, command, ARMS,
                     seeds=bp["seeds"], figures=Path("figures") / report.stem.lower(),
                     timing=bp.get("timing", "none"))
        print(f"economy: wrote {report} from {len(arms)} arm(s) x seeds {bp['seeds']}")
        return 0
    from rlhf.pipeline.policy import quiet_hf

    quiet_hf()
    if stage == "sft":
        run_job(setup, Path("."), "sft", None)
    elif stage in ARMS and len(what) == 2:
        run_job(setup, Path("."), stage, int(what[1]))
    else:
        raise SystemExit(f"unknown stage {' '.join(what)!r}: setup | sft | ARM SEED | report | "
                         "report_all")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--artifacts", type=Path, default=Path("artifacts"))
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--out", type=Path, default=None,
                    help="results folder (default artifacts/bench/economy)")
    ap.add_argument("--report", type=Path, default=None,
                    help="the report (default BENCHMARKS.md; <out>/BENCHMARKS.md with --quick)")
    ap.add_argument("--judge-model", type=Path, default=None,
                    help="the judge's RM folder (params.yaml judge.kind heldout_rm: what `rlhf "
                         "judge` wrote; kind rm: overrides judge.model)")
    ap.add_argument("--arms", nargs="+", default=None, choices=list(ARMS))
    ap.add_argument("--seeds", nargs="+", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None,
                    help="PPO steps per run (default 2 x params.yaml ppo.total_steps)")
    ap.add_argument("--tokens", type=int, default=None,
                    help="generated-token budget per run (default steps x batch x max_new_tokens)")
    ap.add_argument("--points", type=int, default=None,
                    help=f"gold checkpoints a run (default {EVAL_POINTS}; --quick {QUICK_POINTS})")
    ap.add_argument("--jobs", type=int, default=1, help="arm x seed jobs in parallel")
    ap.add_argument("--force", action="store_true", help="rerun jobs that have results")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the jobs and the projected time, run nothing")
    ap.add_argument("--quick", action="store_true", help="tiny world, plain + seed, seed 0")
    ap.add_argument("--job", nargs=2, metavar=("ARM", "SEED"), help=argparse.SUPPRESS)
    ap.add_argument("--dvc", nargs="+", metavar="STAGE",
                    help="one bench/dvc.yaml stage: setup | sft | ARM SEED | report | report_all")
    args = ap.parse_args(argv)
    if args.dvc:
        return dvc_stage(args.dvc)
    args.out = args.out or (args.artifacts / "bench" / "economy")
    args.points = args.points or (QUICK_POINTS if args.quick else EVAL_POINTS)
    if args.job:  # one arm x seed, in its own process (what drive() launches)
        from rlhf.pipeline.policy import quiet_hf

        quiet_hf()  # one torch thread (RLHF_TORCH_THREADS): 2 threads on 2 busy cores crawl
        setup = json.loads((args.out / "setup.json").read_text())
        seed = int(args.job[1])
        run_job(setup, args.out, args.job[0], None if seed < 0 else seed)
        return 0
    args.arms = args.arms or (["plain", "seed"] if args.quick else list(ARMS))
    args.seeds = args.seeds if args.seeds is not None else ([0] if args.quick else [0, 1, 2])
    args.report = (args.report or (args.out / "BENCHMARKS.md" if args.quick
                                   else REPO / "BENCHMARKS.md")).resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    args.command = "python bench/economy.py " + " ".join(sys.argv[1:] if argv is None else argv)
    t = time.perf_counter()
    failed: list[str] = []
    if args.report_only:
        setup = json.loads((args.out / "setup.json").read_text())
    else:
        setup = prepare(args)
        failed = drive(args, setup)
        if args.dry_run:
            return 0
    from economy_report import write_report

    write_report(setup, args.out, args.report, list(ARMS), BASELINE, args.command, ARMS)
    print(f"economy: report {args.report} ({time.perf_counter() - t:.0f} s)"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
