"""The PPO loop: prompts -> generate -> score -> KL to the reference -> GAE -> PPO epochs -> log
-> checkpoint, built on transformers, accelerate and TRL's utilities (TRL's own PPOTrainer was
removed in 2026; see docs/design.md).

    rlhf ppo --policy artifacts/models/sft --reward artifacts/models/rm_light \
        --prompts artifacts/store/pool --out artifacts/ppo --rollouts artifacts/store/rollouts
    rlhf ppo ... --resume                      # continue exactly from the last checkpoint
    torchrun --nproc_per_node 2 -m rlhf.cli.app ppo ...   # data-parallel (gloo on CPUs)

Outputs under --out: checkpoints/step-NNNNNN/ (policy, critic, optimizers, schedulers, RNG,
sampler and controller state), tensorboard/ (every metric, every step), metrics.csv (the six
seed 000 §4.4 metrics, one line every `csv_every` steps), metrics.jsonl (every metric, every
step), events.jsonl (reward collapses / RM-refresh requests, skipped updates, diagnostics),
policy/ and critic.pt (final weights; no critic for a group estimator), summary.json. Rollout
rows go to the `rollouts` table folder --rollouts through the store's writer (store/rollouts.py:
run_id=<id>/step_bucket=<k>/, sorted whole-step shards); with --rm-scores, every RM score PPO
uses goes to the `rm_scores` table (light RM, and the strong RM's for escalated rollouts), with
--train-metrics the six metrics of every CSV line to `train_metrics`, both through the same
writer and layout; every saved checkpoint gets a row in the `checkpoints` table folder
--checkpoint-table when one is given (what `rlhf audit lineage` walks).

The loop (`PPOTrainer.step`) reads top to bottom; each phase is a module of this package (the
prompts and batches come from pipeline/samplers.py): hooks.py (prompt gates, generation hooks,
post-scoring hooks, observers: the rollout seam) -> generate.py (sampling, fallbacks, log-probs,
KL) -> scoring.py (Level 1: the light RM) -> features/tiers.py (Level 2 escalation, a
post-scoring hook) -> update.py (critic values, GAE, PPO epochs) -> accounting.py (what the step
cost) -> records.py (metrics, events, store rows) -> checkpoint.py.

Tiers (seed 001 §4.1): every rollout is scored by the light RM (Level 1, tier 1); with a strong
RM (--strong-reward) and `ppo.escalate_below` > 0, a valid rollout whose light-RM confidence is
below it is re-scored by the strong RM (Level 2, tier 2, scorer "strong_rm"), whose score PPO
then uses.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import torch

from rlhf.pipeline.decode import LogprobGuard
from rlhf.pipeline.ppo import checkpoint, lora, sharding, wallclock
from rlhf.pipeline.ppo.accounting import StepCost, Totals
from rlhf.pipeline.ppo.advantages import estimator
from rlhf.pipeline.ppo.config import PPOConfig
from rlhf.pipeline.ppo.critic import build_critic
from rlhf.pipeline.ppo.diagnostics import GradNormMonitor, RewardCollapseDetector
from rlhf.pipeline.ppo.dist import Dist
from rlhf.pipeline.ppo.generate import engine_resolved, forward_logprobs, generate_rollout, policy_logits
from rlhf.pipeline.ppo.features import FeatureContext, build_hooks, registry
from rlhf.pipeline.ppo.hooks import RolloutContext, RolloutHooks
from rlhf.pipeline.ppo.records import Recorder
from rlhf.pipeline.ppo.rollout import Rollout
from rlhf.store.io import write_text_atomic
from rlhf.pipeline.ppo.schedules import KLController
from rlhf.pipeline.ppo.scoring import score_level1
from rlhf.pipeline.ppo.update import Learner
from rlhf.pipeline.samplers import PromptSampler, StratifiedPromptSampler, load_prompts, strata
from rlhf.store.hashing import content_hash, keys_for


# --------------------------------------------------------------------------- the run
NO_ROWS = "_no_rows.txt"  # in a declared table folder of a feature that is off


@dataclass
class RunPaths:
    out: Path
    rollouts: Path  # the `rollouts` table folder; this run writes under run_id=<run_id>/
    run_id: str
    checkpoint_table: Path | None = None  # the `checkpoints` table folder (None: not recorded)
    rm_scores: Path | None = None  # the `rm_scores` table folder (None: not recorded)
    train_metrics: Path | None = None  # the `train_metrics` table folder (None: not recorded)
    # {table: folder} of the tables features declare (the scheduler's `schedule`, ...)
    tables: dict[str, Path] = field(default_factory=dict)
    checkpoints: Path = field(init=False)

    def __post_init__(self) -> None:
        self.out, self.rollouts = Path(self.out), Path(self.rollouts)
        for name in ("checkpoint_table", "rm_scores", "train_metrics"):
            if getattr(self, name) is not None:
                setattr(self, name, Path(getattr(self, name)))
        unknown = sorted(set(self.tables) - set(registry.tables()))
        if unknown:
            raise ValueError(f"no registered feature writes table(s) {', '.join(unknown)}")
        self.tables = {t: Path(f) for t, f in self.tables.items() if f is not None}
        self.checkpoints = self.out / "checkpoints"

    @property
    def step_tables(self) -> dict[str, Path]:
        """{table: folder} of the per-step tables this run writes (store/rollouts.py layout)."""
        tables = {"rollouts": self.rollouts, "rm_scores": self.rm_scores,
                  "train_metrics": self.train_metrics, **self.tables}
        return {t: folder for t, folder in tables.items() if folder is not None}

    def checkpoint_id(self, step: int) -> str:
        """The id of the policy after `step` updates (rollouts carry it as `checkpoint_id`)."""
        return f"{self.run_id}/policy-{step:06d}"

    def declare_tables(self, cfg: PPOConfig) -> None:
        """Every feature table folder given exists, even when its feature is off; an off
        feature's folder holds a note, not a shard (readers glob *.parquet; an empty declared
        output is what DVC warns about at the end of every `dvc repro`)."""
        for table, folder in self.tables.items():
            folder.mkdir(parents=True, exist_ok=True)
            feature = registry.feature_of_table(table)
            if not feature.on(cfg):
                switch = " / ".join(f"ppo.{k}" for k in feature.switches)
                write_text_atomic(folder / NO_ROWS, f"no rows: the {table} table is written "
                                  f"only when {switch} is on\n")


def hooks_for(cfg: PPOConfig, strong_scorer=None, prompt_space=None, tokenizer=None,
              light_scorer=None, score_map=None, routes=None, annotators=None) -> RolloutHooks:
    """The hooks of the features `cfg` turns on, from already-loaded inputs (tests, library
    use; `run` resolves them from paths): the registry builds them (features/registry.py)."""
    objects = {"strong_reward": strong_scorer, "embeddings": prompt_space, "routes": routes,
               "score_map": score_map, "annotators": annotators}
    ctx = FeatureContext(cfg, objects=objects, tokenizer=tokenizer, light_scorer=light_scorer)
    return build_hooks(cfg, ctx)


class PPOTrainer:
    """One PPO run. `train()` runs (or resumes) it; each step is `step(n)`."""

    def __init__(self, cfg: PPOConfig, policy, ref_policy, tokenizer, scorer,
                 prompts: list[tuple[str, str]], paths: RunPaths, policy_path: str | None = None,
                 accelerator=None, progress: bool = False, sampler=None, strong_scorer=None,
                 hooks: RolloutHooks | None = None, deepspeed_config: Path | None = None,
                 tracking=None):
        from accelerate import Accelerator

        self.cfg, self.paths, self.scorer, self.tokenizer = cfg, paths, scorer, tokenizer
        self.strong_scorer = strong_scorer  # Level 2 (seed 001 §4.1); None: Level 1 only
        self.hooks = (hooks if hooks is not None
                      else hooks_for(cfg, strong_scorer, tokenizer=tokenizer,
                                     light_scorer=scorer))
        self.acc = accelerator or Accelerator(cpu=not torch.cuda.is_available())
        # `engine: auto` becomes the engine for this device, which the run then records
        cfg = self.cfg = engine_resolved(cfg, self.acc.device)
        self.dist = Dist(self.acc)
        self.rank, self.world = self.dist.rank, self.dist.world
        self.progress = progress
        if tokenizer.pad_token_id is None:
            raise ValueError("the policy tokenizer needs a pad token")
        self.pad_id, self.eos_id = tokenizer.pad_token_id, tokenizer.eos_token_id
        vocab = max(len(tokenizer), policy.config.vocab_size)
        torch.manual_seed(cfg.seed)  # critic init; every rank starts from the same weights
        if cfg.lora.enabled:  # adapters on the policy; the reference is its base with them off
            policy, ref_policy = lora.wrap_policy(policy, cfg.lora, policy_path)
        critic = None  # a group estimator (advantages.py) never runs one: none is built
        if estimator(cfg.advantage_estimator).needs_critic:
            critic = lora.build_critic(cfg, vocab, self.pad_id, policy, policy_path) \
                if cfg.lora.enabled else \
                build_critic(cfg.critic, vocab, self.pad_id, cfg.critic_hidden_size,
                             cfg.critic_layers, cfg.critic_heads, cfg.critic_max_tokens,
                             policy_source=policy_path if cfg.critic == "full" else None,
                             policy_config=policy.config)
            if self.pad_id == self.eos_id:  # pad doubles as eos: it may be a real token
                critic.pad_id = None
        # one engine each for policy and critic, the reference an inference one (sharding.py)
        self.sharded = sharding.build(cfg, self.acc, policy, critic, ref_policy, deepspeed_config)
        self.policy = self.sharded.policy.module
        self.critic = self.sharded.critic.module if self.sharded.critic else None
        self.ref = self.sharded.ref
        self.ref.eval()
        self.ref.requires_grad_(False)
        # uniform shuffled epochs unless a (stratified) sampler is given
        self.sampler = sampler or PromptSampler(prompts, cfg.seed)
        self.kl_ctl = KLController(cfg.kl_coef, cfg.kl_warmup_on, cfg.kl_warmup_steps,
                                   cfg.collapse_kl_coef, cfg.collapse_hold_steps)
        self.collapse = RewardCollapseDetector(cfg.collapse_mean_drop, cfg.collapse_std_rise)
        self.gradmon = GradNormMonitor(reference_steps=cfg.gradnorm_reference_steps,
                                       shift_decades=cfg.gradnorm_shift_decades,
                                       bimodal_separation=cfg.gradnorm_bimodal_separation)
        self.recorder = Recorder(cfg, paths, self.dist, scorer, strong_scorer, tracking)
        # checks the engine's old log-probs against the trainer's forward before they are reused
        self.logprob_guard = LogprobGuard(cfg.logprob_guard_every, cfg.logprob_guard_rows,
                                          cfg.logprob_guard_tol)
        # what post-scoring hooks may use of the trainer, and nothing else (hooks.py)
        self.context = RolloutContext(cfg, tokenizer, scorer, strong_scorer,
                                      generation=self.sharded.policy.generation,
                                      rollout=self.sample_scored, event=self.recorder.event,
                                      out=paths.out)
        self.learner = Learner(cfg, self.sharded, self.dist, self.acc, self.kl_ctl,
                               self.collapse, self.gradmon, self.recorder.event)
        self.totals = Totals()  # the run's cumulative cost (accounting.py), checkpointed
        # the counters of the features on, in every step's metrics from the first (0 until used)
        self.counters = [c for f in registry.on(cfg) for c in f.counters]
        self.parent_checkpoint: str | None = None  # null parent: the run starts from SFT
        self.data_version = content_hash("\n".join(sorted(p[0] for p in prompts)))
        # distinct prompt ids must get distinct prompt_keys (store/hashing.py): ValueError if not
        keys_for(pa.array([p[0] for p in prompts], pa.string()))
        self.current_step = 0

    # ----------------------------------------------------------------- the run
    def train(self, resume: bool = False) -> dict:
        start = checkpoint.load(self) + 1 if resume else 1
        if not resume:
            self.recorder.reset()
            self.acc.wait_for_everyone()
        self.recorder.open(start, resume)
        self.acc.wait_for_everyone()
        last: dict = {}
        budget = self.cfg.total_tokens
        with _setup_frozen():
            for step in self._progress(range(start, self.cfg.total_steps + 1)):
                if budget and self.totals.sums["tokens_generated"] >= budget:
                    break  # a resumed run that had already spent its budget
                last = self.step(step)
                spent = budget and self.totals.sums["tokens_generated"] >= budget
                if step % self.cfg.checkpoint_every == 0 or step == self.cfg.total_steps or spent:
                    checkpoint.save(self, step)
                if spent:
                    self.recorder.event("token_budget_spent", step=step, budget=budget,
                                        tokens_generated=self.totals.sums["tokens_generated"])
                    break
        return self.finish(last)

    def step(self, step: int) -> dict:
        """One PPO step, top to bottom; returns its metrics (already logged)."""
        self.current_step = self.recorder.current_step = self.context.step = step
        cost = StepCost(features=dict.fromkeys(self.counters, 0))  # every declared counter
        # rows a replay source supplies from stored rollouts are not sampled again
        replayed = sum(h.replayed(step, self.cfg.batch_size) for h in self.hooks.replay)
        batch = self._my_share(self.select_prompts(step, cost, self.cfg.batch_size - replayed))
        with cost.phase("generate"):
            r = self.generate(batch, self.paths.checkpoint_id(step - 1), step, cost)
        cost.add_generated(sum(r.extras["generated_tokens"]), len(r))
        with cost.phase("score"):
            self.score(r, cost)
        with cost.phase("logprobs"):
            self.forward_logprobs(r, cost)
            for h in self.hooks.replay:  # stored rows join with their stored old log-probs
                r = h.mix(step, r, cost)
        with cost.phase("critic"):
            if self.learner.estimator.needs_critic:
                self.learner.values(r, self.pad_id, self.scorer, cost)
                cost.critic_token_forwards += int(r.critic_ids.numel())
            else:
                self.learner.no_values(r)
        with cost.phase("update"):
            sched = self.learner.advantages(r, step)
            stats = (self.learner.epochs(r, sched["clip_range"], step, cost)
                     if sched["trainable"] else self.learner.no_update())
        cost.tokens_trained = int(r.loss_mask.sum())
        cost.rollouts_trained = int(r.valid.sum())
        cost.rollouts_skipped = len(r) - cost.rollouts_trained
        with cost.phase("records"):
            rows = self.recorder.rows(step, r)
        metrics = self.recorder.metrics(step, r, sched, stats, self._account(cost))
        for h in self.hooks.observers:
            h.observe(step, rows, metrics)
        for h in self.hooks.all():  # a hook's own per-step store rows (the `schedule` table)
            self.recorder.write_rows(step, h.table_rows(step))
        del r
        self._release_memory()
        return metrics

    # ----------------------------------------------------------------- phases
    def select_prompts(self, step: int, cost: StepCost,
                       rows: int | None = None) -> list[tuple[str, str]]:
        """The step's global batch: sampler draws, passed through every prompt gate; skipped
        prompts are replaced by further draws until `rows` (default `batch_size`) x processes
        are kept (every process computes the same decisions on the same global draws). With
        `group_size` k, rows / k prompts a process, each sampled k times (`_my_share`)."""
        rows = self.cfg.batch_size if rows is None else rows
        need = rows * self.world // self.cfg.group_size
        if not self.hooks.gates:
            return self.sampler.next_batch(need)
        kept: list[tuple[str, str]] = []
        for _ in range(1000):
            candidates = self.sampler.next_batch(need)
            keep = [True] * len(candidates)
            for gate in self.hooks.gates:
                keep = [k and g for k, g in zip(keep, gate.select(step, candidates))]
            kept += [c for c, k in zip(candidates, keep) if k]
            cost.prompts_screened += keep.count(False)
            if len(kept) >= need:
                return kept[:need]
        raise RuntimeError("the prompt gates skipped every prompt of 1000 draws")

    def generate(self, batch: list[tuple[str, str]], version: str, step: int = 0,
                 cost: StepCost | None = None) -> Rollout:
        with self.sharded.policy.generation() as model:
            return generate_rollout(
                model, self.tokenizer, batch, self.cfg, version, self.acc.device,
                hooks=self.hooks.generation, step=step, cost=cost,
                on_error=lambda exc: self.recorder.event("generation_error", error=str(exc)[:200]))

    def sample_scored(self, batch: list[tuple[str, str]], cost: StepCost) -> Rollout:
        """`batch` generated by the current policy (generation hooks on) and scored at Level 1,
        its tokens and calls counted: what a post-scoring hook refilling the batch calls."""
        step = self.current_step
        r = self.generate(batch, self.paths.checkpoint_id(step - 1), step, cost)
        cost.add_generated(sum(r.extras["generated_tokens"]), len(r))
        score_level1(self.scorer, r, cost, self.acc.device)
        return r

    def score(self, r: Rollout, cost: StepCost | None = None) -> None:
        """Level 1 (the light RM), then every post-scoring hook (Level 2 escalation, ...)."""
        cost = cost or StepCost()
        score_level1(self.scorer, r, cost, self.acc.device)
        for h in self.hooks.post_scoring:
            h.after_score(self.context, r, cost)

    def forward_logprobs(self, r: Rollout, cost: StepCost | None = None) -> None:
        """Old / reference log-probs, entropy and the per-token KL (full distributions)."""
        forward_logprobs(self.sharded.policy.model.eval(), self.ref, r, self.cfg, cost,
                         self.logprob_guard)

    def _logits(self, model, r: Rollout, idx: torch.Tensor | None = None) -> torch.Tensor:
        return policy_logits(model, r, self.cfg.temperature, idx)

    def _my_share(self, batch: list) -> list:
        """This process's prompts of the global batch, each repeated `group_size` times
        (contiguous: a prompt's group stays on one process, advantages.py)."""
        return [p for p in batch[self.rank::self.world] for _ in range(self.cfg.group_size)]

    def _account(self, cost: StepCost) -> dict:
        """The step's cost summed over processes, added to the run's totals; as metrics."""
        if self.world > 1:
            cost = StepCost.merged(self.dist.gather_objects(cost))
        self.totals.add(cost)
        return {**cost.as_metrics(), **self.totals.as_metrics()}

    # ----------------------------------------------------------------- the end
    def save_checkpoint(self, step: int) -> Path:
        return checkpoint.save(self, step)

    def finish(self, last: dict) -> dict:
        self.recorder.close()
        policy, weights = self.sharded.policy.model, self.sharded.policy.full_state()
        critic_weights = self.sharded.critic.full_state() if self.sharded.critic else None
        digest = hashlib.sha256()
        for name, t in sorted(weights.items()):
            digest.update(name.encode())
            # the raw bytes (as uint8: numpy has no bf16, the dtype of ZeRO-3 weights on a GPU)
            digest.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
                          .numpy().tobytes())
        (self.paths.out / f"weights-rank{self.rank}.sha256").write_text(digest.hexdigest())
        if self.acc.is_main_process:
            if self.cfg.lora.enabled:  # policy/ merged (what every stage loads), and adapter/
                lora.save_merged(policy, self.paths.out / "policy")
                lora.save_adapter(policy, self.paths.out / "adapter")
            else:
                policy.save_pretrained(self.paths.out / "policy", state_dict=weights)
            self.tokenizer.save_pretrained(self.paths.out / "policy")
            if critic_weights is not None:
                torch.save(critic_weights, self.paths.out / "critic.pt")
            # the wall-clock figures are in timings.jsonl (wallclock.py), not in the summary
            summary = {"run_id": self.paths.run_id, "steps": last.get("step", 0),
                       "world_size": self.world, "engines": self.sharded.described,
                       "final": wallclock.split(last)[0],
                       "cost": wallclock.split(self.totals.as_metrics())[0]}
            (self.paths.out / "summary.json").write_text(json.dumps(summary, indent=1))
        self.acc.wait_for_everyone()
        return last

    def _release_memory(self) -> None:
        """Seed 000 §5.2: free the rollout's tensors now, not when the GC gets round to it."""
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _progress(self, steps):
        if not (self.progress and self.acc.is_main_process):
            return steps
        from rlhf.pipeline.progress import track  # a live bar, or periodic lines in a pipe

        return track(steps, "PPO steps", unit="steps")


