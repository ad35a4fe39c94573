"""The PPO loop: prompts -> generate -> score -> KL to the reference -> GAE -> PPO epochs -> log
-> checkpoint, built on transformers, accelerate and TRL's utilities (TRL's own PPOTrainer was
removed in 2026; see ARCHITECTURE.md "The PPO trainer").

    rlhf ppo --policy artifacts/models/sft --reward artifacts/models/rm_light \
        --prompts artifacts/store/pool --out artifacts/ppo --rollouts artifacts/store/rollouts
    rlhf ppo ... --resume                      # continue exactly from the last checkpoint
    torchrun --nproc_per_node 2 -m rlhf.cli.app ppo ...   # data-parallel (gloo on CPUs)

Outputs under --out: checkpoints/step-NNNNNN/ (policy, critic, optimizers, schedulers, RNG,
sampler and controller state), tensorboard/ (every metric, every step), metrics.csv (the six
seed 000 §4.4 metrics, one line every `csv_every` steps), metrics.jsonl (every metric, every
step), events.jsonl (reward collapses / RM-refresh requests, skipped updates, diagnostics),
policy/ and critic.pt (final weights), summary.json. Rollout rows go to the `rollouts` table
folder --rollouts through the store's writer (store/rollouts.py: run_id=<id>/step_bucket=<k>/,
sorted whole-step shards); with --rm-scores, every RM score PPO uses goes to the `rm_scores`
table (light RM, and the strong RM's for escalated rollouts), with --train-metrics the six
metrics of every CSV line to `train_metrics`, both through the same writer and layout; every
saved checkpoint gets a row in the `checkpoints` table folder --checkpoint-table when one is
given (what `rlhf audit lineage` walks).

Tiers (seed 001 §4.1): every rollout is scored by the light RM (Level 1, tier 1); with a strong
RM (--strong-reward) and `ppo.escalate_below` > 0, a valid rollout whose light-RM confidence is
below it is re-scored by the strong RM (Level 2, tier 2, scorer "strong_rm"), whose score PPO
then uses.
"""

from __future__ import annotations

import csv
import gc
import hashlib
import json
import math
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import torch

from rlhf.pipeline.ppo import core
from rlhf.pipeline.ppo.accounting import StepCost, Totals, rm_tokens
from rlhf.pipeline.ppo.config import (PPOConfig, attn_implementation,
                                      check_gradient_accumulation)
from rlhf.pipeline.ppo.critic import (build_critic, critic_loss, pack_right,
                                      response_values, reward_attention_weights)
from rlhf.pipeline.ppo.diagnostics import (SUGGESTION_TEXT, GradNormMonitor,
                                           RewardCollapseDetector)
from rlhf.pipeline.ppo.rollout import Rollout
from rlhf.pipeline.ppo.schedules import KLController, adaptive_clip, lambda_eps
from rlhf.pipeline.ppo.scoring import scorer_identity, text_format
from rlhf.store.hashing import content_hash, keys_for
from rlhf.store.io import read_table, remove_partials, write_shard
from rlhf.store.rollouts import StepShardWriter, run_folder

CSV_COLUMNS = ("step", "rollout_success_rate", "reward_mean", "reward_std", "kl_div_mean",
               "clip_ratio", "critic_loss", "entropy_mean")
FALLBACK_RESPONSE = "..."  # seed 000 §4.3: a timed-out rollout becomes prompt + "..."


# --------------------------------------------------------------------------- prompts
def load_prompts(path: str | Path, split: str = "ppo") -> list[tuple[str, str]]:
    """(prompt_id, text) pairs from a `pool` table folder (rows of `split`) or a JSONL file of
    {"prompt_id"?, "text"} objects (prompt_id defaults to the text's content hash)."""
    path = Path(path)
    if path.is_dir():
        table = read_table("pool", path).to_pylist()
        rows = [(r["prompt_id"], r["text"]) for r in table if r["split"] == split]
    else:
        rows = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                obj = json.loads(line)
                rows.append((obj.get("prompt_id") or content_hash(obj["text"]), obj["text"]))
    if not rows:
        raise ValueError(f"no prompts in {path}" + (f" (split {split!r})" if path.is_dir() else ""))
    return sorted(rows)


@dataclass
class PromptSampler:
    """Deterministic epochs of shuffled prompts; its state is two integers (checkpointed)."""

    prompts: list[tuple[str, str]]
    seed: int
    epoch: int = 0
    position: int = 0

    def _order(self) -> list[int]:
        order = list(range(len(self.prompts)))
        random.Random(self.seed * 100_003 + self.epoch).shuffle(order)
        return order

    def next_batch(self, n: int) -> list[tuple[str, str]]:
        out, order = [], self._order()
        while len(out) < n:
            if self.position >= len(order):
                self.epoch, self.position = self.epoch + 1, 0
                order = self._order()
            out.append(self.prompts[order[self.position]])
            self.position += 1
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


class StratifiedPromptSampler:
    """Batches from the difficulty stage's sampler (pipeline/difficulty.py): every batch covers
    every difficulty bucket and topic cluster as evenly as the prompts allow (seed 000 §3.1
    level one, §4.2), as (prompt_id, text) pairs. Its state (JSON) goes into the checkpoint."""

    def __init__(self, prompts: list[tuple[str, str]], difficulty_rows: list[dict],
                 batch_size: int, seed: int):
        from rlhf.pipeline.difficulty import sampler_from_table

        self.text = dict(prompts)
        rows = [r for r in difficulty_rows if r["prompt_id"] in self.text]
        missing = len(self.text) - len({r["prompt_id"] for r in rows})
        if missing:
            raise ValueError(f"{missing} of {len(self.text)} prompts have no row in the "
                             f"difficulty table: rerun the difficulty stage on this pool")
        self.sampler = sampler_from_table(rows, batch_size, seed)

    def next_batch(self, n: int) -> list[tuple[str, str]]:
        if n != self.sampler.batch_size:
            raise ValueError(f"the stratified sampler draws batches of {self.sampler.batch_size}")
        return [(pid, self.text[pid]) for pid in self.sampler.next_batch()]

    def state_dict(self) -> dict:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)


