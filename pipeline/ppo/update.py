"""PPO's learning phases: the critic's values, this step's schedules and advantages (the
estimator of advantages.py: GAE, or a group estimator without a critic), and the
clipped-surrogate epochs over minibatches (the math is core.py's pure functions).

    python -c "from rlhf.pipeline.ppo.update import Learner; help(Learner.epochs)"
"""

from __future__ import annotations

import torch

from rlhf.pipeline.ppo import core
from rlhf.pipeline.ppo.advantages import estimator
from rlhf.pipeline.ppo.critic import (critic_loss, pack_right, response_values,
                                      reward_attention_weights, value_quality,
                                      value_quality_sums)
from rlhf.pipeline.ppo.generate import policy_logits
from rlhf.pipeline.ppo.schedules import adaptive_clip, lambda_eps


class Learner:
    """Updates the policy and critic through their sharding (sharding.py); owns the per-step
    schedule state."""

    def __init__(self, cfg, sharded, dist, accelerator, kl_ctl, collapse, gradmon, event):
        self.cfg, self.sharded = cfg, sharded
        self.policy = sharded.policy.module
        self.critic = sharded.critic.module if sharded.critic else None  # None: group estimator
        self.dist, self.acc = dist, accelerator
        self.kl_ctl, self.collapse, self.gradmon, self.event = kl_ctl, collapse, gradmon, event
        self.estimator = estimator(cfg.advantage_estimator)

    def no_values(self, r) -> None:
        """A group estimator has no critic: V is 0 and the critic is not run."""
        r.values = torch.zeros(r.response.shape, dtype=torch.float32, device=r.response.device)

    # ----------------------------------------------------------------- critic (§3.2)
    @torch.no_grad()
    def values(self, r, pad_id: int, scorer=None, cost=None) -> None:
        """V_old at every response position; reward-aware key weights when configured."""
        cfg = self.cfg
        prompt_tok = [q[m.bool()].tolist() for q, m in zip(r.query, r.query_mask)]
        resp_tok = [g[m].tolist() for g, m in zip(r.response, r.response_mask)]
        window = cfg.critic_max_tokens if cfg.critic != "full" else None
        ids, mask, start = pack_right(prompt_tok, resp_tok, pad_id, window)
        dev = self.acc.device
        r.critic_ids, r.critic_mask, r.critic_start = ids.to(dev), mask.to(dev), start.to(dev)
        r.key_weights = self._key_weights(r, prompt_tok, resp_tok, mask, scorer, cost)
        critic = self.sharded.critic.model.eval()
        out = critic(r.critic_ids, r.critic_mask, r.key_weights)
        r.values = response_values(out, r.critic_mask, r.critic_start, r.response.shape[1])
        r.values = r.values * r.response_mask

    def _key_weights(self, r, prompt_tok, resp_tok, mask, scorer, cost):
        from rlhf.pipeline.ppo.accounting import rm_tokens

        cfg = self.cfg
        if cfg.critic not in ("light", "shared") or not cfg.reward_attention_on or \
                not hasattr(scorer, "token_scores"):
            return None
        ts = scorer.token_scores(r.prompts, r.responses, [len(t) for t in resp_tok])
        if cost is not None:  # a second light-RM pass (per-token attributions): it costs a call
            cost.add_rm("light", len(r), rm_tokens(scorer, r.prompts, r.responses))
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

    def value_quality(self, r) -> dict[str, float]:
        """Explained variance and RMSE of V_old against this step's returns, over the trainable
        tokens of every process (critic.value_quality)."""
        sums = value_quality_sums(r.values, r.returns, r.loss_mask).to(self.acc.device)
        return value_quality(self.acc.reduce(sums, "sum") if self.dist.world > 1 else sums)

    # ----------------------------------------------------------------- advantages
    def advantages(self, r, step: int) -> dict:
        """Schedules for this step, then per-token rewards and the estimator's advantages
        (rows of one prompt group are contiguous, `group_size` each); returns the schedule."""
        cfg, dist = self.cfg, self.dist
        lam, clip = (lambda_eps(step - 1, cfg.lambda_eps_table) if cfg.lambda_eps_table_on
                     else (cfg.gae_lambda, cfg.clip_range))
        mask = r.loss_mask
        batch_kl = dist.global_mean(r.kl, mask)  # per token
        if cfg.adaptive_clip_on:
            kl = batch_kl if cfg.adaptive_clip_kl == "token" else dist.global_mean(
                r.kl.sum(1), r.valid.to(r.kl.dtype))  # per sequence
            clip = adaptive_clip(kl, clip, cfg.adaptive_clip_kl_low, cfg.adaptive_clip_kl_high,
                                 cfg.adaptive_clip_low, cfg.adaptive_clip_high,
                                 cfg.adaptive_clip_between)
        rewards = dist.gather(r.scores)[dist.gather(r.valid)]
        collapsed = False
        if cfg.collapse_detector_on and rewards.numel() > 1:
            collapsed = self.collapse.observe(float(rewards.mean()), float(rewards.std()))
            if collapsed:
                self.kl_ctl.trigger_override(step - 1)
                self.event("rm_refresh", step=step, reason="reward collapse (seed 000 §5.1)",
                           reward_mean=float(rewards.mean()), reward_std=float(rewards.std()),
                           kl_coef=cfg.collapse_kl_coef)
        kl_coef = self.kl_ctl.value(step - 1)
        trainable = int(dist.gather(mask.sum().view(1)).sum()) >= 2
        if bool(r.valid.any()):
            r.rewards = core.per_token_rewards(r.scores, r.kl, r.response_mask, kl_coef)
            groups = torch.arange(len(r), device=r.rewards.device) // cfg.group_size
            adv, r.returns = self.estimator.estimate(r.rewards, r.values, r.response_mask,
                                                     groups, cfg.gamma, lam)
            # a group estimator's advantages are normalised already (advantages.py)
            if cfg.whiten_advantages and not self.estimator.normalised and int(mask.sum()) >= 2:
                adv = core.masked_whiten(adv, mask)
            r.advantages = adv * mask
        else:
            r.rewards = r.advantages = r.returns = torch.zeros_like(r.kl)
        return {"gae_lambda": lam, "clip_range": clip, "kl_coef": kl_coef, "batch_kl": batch_kl,
                "rm_refresh": float(collapsed), "trainable": trainable}

    # ----------------------------------------------------------------- PPO epochs
    def epochs(self, r, clip: float, step: int, cost=None) -> dict:
        """`ppo_epochs` passes of clipped-surrogate + value updates over shuffled minibatches
        (no value update with a group estimator); the forwards' token counts go to `cost`."""
        cfg, rank = self.cfg, self.dist.rank
        critic_on = self.estimator.needs_critic
        self.policy.train()
        if critic_on:
            self.critic.train()
        # minibatch order: a function of (seed, step, rank) only, so a resumed run repeats it
        gen = torch.Generator().manual_seed((cfg.seed * 1_000_003 + step) * 64 + rank)
        sums = {"policy_loss": 0.0, "clip_ratio": 0.0, "approx_kl": 0.0, "critic_loss": 0.0,
                "grad_norm": 0.0, "critic_kl_reg": 0.0}
        n, skipped, stepped, norms = 0, 0, 0, []
        for _ in range(cfg.ppo_epochs):
            for idx in torch.randperm(len(r), generator=gen).split(cfg.mini_batch_size):
                idx = idx.to(self.acc.device)
                mask = r.loss_mask[idx]
                logp = torch.gather(
                    torch.log_softmax(policy_logits(self.policy, r, cfg.temperature, idx), -1),
                    -1, r.response[idx].unsqueeze(-1)).squeeze(-1)
                p_loss, clipfrac, approx_kl = core.policy_loss(
                    logp, r.logprobs[idx], r.advantages[idx], mask, clip)
                if cost is not None:
                    cost.update_token_forwards += len(idx) * (r.query.shape[1]
                                                              + r.response.shape[1])
                if critic_on:
                    # the loss in float32: under bf16 engines (ZeRO-3 on a GPU) the values come
                    # out bf16, and mixing them with the float32 returns in the loss broke the
                    # critic's backward ("Found dtype Float but expected BFloat16")
                    out = self.critic(r.critic_ids[idx], r.critic_mask[idx],
                                      None if r.key_weights is None else r.key_weights[idx]
                                      ).float()
                    v = response_values(out, r.critic_mask[idx], r.critic_start[idx],
                                        r.response.shape[1])
                    c_loss, c_stats = critic_loss(v, r.values[idx], r.returns[idx], mask,
                                                  r.scores[idx], cfg.clip_range_value,
                                                  cfg.critic_huber_delta, cfg.critic_kl_reg_coef)
                    if cost is not None:
                        cost.critic_token_forwards += int(r.critic_ids[idx].numel())
                else:
                    c_loss, c_stats = torch.zeros((), device=p_loss.device), {"critic_kl_reg": 0.0}
                if not self.dist.all_finite(p_loss + c_loss):  # §5: skip, never poison weights
                    skipped += 1
                    self.sharded.zero_grad()
                    continue
                # an optimiser step at every `gradient_accumulation_steps`-th minibatch
                gnorm = self.sharded.update(p_loss, c_loss)
                if gnorm is not None:
                    stepped += 1
                    sums["grad_norm"] += gnorm
                    norms = self.sharded.policy.grad_norms
                n += 1
                for k, val in (("policy_loss", p_loss), ("clip_ratio", clipfrac),
                               ("approx_kl", approx_kl), ("critic_loss", c_loss)):
                    sums[k] += float(val.detach() if torch.is_tensor(val) else val)
                sums["critic_kl_reg"] += c_stats["critic_kl_reg"]
        self.step_schedulers()
        stats = {k: (v / n if n else float("nan")) for k, v in sums.items()}
        stats["grad_norm"] = sums["grad_norm"] / stepped if stepped else float("nan")
        stats["nan_skipped"] = float(skipped)
        stats.update(self.value_quality(r))
        if skipped:
            self.event("nan_loss_skipped", count=skipped)
        stats["grad_diagnosis"] = (self.gradmon.observe(norms)
                                   if cfg.gradnorm_diagnostics_on and norms else None)
        return stats

    def step_schedulers(self) -> None:
        """One LR-schedule step per PPO step, whether or not an update was skipped."""
        import warnings

        with warnings.catch_warnings():  # a skipped update must not shift the schedule
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
            self.sharded.step_schedulers()

    def no_update(self) -> dict:
        self.event("no_update", reason="fewer than two trainable response tokens")
        self.step_schedulers()
        return {"policy_loss": float("nan"), "clip_ratio": float("nan"),
                "approx_kl": float("nan"), "critic_loss": float("nan"), "grad_norm": float("nan"),
                "critic_kl_reg": float("nan"), "nan_skipped": 0.0, "grad_diagnosis": None,
                "value_explained_variance": float("nan"), "value_rmse": float("nan")}