@contextlib.contextmanager
def _setup_frozen():
    """The loop with what predates it (libraries, models, prompts: alive all run) out of the
    collector's sight (`gc.freeze`): each step's `gc.collect()` scans only what the steps made
    (a full one took 0.29 s a step, 18 % of the embedded default's ppo stage, by cProfile), the
    rollout's garbage included; after the loop the frozen objects return to the collector."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


# --------------------------------------------------------------------------- entry point
def run(cfg: PPOConfig, policy_path: str | Path, reward_path: str | Path,
        prompts_path: str | Path, out: str | Path, rollouts: str | Path,
        run_id: str | None = None, resume: bool = False, progress: bool = True,
        checkpoint_table: str | Path | None = None, difficulty: str | Path | None = None,
        rm_scores: str | Path | None = None, train_metrics: str | Path | None = None,
        deepspeed_config: str | Path | None = None, inputs: dict | None = None,
        tables: dict | None = None, params: str | Path | None = None, probe=None,
        tracking=None, compute=None) -> dict:
    """Load the policy, reference, tokenizer and reward model(s) from disk and run PPO.

    `reward_path`: an RM folder, or a reward function or server spec (`python:file.py:function`,
    `http://host:port/path`: pipeline/models/code_rewards.py).

    With `difficulty` (a `difficulty` table folder) batches come from the stratified sampler
    over difficulty bucket x topic cluster; without it, from uniformly shuffled epochs.
    `rm_scores` / `train_metrics` / `checkpoint_table`: those tables' folders. `inputs`: {input
    key: path or loaded object} of what the features read (features/inputs.py: strong_reward,
    embeddings, routes, score_map; `params` the params file the annotator pool comes from);
    `tables`: {table: folder} of the feature tables (features' `Table`s). `probe`: a
    post-scoring hook run after the config's (bench/economy/sample.py's measurement).
    `tracking`: params.yaml `tracking` (tracking.TrackingConfig; None: TensorBoard only).
    `compute`: the resolved params.yaml `compute` (compute.Compute; None: what `auto` gives
    here): the dtype and attention of the policy, the reference and the reward models (the light
    one and `strong_reward`), the device, and gradient checkpointing of the policy."""
    from rlhf.pipeline.models.compute import Compute, resolve
    from rlhf.pipeline.progress import quiet_libraries

    quiet_libraries()  # no library bars, no warnings a user cannot act on
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlhf.pipeline.models.policy import set_threads
    from rlhf.pipeline.models.scoring import load_scorer
    from rlhf.pipeline.ppo.scoring import check_features

    check_features(cfg, reward_path)  # a reward that is code: no feature reads an RM's insides
    set_threads()  # $RLHF_TORCH_THREADS, like every stage (policy.set_threads)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(str(policy_path))
    compute: Compute = compute or resolve(stage="ppo")
    # the accelerator places the models (sharding.py): loaded here in their dtype on the CPU
    policy = _load_policy(AutoModelForCausalLM, policy_path, compute, "policy")
    ref = None  # ppo.lora: the reference is the policy's base with its adapters off
    if not cfg.lora.enabled:
        ref = _load_policy(AutoModelForCausalLM, policy_path, compute, "reference")
    if compute.gradient_checkpointing:
        policy.activation_checkpointing_enable()  # transformers 5: gradient checkpointing
    # a reward server reads the texts as the policy saw them (its chat template)
    scorer = load_scorer(reward_path, name="light_rm", compute=compute,
                         policy_tokenizer=tokenizer)
    prompts = load_prompts(prompts_path)
    sampler = None
    if difficulty is not None:
        from accelerate import PartialState

        sampler = StratifiedPromptSampler(prompts, strata(prompts_path, difficulty),
                                          cfg.batch_size * PartialState().num_processes, cfg.seed)
    paths = RunPaths(Path(out), Path(rollouts), run_id or Path(out).name, checkpoint_table,
                     rm_scores, train_metrics, dict(tables or {}))
    given = {k: v for k, v in (inputs or {}).items() if v is not None}
    strong_path = given.get("strong_reward")
    if "score_map" not in given and isinstance(strong_path, str | Path) and \
            (Path(strong_path) / "score_map.json").is_file():
        given["score_map"] = strong_path  # the strong RM folder's own map
    ctx = FeatureContext(cfg, {k: v for k, v in given.items() if isinstance(v, str | Path)},
                         objects={k: v for k, v in given.items()
                                  if not isinstance(v, str | Path)},
                         tokenizer=tokenizer, light_scorer=scorer, prompts=prompts,
                         prompts_path=prompts_path, params=Path(params) if params else None,
                         compute=compute)
    hooks = build_hooks(cfg, ctx, extra=[probe] if probe is not None else None)
    trainer = PPOTrainer(cfg, policy, ref, tokenizer, scorer, prompts, paths,
                         policy_path=str(policy_path), accelerator=_accelerator(compute),
                         progress=progress, sampler=sampler,
                         strong_scorer=ctx.optional("strong_reward"),
                         deepspeed_config=deepspeed_config, hooks=hooks, tracking=tracking)
    if trainer.rank == 0:
        paths.out.mkdir(parents=True, exist_ok=True)
        paths.declare_tables(cfg)
    return trainer.train(resume=resume)


def _load_policy(cls, path, compute, what: str):
    """The policy (or reference) at `path` in `compute`'s dtype and attention, on the CPU."""
    from rlhf.pipeline.models.compute import note_cast

    note_cast(path, compute, what)
    kw = compute.load_kwargs()
    # before params.yaml `compute`, PPO loaded in the folder's own dtype (float32 here) with
    # SDPA named: the same model, so a CPU run's bytes stay as they were
    kw.setdefault("attn_implementation", "sdpa")
    return cls.from_pretrained(str(path), **kw)


def _accelerator(compute):
    """The run's accelerator on `compute`'s device (cuda:N: that GPU; a launcher's own placement
    under torchrun / accelerate launch)."""
    import os

    from accelerate import Accelerator

    if not compute.on_cpu and "LOCAL_RANK" not in os.environ:  # a launcher places its ranks
        torch.cuda.set_device(compute.torch_device)
    return Accelerator(cpu=compute.on_cpu)