def strata(pool: str | Path, difficulty: str | Path) -> list[dict]:
    """(prompt_id, bucket, topic_cluster) per pool prompt: the topic cluster from the `pool`
    table (dedup stage), the difficulty bucket from the `difficulty` table (difficulty stage)."""
    if not Path(pool).is_dir():
        raise ValueError("stratified batches need --prompts to be a pool table folder")
    buckets = {r["prompt_id"]: r["bucket"] for r in
               read_table("difficulty", difficulty).select(["prompt_id", "bucket"]).to_pylist()}
    if not buckets:
        raise ValueError(f"no difficulty rows in {difficulty}")
    return [{"prompt_id": r["prompt_id"], "topic_cluster": r["topic_cluster"],
             "bucket": buckets[r["prompt_id"]]}
            for r in read_table("pool", pool).select(["prompt_id", "topic_cluster"]).to_pylist()
            if r["prompt_id"] in buckets]


# --------------------------------------------------------------------------- the trainer
@dataclass
class RunPaths:
    out: Path
    rollouts: Path  # the `rollouts` table folder; this run writes under run_id=<run_id>/
    run_id: str
    checkpoint_table: Path | None = None  # the `checkpoints` table folder (None: not recorded)
    rm_scores: Path | None = None  # the `rm_scores` table folder (None: not recorded)
    train_metrics: Path | None = None  # the `train_metrics` table folder (None: not recorded)
    checkpoints: Path = field(init=False)

    def __post_init__(self) -> None:
        self.out, self.rollouts = Path(self.out), Path(self.rollouts)
        for name in ("checkpoint_table", "rm_scores", "train_metrics"):
            if getattr(self, name) is not None:
                setattr(self, name, Path(getattr(self, name)))
        self.checkpoints = self.out / "checkpoints"

    @property
    def step_tables(self) -> dict[str, Path]:
        """{table: folder} of the per-step tables this run writes (store/rollouts.py layout)."""
        tables = {"rollouts": self.rollouts, "rm_scores": self.rm_scores,
                  "train_metrics": self.train_metrics}
        return {t: folder for t, folder in tables.items() if folder is not None}

    @property
    def run_rollouts(self) -> Path:
        return run_folder(self.rollouts, self.run_id)

    def checkpoint_id(self, step: int) -> str:
        """The id of the policy after `step` updates (rollouts carry it as `checkpoint_id`)."""
        return f"{self.run_id}/policy-{step:06d}"


class PPOTrainer:
    """One PPO run. `train()` runs (or resumes) it; each step is `step(n)`."""

    def __init__(self, cfg: PPOConfig, policy, ref_policy, tokenizer, scorer,
                 prompts: list[tuple[str, str]], paths: RunPaths, policy_path: str | None = None,
                 accelerator=None, progress: bool = False, sampler=None, strong_scorer=None):
        from accelerate import Accelerator

        self.cfg, self.paths, self.scorer, self.tokenizer = cfg, paths, scorer, tokenizer
        self.strong_scorer = strong_scorer  # Level 2 (seed 001 §4.1); None: Level 1 only
        self.acc = accelerator or Accelerator(cpu=not torch.cuda.is_available())
        self.rank, self.world = self.acc.process_index, self.acc.num_processes
        self.progress = progress
        self.format_prompt, _, self.response_of = text_format()
        if tokenizer.pad_token_id is None:
            raise ValueError("the policy tokenizer needs a pad token")
        self.pad_id, self.eos_id = tokenizer.pad_token_id, tokenizer.eos_token_id
        vocab = max(len(tokenizer), policy.config.vocab_size)
        torch.manual_seed(cfg.seed)  # critic init; every rank starts from the same weights
        critic = build_critic(cfg.critic, vocab, self.pad_id, cfg.critic_hidden_size,
                              cfg.critic_layers, cfg.critic_heads, cfg.critic_max_tokens,
                              policy_source=policy_path if cfg.critic == "full" else None,
                              policy_config=policy.config)
        if self.pad_id == self.eos_id:  # pad doubles as eos: it may be a real (attended) token
            critic.pad_id = None
        opt_p = torch.optim.AdamW(policy.parameters(), lr=cfg.learning_rate)
        opt_c = torch.optim.AdamW(critic.parameters(), lr=cfg.critic_learning_rate)
        decay = lambda s: max(0.1, 1.0 - s / max(cfg.total_steps, 1))  # noqa: E731
        self.sched_p = torch.optim.lr_scheduler.LambdaLR(opt_p, decay)
        self.sched_c = torch.optim.lr_scheduler.LambdaLR(opt_c, decay)
        self.policy, self.critic, self.opt_p, self.opt_c = self.acc.prepare(
            policy, critic, opt_p, opt_c)
        if self.acc.state.deepspeed_plugin is not None:  # ZeRO-3 (configs/, seed 000 §4.1, §5.5)
            from trl.models.utils import prepare_deepspeed

            check_gradient_accumulation(self.acc.gradient_accumulation_steps, self.world)
            self.ref = prepare_deepspeed(ref_policy, self.acc)
        else:
            self.ref = ref_policy.to(self.acc.device)
        self.ref.eval().requires_grad_(False)
        # uniform shuffled epochs unless a (stratified) sampler is given
        self.sampler = sampler or PromptSampler(prompts, cfg.seed)
        self.kl_ctl = KLController(cfg.kl_coef, cfg.kl_warmup_on, cfg.kl_warmup_steps,
                                   cfg.collapse_kl_coef, cfg.collapse_hold_steps)
        self.collapse = RewardCollapseDetector(cfg.collapse_mean_drop, cfg.collapse_std_rise)
        self.gradmon = GradNormMonitor(reference_steps=cfg.gradnorm_reference_steps,
                                       shift_decades=cfg.gradnorm_shift_decades,
                                       bimodal_separation=cfg.gradnorm_bimodal_separation)
        self.writer = None  # TensorBoard (main process)
        # the store's writers of rollouts / rm_scores / train_metrics (main process)
        self.table_writers: dict[str, StepShardWriter] = {}
        self.parent_checkpoint: str | None = None  # null parent: the run starts from SFT
        self.data_version = content_hash("\n".join(sorted(p[0] for p in prompts)))
        # distinct prompt ids must get distinct prompt_keys (store/hashing.py): ValueError if not
        keys_for(pa.array([p[0] for p in prompts], pa.string()))
        self.current_step = 0
        self._last_suggestions: set[str] = set()
        self.totals = Totals()  # the run's cumulative cost (accounting.py), checkpointed

    # ----------------------------------------------------------------- the run
    def train(self, resume: bool = False) -> dict:
        start = self.load_checkpoint() + 1 if resume else 1
        if not resume:
            self._reset_outputs()
        if self.acc.is_main_process:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.paths.out / "tensorboard"), purge_step=start)
            # resume_after: drop the steps a killed run stored after its last checkpoint (they
            # are redone now), so no step is ever stored twice (store/rollouts.py)
            self.table_writers = {
                table: StepShardWriter(table, folder, self.paths.run_id,
                                       resume_after=start - 1 if resume else None)
                for table, folder in self.paths.step_tables.items()}
        self.acc.wait_for_everyone()
        last: dict = {}
        steps = range(start, self.cfg.total_steps + 1)
        for step in self._progress(steps):
            last = self.step(step)
            if step % self.cfg.checkpoint_every == 0 or step == self.cfg.total_steps:
                self.save_checkpoint(step)
        return self.finish(last)

    def step(self, step: int) -> dict:
        """One PPO step; returns its metrics (already logged)."""
        self.current_step = step
        cost = StepCost()
        batch = self._my_share(self.sampler.next_batch(self.cfg.batch_size * self.world))
        version = self.paths.checkpoint_id(step - 1)
        with cost.phase("generate"):
            r = self.generate(batch, version)
        cost.add_generated(sum(r.extras["generated_tokens"]), len(r))
        with cost.phase("score"):
            self.score(r, cost)
        with cost.phase("logprobs"):
            self.forward_logprobs(r)
        with cost.phase("critic"):
            self.critic_values(r, cost)
        with cost.phase("update"):
            sched = self.advantages(r, step)
            stats = (self.ppo_epochs(r, sched["clip_range"], step) if sched["trainable"]
                     else self._no_update())
        cost.tokens_trained = int(r.loss_mask.sum())
        cost.rollouts_trained = int(r.valid.sum())
        cost.rollouts_skipped = len(r) - cost.rollouts_trained
        with cost.phase("records"):
            self.write_records(step, r)
        metrics = self.log(step, r, sched, stats, self._account(cost))
        del r
        self._release_memory()
        return metrics

    def _my_share(self, batch: list) -> list:
        return batch[self.rank::self.world]

    def _account(self, cost: StepCost) -> dict:
        """The step's cost summed over processes, added to the run's totals; as metrics."""
        if self.world > 1:
            from accelerate.utils import gather_object

            cost = StepCost.merged(gather_object([cost]))
        self.totals.add(cost)
        return {**cost.as_metrics(), **self.totals.as_metrics()}

    # ----------------------------------------------------------------- generate (§4.3)
    @torch.no_grad()
    def generate(self, batch: list[tuple[str, str]], version: str) -> Rollout:
        from transformers import MaxTimeCriteria, StoppingCriteriaList
        from trl.models.utils import unwrap_model_for_generation

        cfg, tok = self.cfg, self.tokenizer
        ids, texts = [b[0] for b in batch], [b[1] for b in batch]
        tok.padding_side = "left"
        enc = tok([self.format_prompt(t) for t in texts], return_tensors="pt", padding=True,
                  truncation=True, max_length=cfg.max_prompt_tokens).to(self.acc.device)
        P = enc["input_ids"].shape[1]
        flags: list[list[str]] = [[] for _ in texts]
        started = time.monotonic()
        try:
            with unwrap_model_for_generation(self.policy, self.acc) as model, \
                    self._rollout_dropout(model):
                out = model.generate(
                    **enc, do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p, top_k=0,
                    max_new_tokens=cfg.max_new_tokens, pad_token_id=self.pad_id,
                    eos_token_id=self.eos_id,
                    # a sampled pad token would read as padding downstream (critic mask, §5.3)
                    suppress_tokens=[self.pad_id] if self.pad_id != self.eos_id else None,
                    stopping_criteria=StoppingCriteriaList([MaxTimeCriteria(
                        cfg.generation_timeout_s)]))
            gen = out[:, P:].cpu().tolist()
            timed_out = time.monotonic() - started > cfg.generation_timeout_s
        except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:  # OOM and friends (§4.3)
            gen, timed_out = [[] for _ in texts], False
            for f in flags:
                f.append("generation_error")
            self._event("generation_error", error=str(exc)[:200])
        fallback = tok(FALLBACK_RESPONSE, add_special_tokens=False)["input_ids"] or [self.eos_id]
        responses, valid, generated = [], [], []
        for i, g in enumerate(gen):
            cut = g.index(self.eos_id) + 1 if self.eos_id in g else None
            g = g[:cut] if cut else [t for t in g if t != self.pad_id]
            generated.append(len(g))  # what the policy spent, whatever happens to the sample
            unfinished = cut is None and len(g) < cfg.max_new_tokens
            if not g or flags[i] or (timed_out and unfinished):
                flags[i].append("timeout" if timed_out else "fallback")
                g = list(fallback)
                valid.append(False)
            else:
                if cut is None:
                    flags[i].append("no_eos")
                valid.append(True)
            responses.append(g)
        T = max(len(g) for g in responses)
        resp = torch.full((len(responses), T), self.pad_id, dtype=torch.long)
        for i, g in enumerate(responses):
            resp[i, : len(g)] = torch.tensor(g)
        resp_mask = torch.arange(T)[None, :] < torch.tensor([len(g) for g in responses])[:, None]
        # the scorer sees the response as every other stage cut it (pipeline/text.py)
        texts_out = [FALLBACK_RESPONSE if not v
                     else self.response_of(tok.decode(g, skip_special_tokens=True))
                     for g, v in zip(responses, valid)]
        dev = self.acc.device
        return Rollout(prompt_ids=ids, prompts=texts, responses=texts_out,
                       query=enc["input_ids"], query_mask=enc["attention_mask"],
                       response=resp.to(dev), response_mask=resp_mask.to(dev),
                       valid=torch.tensor(valid, device=dev), flags=flags, policy_version=version,
                       extras={"generated_tokens": generated})

    def _rollout_dropout(self, model):
        """Seed 001 §5.2: optionally keep dropout active while sampling (off by default)."""
        import contextlib

        if not self.cfg.rollout_dropout_on:
            model.eval()
            return contextlib.nullcontext()

        @contextlib.contextmanager
        def active():
            saved = []
            for m in model.modules():
                if isinstance(m, torch.nn.Dropout):
                    saved.append((m, "p", m.p))
                    m.p = self.cfg.rollout_dropout
                elif isinstance(getattr(m, "attention_dropout", None), float):
                    saved.append((m, "attention_dropout", m.attention_dropout))
                    m.attention_dropout = self.cfg.rollout_dropout
            model.train()
            try:
                yield
            finally:
                for m, name, value in saved:
                    setattr(m, name, value)
                model.eval()
        return active()

    # ----------------------------------------------------------------- score and log-probs
    @torch.no_grad()
    def score(self, r: Rollout, cost: StepCost | None = None) -> None:
        """Level 1: the light RM scores every valid rollout (a fallback earns no score: 0 and
        no gradient, stored as a null reward). Level 2 (seed 001 §4.1): with a strong RM, valid
        rollouts whose light-RM confidence is below `escalate_below` are re-scored by it, and
        its score (and confidence) replace the light RM's for PPO."""
        dev = self.acc.device
        cost = cost or StepCost()
        r.level1_scores = torch.zeros(len(r), dtype=torch.float32, device=dev)
        r.level1_confidence = torch.zeros(len(r), dtype=torch.float32, device=dev)
        ok = r.valid.nonzero().flatten().tolist()
        if ok:
            prompts, resps = [r.prompts[i] for i in ok], [r.responses[i] for i in ok]
            scores, conf = self.scorer.score(prompts, resps)
            cost.add_rm("light", len(ok), rm_tokens(self.scorer, prompts, resps))
            r.level1_scores[ok] = torch.as_tensor(scores, dtype=torch.float32, device=dev)
            r.level1_confidence[ok] = torch.as_tensor(conf, dtype=torch.float32, device=dev)
        r.scores, r.confidence = r.level1_scores.clone(), r.level1_confidence.clone()
        r.escalated = torch.zeros(len(r), dtype=torch.bool, device=dev)
        if self.strong_scorer is None or self.cfg.escalate_below <= 0:
            return
        r.escalated = r.valid & (r.level1_confidence < self.cfg.escalate_below)
        idx = r.escalated.nonzero().flatten()
        if len(idx):
            chosen = idx.tolist()
            s_prompts, s_resps = [r.prompts[i] for i in chosen], [r.responses[i] for i in chosen]
            s, c = self.strong_scorer.score(s_prompts, s_resps)
            cost.add_rm("strong", len(chosen), rm_tokens(self.strong_scorer, s_prompts, s_resps))
            r.scores[idx] = torch.as_tensor(s, dtype=torch.float32, device=dev)
            r.confidence[idx] = torch.as_tensor(c, dtype=torch.float32, device=dev)

    def _logits(self, model, r: Rollout, idx: torch.Tensor | None = None) -> torch.Tensor:
        """[b, T, V] response-token logits / temperature from a forward over prompt + response."""
        q, qm, resp, rm = r.query, r.query_mask, r.response, r.response_mask
        if idx is not None:
            q, qm, resp, rm = q[idx], qm[idx], resp[idx], rm[idx]
        ids = torch.cat([q, resp], 1)
        mask = torch.cat([qm, rm.long()], 1)
        pos = (mask.cumsum(-1) - 1).clamp_min(0)  # left padding: positions as in generate
        P, T = q.shape[1], resp.shape[1]
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        return logits[:, P - 1: P - 1 + T].float() / (self.cfg.temperature + 1e-7)

    @torch.no_grad()
    def forward_logprobs(self, r: Rollout) -> None:
        """Old and reference log-probs, entropy and per-token KL, all from full distributions."""
        from trl.trainer.utils import entropy_from_logits, selective_log_softmax

        model = self.acc.unwrap_model(self.policy).eval()
        logits = self._logits(model, r)
        ref_logits = self._logits(self.ref, r)
        core.check_full_distribution(torch.log_softmax(logits[:1], -1), logits.shape[-1])
        r.logprobs = selective_log_softmax(logits, r.response)
        r.ref_logprobs = selective_log_softmax(ref_logits, r.response)
        r.entropy = entropy_from_logits(logits)
        if self.cfg.kl_estimator == "full":
            kl = core.full_kl(logits, ref_logits)  # §5.4: exact, over the whole vocabulary
        else:
            kl = core.kl_estimate(r.logprobs, r.ref_logprobs, self.cfg.kl_estimator)
        r.kl = kl * r.response_mask
        del logits, ref_logits

    # ----------------------------------------------------------------- critic (§3.2)
    @torch.no_grad()
    def critic_values(self, r: Rollout, cost: StepCost | None = None) -> None:
        prompt_tok = [q[m.bool()].tolist() for q, m in zip(r.query, r.query_mask)]
        resp_tok = [g[m].tolist() for g, m in zip(r.response, r.response_mask)]
        window = self.cfg.critic_max_tokens if self.cfg.critic == "light" else None
        ids, mask, start = pack_right(prompt_tok, resp_tok, self.pad_id, window)
        r.critic_ids, r.critic_mask = ids.to(self.acc.device), mask.to(self.acc.device)
        r.critic_start = start.to(self.acc.device)
        r.key_weights = self._key_weights(r, prompt_tok, resp_tok, mask, cost or StepCost())
        critic = self.acc.unwrap_model(self.critic).eval()
        out = critic(r.critic_ids, r.critic_mask, r.key_weights)
        r.values = response_values(out, r.critic_mask, r.critic_start, r.response.shape[1])
        r.values = r.values * r.response_mask

    def _key_weights(self, r: Rollout, prompt_tok, resp_tok, mask, cost: StepCost
                     ) -> torch.Tensor | None:
        cfg = self.cfg
        if cfg.critic != "light" or not cfg.reward_attention_on or \
                not hasattr(self.scorer, "token_scores"):
            return None
        ts = self.scorer.token_scores(r.prompts, r.responses, [len(t) for t in resp_tok])
        # a second light-RM pass (per-token attributions): it costs what a call costs
        cost.add_rm("light", len(r), rm_tokens(self.scorer, r.prompts, r.responses))
        L = mask.shape[1]
        prefix = torch.zeros(mask.shape)
        resp_pos = torch.zeros(mask.shape, dtype=torch.bool)
        for i, ((p_score, scores), p) in enumerate(zip(ts, prompt_tok)):
            n_p = min(len(p), L)
            prefix[i, :n_p] = p_score
            s = torch.tensor(scores[: max(L - n_p, 0)], dtype=torch.float32)
            prefix[i, n_p: n_p + len(s)] = s
            resp_pos[i, n_p: n_p + len(s)] = True
        w = reward_attention_weights(prefix, resp_pos & mask.bool(), cfg.reward_attention_high,
                                     cfg.reward_attention_low, cfg.reward_attention_frac)
        return w.to(self.acc.device)

    # ----------------------------------------------------------------- advantages
    def advantages(self, r: Rollout, step: int) -> dict:
        """Schedules for this step, then per-token rewards and GAE; returns the schedule."""
        cfg = self.cfg
        lam, clip = (lambda_eps(step - 1, cfg.lambda_eps_table) if cfg.lambda_eps_table_on
                     else (cfg.gae_lambda, cfg.clip_range))
        mask = r.loss_mask
        batch_kl = self._global_mean(r.kl, mask)
        if cfg.adaptive_clip_on:
            clip = adaptive_clip(batch_kl, clip, cfg.adaptive_clip_kl_low, cfg.adaptive_clip_kl_high,
                                 cfg.adaptive_clip_low, cfg.adaptive_clip_high,
                                 cfg.adaptive_clip_between)
        rewards = self._gather(r.scores)[self._gather(r.valid)]
        collapsed = False
        if cfg.collapse_detector_on and rewards.numel() > 1:
            collapsed = self.collapse.observe(float(rewards.mean()), float(rewards.std()))
            if collapsed:
                self.kl_ctl.trigger_override(step - 1)
                self._event("rm_refresh", step=step, reason="reward collapse (seed 000 §5.1)",
                            reward_mean=float(rewards.mean()), reward_std=float(rewards.std()),
                            kl_coef=cfg.collapse_kl_coef)
        kl_coef = self.kl_ctl.value(step - 1)
        trainable = int(self._gather(mask.sum().view(1)).sum()) >= 2
        if bool(r.valid.any()):
            r.rewards = core.per_token_rewards(r.scores, r.kl, r.response_mask, kl_coef)
            adv, r.returns = core.gae(r.rewards, r.values, r.response_mask, cfg.gamma, lam)
            if cfg.whiten_advantages and int(mask.sum()) >= 2:
                adv = core.masked_whiten(adv, mask)
            r.advantages = adv * mask
        else:
            r.rewards = r.advantages = r.returns = torch.zeros_like(r.kl)
        return {"gae_lambda": lam, "clip_range": clip, "kl_coef": kl_coef, "batch_kl": batch_kl,
                "rm_refresh": float(collapsed), "trainable": trainable}

    # ----------------------------------------------------------------- PPO epochs
    def ppo_epochs(self, r: Rollout, clip: float, step: int) -> dict:
        cfg = self.cfg
        self.policy.train()
        self.critic.train()
        # minibatch order: a function of (seed, step, rank) only, so a resumed run repeats it
        gen = torch.Generator().manual_seed((cfg.seed * 1_000_003 + step) * 64 + self.rank)
        sums = {"policy_loss": 0.0, "clip_ratio": 0.0, "approx_kl": 0.0, "critic_loss": 0.0,
                "grad_norm": 0.0, "critic_kl_reg": 0.0}
        n, skipped, norms = 0, 0, []
        for _ in range(cfg.ppo_epochs):
            for idx in torch.randperm(len(r), generator=gen).split(cfg.mini_batch_size):
                idx = idx.to(self.acc.device)
                mask = r.loss_mask[idx]
                logp = torch.gather(torch.log_softmax(self._logits(self.policy, r, idx), -1), -1,
                                    r.response[idx].unsqueeze(-1)).squeeze(-1)
                p_loss, clipfrac, approx_kl = core.policy_loss(
                    logp, r.logprobs[idx], r.advantages[idx], mask, clip)
                out = self.critic(r.critic_ids[idx], r.critic_mask[idx],
                                  None if r.key_weights is None else r.key_weights[idx])
                v = response_values(out, r.critic_mask[idx], r.critic_start[idx],
                                    r.response.shape[1])
                c_loss, c_stats = critic_loss(v, r.values[idx], r.returns[idx], mask,
                                              r.scores[idx], cfg.clip_range_value,
                                              cfg.critic_huber_delta, cfg.critic_kl_reg_coef)
                if not self._all_finite(p_loss + c_loss):  # §5: skip, never poison the weights
                    skipped += 1
                    self.opt_p.zero_grad()
                    self.opt_c.zero_grad()
                    continue
                self.acc.backward(p_loss + c_loss)
                norms = [float(p.grad.norm()) for p in self.policy.parameters()
                         if p.grad is not None]
                gnorm = self.acc.clip_grad_norm_(self.policy.parameters(), cfg.max_grad_norm)
                self.acc.clip_grad_norm_(self.critic.parameters(), cfg.max_grad_norm)
                self.opt_p.step()
                self.opt_c.step()
                self.opt_p.zero_grad()
                self.opt_c.zero_grad()
                n += 1
                for k, val in (("policy_loss", p_loss), ("clip_ratio", clipfrac),
                               ("approx_kl", approx_kl), ("critic_loss", c_loss),
                               ("grad_norm", gnorm)):
                    sums[k] += float(val.detach() if torch.is_tensor(val) else val)
                sums["critic_kl_reg"] += c_stats["critic_kl_reg"]
        self._step_schedulers()
        stats = {k: (v / n if n else float("nan")) for k, v in sums.items()}
        stats["nan_skipped"] = float(skipped)
        if skipped:
            self._event("nan_loss_skipped", count=skipped)
        stats["grad_diagnosis"] = (self.gradmon.observe(norms)
                                   if cfg.gradnorm_diagnostics_on and norms else None)
        return stats

    def _step_schedulers(self) -> None:
        """One LR-schedule step per PPO step, whether or not an update was skipped."""
        import warnings

        with warnings.catch_warnings():  # a skipped update must not shift the schedule
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
            self.sched_p.step()
            self.sched_c.step()

    def _no_update(self) -> dict:
        self._event("no_update", reason="fewer than two trainable response tokens")
        self._step_schedulers()
        return {"policy_loss": float("nan"), "clip_ratio": float("nan"),
                "approx_kl": float("nan"), "critic_loss": float("nan"), "grad_norm": float("nan"),
                "critic_kl_reg": float("nan"), "nan_skipped": 0.0, "grad_diagnosis": None}

    # ----------------------------------------------------------------- distributed helpers
    def _gather(self, t: torch.Tensor) -> torch.Tensor:
        return self.acc.gather(t.contiguous()) if self.world > 1 else t

    def _global_mean(self, values: torch.Tensor, mask: torch.Tensor) -> float:
        pair = torch.stack([(values * mask).sum(), mask.sum().to(values.dtype)])
        if self.world > 1:
            pair = self.acc.reduce(pair, "sum")
        return float(pair[0] / pair[1].clamp_min(1.0))

    def _all_finite(self, loss: torch.Tensor) -> bool:
        ok = torch.isfinite(loss.detach()).float().view(1)
        if self.world > 1:  # every rank must take the same branch, or DDP would hang
            ok = self.acc.reduce(ok, "sum") / self.world
        return bool(ok.item() == 1.0)

    # ----------------------------------------------------------------- logging (§4.4)
    def log(self, step: int, r: Rollout, sched: dict, stats: dict, cost: dict) -> dict:
        valid = self._gather(r.valid.float())
        all_valid = valid.bool()
        scores = self._gather(r.scores)[all_valid]
        kl_seq = self._gather(r.kl.sum(1))[all_valid]
        ent = self._global_mean(r.entropy, r.loss_mask)
        m = {
            "step": step,
            "rollout_success_rate": float(valid.mean()),
            "reward_mean": float(scores.mean()) if scores.numel() else float("nan"),
            "reward_std": float(scores.std()) if scores.numel() > 1 else 0.0,
            "kl_div_mean": float(kl_seq.mean()) if kl_seq.numel() else float("nan"),
            "clip_ratio": stats["clip_ratio"],
            "critic_loss": stats["critic_loss"],
            "entropy_mean": ent,
            "policy_loss": stats["policy_loss"], "approx_kl": stats["approx_kl"],
            "grad_norm": stats["grad_norm"], "critic_kl_reg": stats["critic_kl_reg"],
            "nan_skipped": stats["nan_skipped"],
            "kl_coef": sched["kl_coef"], "clip_range": sched["clip_range"],
            "gae_lambda": sched["gae_lambda"], "batch_kl": sched["batch_kl"],
            "rm_refresh": sched["rm_refresh"],
            "response_len_mean": float(self._gather(r.response_lengths.float()).mean()),
            **cost,
        }
        diag = stats.get("grad_diagnosis")
        if diag and diag["peak_log10"] is not None:
            m["grad_norm_peak_log10"] = diag["peak_log10"]
            m["grad_norm_bimodal"] = float(diag["bimodal"])
            for s in diag["suggestions"]:
                text = SUGGESTION_TEXT[s].format(shift=self.cfg.gradnorm_shift_decades)
                self._event("grad_norm_diagnosis", step=step, suggestion=s, message=text)
                # print when a suggestion appears, not on every step it persists (it is logged)
                if self.acc.is_main_process and s not in self._last_suggestions:
                    import warnings

                    warnings.warn(f"step {step}: {text}", stacklevel=2)
        self._last_suggestions = set(diag["suggestions"]) if diag else set()
        if self.acc.is_main_process:
            for k, v in m.items():
                if k != "step" and isinstance(v, float) and math.isfinite(v):
                    self.writer.add_scalar(f"ppo/{k}", v, step)
            self.writer.flush()
            with open(self.paths.out / "metrics.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps(m, sort_keys=True) + "\n")
            if step % self.cfg.csv_every == 0:
                self._csv_line(m)
                if "train_metrics" in self.table_writers:
                    self.table_writers["train_metrics"].write([self.train_metrics_row(m)])
        return m

    def train_metrics_row(self, m: dict) -> dict:
        """The CSV line's six metrics (seed 000 §4.4) as a `train_metrics` row; NaN (no update
        this step) is stored as null, which SQL aggregates skip."""
        def value(key: str) -> float | None:
            v = m[key]
            return float(v) if v is not None and math.isfinite(v) else None

        return {"run_id": self.paths.run_id, "step": m["step"],
                "rollout_success": value("rollout_success_rate"), "rew_mean": value("reward_mean"),
                "rew_std": value("reward_std"), "kl_div": value("kl_div_mean"),
                "clip_ratio": value("clip_ratio"), "critic_loss": value("critic_loss"),
                "entropy": value("entropy_mean"),
                **{f"{k}_cum": m[f"{k}_cum"] for k in (
                    "tokens_generated", "tokens_trained", "rollouts_started", "rollouts_trained",
                    "light_rm_calls", "strong_rm_calls")},
                "seconds_cum": m["seconds_cum"], "logged_at": datetime.now(UTC)}

    def _csv_line(self, m: dict) -> None:
        path = self.paths.out / "metrics.csv"
        new = not path.exists()
        with open(path, "a", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            if new:
                w.writerow(CSV_COLUMNS)
            w.writerow([m["step"]] + [f"{m[c]:.6g}" for c in CSV_COLUMNS[1:]])

    def _event(self, kind: str, **data) -> None:
        if self.acc.is_main_process:
            data.setdefault("step", self.current_step)
            with open(self.paths.out / "events.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"event": kind, **data}, sort_keys=True) + "\n")

    # ----------------------------------------------------------------- rollout and RM rows
    def write_records(self, step: int, r: Rollout) -> None:
        """This step's rollout and RM-score rows from every process, appended by the main
        process's store writers.

        One writer per table and run, not per process: the store's shards hold whole steps (what
        lets a resumed run trim exactly the steps it redoes), and two processes writing the same
        step would need two shards of one step under one name. The rows are small (hashes and
        scalars), so gathering them costs little next to the step itself.
        """
        rows = {"rollouts": self.rollout_rows(step, r)}
        if self.paths.rm_scores is not None:
            rows["rm_scores"] = self.rm_score_rows(step, r)
        if self.world > 1:
            from accelerate.utils import gather_object

            # rank order: the same rows in the same order every run
            gathered = gather_object([rows])
            rows = {t: [row for part in gathered for row in part[t]] for t in rows}
        if self.acc.is_main_process:
            for table, table_rows in rows.items():
                self.table_writers[table].write(table_rows)

    def rollout_rows(self, step: int, r: Rollout) -> list[dict]:
        now = datetime.now(UTC)
        kl_seq = r.kl.sum(1).tolist()
        debug = self.cfg.debug_rollouts
        names = (scorer_identity(self.scorer)[0],
                 scorer_identity(self.strong_scorer)[0] if self.strong_scorer else None)
        return [{
            "run_id": self.paths.run_id, "step": step, "prompt_id": r.prompt_ids[i],
            "prompt_hash": content_hash(r.prompts[i]),
            "response_hash": content_hash(r.responses[i]),
            "reward": float(r.scores[i]) if bool(r.valid[i]) else None,
            "scorer": ("fallback" if not bool(r.valid[i])
                       else names[1] if bool(r.escalated[i]) else names[0]),
            "tier": 2 if bool(r.escalated[i]) else 1, "prompt_tokens": int(r.query_mask[i].sum()),
            "response_tokens": int(r.response_mask[i].sum()),
            "generated_tokens": int(r.extras["generated_tokens"][i]), "kl": float(kl_seq[i]),
            "flags": r.flags[i], "checkpoint_id": r.policy_version, "created_at": now,
            "prompt_text": r.prompts[i] if debug else None,
            "response_text": r.responses[i] if debug else None,
        } for i in range(len(r))]

    def rm_score_rows(self, step: int, r: Rollout) -> list[dict]:
        """One row per RM score PPO uses: the light RM's for every valid rollout (a fallback's
        score is not used) and, for an escalated one, also the strong RM's. `escalated` marks
        both rows of an escalated rollout; `queued`: the score's confidence is below its RM's
        gate, so the sample belongs in that RM's fine-tune queue (seed 000 §3.4)."""
        now = datetime.now(UTC)
        light = scorer_identity(self.scorer)
        strong = scorer_identity(self.strong_scorer) if self.strong_scorer else None
        rows = []
        for i in range(len(r)):
            if not bool(r.valid[i]):
                continue
            escalated = bool(r.escalated[i])
            scored = [(light, float(r.level1_scores[i]), float(r.level1_confidence[i]))]
            if escalated:
                scored.append((strong, float(r.scores[i]), float(r.confidence[i])))
            for (name, version, gate), score, conf in scored:
                rows.append({"run_id": self.paths.run_id, "step": step,
                             "prompt_id": r.prompt_ids[i],
                             "response_hash": content_hash(r.responses[i]), "rm_name": name,
                             "rm_version": version, "score": score, "confidence": conf,
                             "escalated": escalated, "queued": conf < gate, "scored_at": now})
        return rows

    def record_checkpoint(self, step: int, folder: Path, only_if_missing: bool = False) -> None:
        """One row in the `checkpoints` table (run_id=<id>/step-NNNNNNNNN.parquet, atomic)."""
        table = self.paths.checkpoint_table
        if table is None or not self.acc.is_main_process:
            return
        path = run_folder(table, self.paths.run_id) / f"step-{step:09d}.parquet"
        if only_if_missing and path.exists():
            return
        cid = self.paths.checkpoint_id(step)
        row = {"checkpoint_id": cid, "run_id": self.paths.run_id, "step": step,
               "parent_id": self.parent_checkpoint, "data_version": self.data_version,
               "params_hash": content_hash(json.dumps(asdict(self.cfg), sort_keys=True)),
               "path": str(folder), "created_at": datetime.now(UTC)}
        write_shard("checkpoints", [row], path)

    def _trim_checkpoint_rows(self, step: int) -> None:
        """Drop rows of checkpoints after `step` (a killed run may have recorded one whose
        `latest` pointer never moved) and of every step on a fresh start."""
        if self.paths.checkpoint_table is None:
            return
        folder = run_folder(self.paths.checkpoint_table, self.paths.run_id)
        for path in folder.glob("step-*.parquet"):
            if int(path.stem.split("-")[1]) > step:
                path.unlink()
        remove_partials(folder)

    # ----------------------------------------------------------------- checkpoints
    def _trainer_state(self, step: int) -> dict:
        return {"step": step, "sampler": self.sampler.state_dict(),
                "kl_controller": self.kl_ctl.state_dict(),
                "collapse": self.collapse.state_dict(), "gradmon": self.gradmon.state_dict(),
                "totals": self.totals.state_dict(),
                "config": asdict(self.cfg), "world_size": self.world,
                "parent_checkpoint": self.parent_checkpoint}

    def save_checkpoint(self, step: int) -> Path:
        """Atomic: written to a hidden folder, then renamed; `latest` names the newest.

        The rollout, RM-score and metric rows up to `step` are on disk before `latest` moves: a
        run killed later resumes from here and trims only what came after (resume_after=step)."""
        final = self.paths.checkpoints / f"step-{step:06d}"
        tmp = self.paths.checkpoints / f".step-{step:06d}.tmp"
        if self.acc.is_main_process:
            for w in self.table_writers.values():
                w.flush()
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self.acc.wait_for_everyone()
        torch.save({"python": random.getstate(), "torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
                   tmp / f"rng-rank{self.rank}.pt")
        if self.acc.is_main_process:
            torch.save(self.acc.unwrap_model(self.policy).state_dict(), tmp / "policy.pt")
            torch.save(self.acc.unwrap_model(self.critic).state_dict(), tmp / "critic.pt")
            torch.save({"policy": self.opt_p.state_dict(), "critic": self.opt_c.state_dict(),
                        "sched_policy": self.sched_p.state_dict(),
                        "sched_critic": self.sched_c.state_dict()}, tmp / "optim.pt")
            (tmp / "trainer_state.json").write_text(json.dumps(self._trainer_state(step)))
        self.acc.wait_for_everyone()
        if self.acc.is_main_process:
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
            latest = self.paths.checkpoints / ".latest.tmp"
            latest.write_text(final.name)
            latest.replace(self.paths.checkpoints / "latest")
            self.record_checkpoint(step, final)
        self.parent_checkpoint = self.paths.checkpoint_id(step)
        self.acc.wait_for_everyone()
        return final

    def load_checkpoint(self) -> int:
        """Restore the newest checkpoint; drop every record written after it. Returns its step."""
        pointer = self.paths.checkpoints / "latest"
        if not pointer.exists():
            raise FileNotFoundError(f"no checkpoint to resume from in {self.paths.checkpoints}")
        ckpt = self.paths.checkpoints / pointer.read_text().strip()
        state = json.loads((ckpt / "trainer_state.json").read_text())
        if state["world_size"] != self.world:
            raise ValueError(f"checkpoint was written by {state['world_size']} processes, "
                             f"this run has {self.world}: resume with the same world size")
        step = int(state["step"])
        self.acc.unwrap_model(self.policy).load_state_dict(torch.load(ckpt / "policy.pt"))
        self.acc.unwrap_model(self.critic).load_state_dict(torch.load(ckpt / "critic.pt"))
        optim = torch.load(ckpt / "optim.pt", weights_only=False)
        self.opt_p.load_state_dict(optim["policy"])
        self.opt_c.load_state_dict(optim["critic"])
        self.sched_p.load_state_dict(optim["sched_policy"])
        self.sched_c.load_state_dict(optim["sched_critic"])
        self.sampler.load_state_dict(state["sampler"])
        self.kl_ctl.load_state_dict(state["kl_controller"])
        self.collapse.load_state_dict(state["collapse"])
        self.gradmon.load_state_dict(state["gradmon"])
        if "totals" in state:
            self.totals.load_state_dict(state["totals"])
        rng = torch.load(ckpt / f"rng-rank{self.rank}.pt", weights_only=False)
        random.setstate(rng["python"])
        torch.set_rng_state(rng["torch"])
        if rng["cuda"] is not None:
            torch.cuda.set_rng_state_all(rng["cuda"])
        if self.acc.is_main_process:
            self._truncate_logs(step)
            self._trim_checkpoint_rows(step)
            # killed between `latest` and the row: write it now (same id, same parent)
            self.parent_checkpoint = state.get("parent_checkpoint")
            self.record_checkpoint(step, ckpt, only_if_missing=True)
            for folder in self.paths.step_tables.values():
                for bucket in run_folder(folder, self.paths.run_id).glob("step_bucket=*"):
                    remove_partials(bucket)  # a shard the kill interrupted (never visible)
        self.parent_checkpoint = self.paths.checkpoint_id(step)
        self.acc.wait_for_everyone()
        return step

    def _truncate_logs(self, step: int) -> None:
        """Remove the log lines a killed run wrote after checkpoint `step` (they are redone);
        its rollout, RM-score and metric rows are trimmed by the store writers (resume_after)."""
        for name, keep in (("metrics.jsonl", lambda m: m["step"] <= step),
                           ("events.jsonl", lambda m: m.get("step", 0) <= step)):
            path = self.paths.out / name
            if path.exists():
                lines = [ln for ln in path.read_text().splitlines()
                         if ln.strip() and keep(json.loads(ln))]
                path.write_text("".join(ln + "\n" for ln in lines))
        path = self.paths.out / "metrics.csv"
        if path.exists():
            rows = path.read_text().splitlines()
            kept = rows[:1] + [r for r in rows[1:] if int(r.split(",")[0]) <= step]
            path.write_text("".join(r + "\n" for r in kept))

    def _reset_outputs(self) -> None:
        if self.acc.is_main_process:
            for name in ("metrics.jsonl", "metrics.csv", "events.jsonl", "summary.json"):
                (self.paths.out / name).unlink(missing_ok=True)
            shutil.rmtree(self.paths.out / "tensorboard", ignore_errors=True)
            shutil.rmtree(self.paths.checkpoints, ignore_errors=True)
            for folder in self.paths.step_tables.values():
                shutil.rmtree(run_folder(folder, self.paths.run_id), ignore_errors=True)
            self._trim_checkpoint_rows(-1)
            self.paths.out.mkdir(parents=True, exist_ok=True)
        self.acc.wait_for_everyone()

    # ----------------------------------------------------------------- the end
    def finish(self, last: dict) -> dict:
        if self.acc.is_main_process:
            for w in self.table_writers.values():
                w.close()
        policy = self.acc.unwrap_model(self.policy)
        digest = hashlib.sha256()
        for name, t in sorted(policy.state_dict().items()):
            digest.update(name.encode())
            digest.update(t.detach().cpu().contiguous().numpy().tobytes())
        (self.paths.out / f"weights-rank{self.rank}.sha256").write_text(digest.hexdigest())
        if self.acc.is_main_process:
            policy.save_pretrained(self.paths.out / "policy")
            self.tokenizer.save_pretrained(self.paths.out / "policy")
            torch.save(self.acc.unwrap_model(self.critic).state_dict(),
                       self.paths.out / "critic.pt")
            summary = {"run_id": self.paths.run_id, "steps": self.cfg.total_steps,
                       "world_size": self.world, "final": last,
                       "cost": self.totals.as_metrics()}
            (self.paths.out / "summary.json").write_text(json.dumps(summary, indent=1))
            self.writer.close()
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
        from rich.progress import track

        return track(steps, description="PPO steps")


# --------------------------------------------------------------------------- entry point
def run(cfg: PPOConfig, policy_path: str | Path, reward_path: str | Path,
        prompts_path: str | Path, out: str | Path, rollouts: str | Path,
        run_id: str | None = None, resume: bool = False, progress: bool = True,
        checkpoint_table: str | Path | None = None,
        difficulty: str | Path | None = None, strong_reward: str | Path | None = None,
        rm_scores: str | Path | None = None, train_metrics: str | Path | None = None) -> dict:
    """Load the policy, reference, tokenizer and reward model(s) from disk and run PPO.

    With `difficulty` (a `difficulty` table folder) batches come from the stratified sampler
    over difficulty bucket x topic cluster; without it, from uniformly shuffled epochs. With
    `strong_reward` (an RM folder), rollouts below `cfg.escalate_below` light-RM confidence are
    re-scored by it (Level 2). `rm_scores` / `train_metrics`: those tables' folders."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlhf.pipeline.ppo.scoring import load_scorer

    import warnings

    try:  # one torch thread by default, like every stage (measured faster on a shared CPU)
        from rlhf.pipeline.policy import set_threads
    except ImportError:  # the reward branch's stages are not merged yet
        pass
    else:
        set_threads()
    # transformers warns on every model.train() of a checkpoint-capable model; once is enough
    warnings.filterwarnings("once", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(str(policy_path))
    attn = attn_implementation(cfg.attn_implementation)
    policy = AutoModelForCausalLM.from_pretrained(str(policy_path), attn_implementation=attn)
    ref = AutoModelForCausalLM.from_pretrained(str(policy_path), attn_implementation=attn)
    scorer = load_scorer(reward_path, name="light_rm")
    strong = load_scorer(strong_reward, name="strong_rm") if strong_reward is not None else None
    prompts = load_prompts(prompts_path)
    sampler = None
    if difficulty is not None:
        from accelerate import PartialState

        sampler = StratifiedPromptSampler(prompts, strata(prompts_path, difficulty),
                                          cfg.batch_size * PartialState().num_processes, cfg.seed)
    paths = RunPaths(Path(out), Path(rollouts), run_id or Path(out).name, checkpoint_table,
                     rm_scores, train_metrics)
    trainer = PPOTrainer(cfg, policy, ref, tokenizer, scorer, prompts, paths,
                         policy_path=str(policy_path), progress=progress, sampler=sampler,
                         strong_scorer=strong)
    if trainer.rank == 0:
        paths.out.mkdir(parents=True, exist_ok=True)
    return trainer.train(resume=resume)
