"""Checkpoints of a PPO run: weights, optimisers, schedulers, RNG of every process, and the state
of everything stateful (sampler, KL controller, detectors, cost totals, every rollout hook).

Atomic: written to a hidden folder, then renamed; `latest` names the newest. The store rows up to
the checkpoint's step are on disk before `latest` moves, so a run killed later resumes from here
and trims only what came after.

    rlhf ppo ... --resume          # continue exactly from checkpoints/latest
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import asdict
from pathlib import Path

import torch

from rlhf.pipeline.ppo import lora as ppo_lora


def trainer_state(t, step: int) -> dict:
    return {"step": step, "sampler": t.sampler.state_dict(), "kl_controller": t.kl_ctl.state_dict(),
            "collapse": t.collapse.state_dict(), "gradmon": t.gradmon.state_dict(),
            "totals": t.totals.state_dict(), "hooks": t.hooks.state_dict(),
            "config": asdict(t.cfg), "world_size": t.dist.world,
            "parent_checkpoint": t.parent_checkpoint}


def save(t, step: int) -> Path:
    """Checkpoint `step` of trainer `t` (every process takes part)."""
    acc, paths = t.acc, t.paths
    final = paths.checkpoints / f"step-{step:06d}"
    tmp = paths.checkpoints / f".step-{step:06d}.tmp"
    if acc.is_main_process:
        t.recorder.flush()
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    acc.wait_for_everyone()
    torch.save({"python": random.getstate(), "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
               tmp / f"rng-rank{t.dist.rank}.pt")
    e = t.sharded  # every process: ZeRO-3 gathers weights and writes its optimiser share
    # without a critic (a group estimator: advantages.py) there is no critic.pt and no critic
    # entries in optim.pt
    models = {"policy": e.policy, **({"critic": e.critic} if e.critic is not None else {})}
    lora = t.cfg.lora.enabled  # LoRA (ppo/lora.py): only the trained tensors, the base is the input
    weights = {name: ppo_lora.trained_weights(m) if lora else m.full_state()
               for name, m in models.items()}
    optim = {name: m.save(tmp, name) for name, m in models.items()}
    if acc.is_main_process:
        for name in models:
            torch.save(weights[name], tmp / f"{name}.pt")
        torch.save({**optim, **{f"sched_{name}": m.scheduler.state_dict()
                                for name, m in models.items()}}, tmp / "optim.pt")
        if lora:  # the adapters as a peft folder too: what `rlhf export --merge` reads
            ppo_lora.save_adapter(e.policy.model, tmp / "adapter")
        (tmp / "trainer_state.json").write_text(json.dumps(trainer_state(t, step)))
        # the run's seconds so far: a wall-clock figure, kept out of the output hash (.dvcignore)
        (tmp / "timings.json").write_text(json.dumps({"seconds": t.totals.seconds}))
    acc.wait_for_everyone()
    if acc.is_main_process:
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        latest = paths.checkpoints / ".latest.tmp"
        latest.write_text(final.name)
        latest.replace(paths.checkpoints / "latest")
        t.recorder.record_checkpoint(step, final, t.parent_checkpoint, t.data_version)
    t.parent_checkpoint = paths.checkpoint_id(step)
    acc.wait_for_everyone()
    return final


def load(t) -> int:
    """Restore the newest checkpoint into trainer `t`; drop every record written after it.
    Returns its step."""
    acc, paths = t.acc, t.paths
    pointer = paths.checkpoints / "latest"
    if not pointer.exists():
        raise FileNotFoundError(f"no checkpoint to resume from in {paths.checkpoints}")
    ckpt = paths.checkpoints / pointer.read_text().strip()
    state = json.loads((ckpt / "trainer_state.json").read_text())
    if state["world_size"] != t.dist.world:
        raise ValueError(f"checkpoint was written by {state['world_size']} processes, "
                         f"this run has {t.dist.world}: resume with the same world size")
    step = int(state["step"])
    e = t.sharded
    optim = torch.load(ckpt / "optim.pt", weights_only=False)
    # a critic's files are read only when the run has a critic (one a checkpoint written with
    # a critic still carries is not needed by a group estimator)
    for name, m in (("policy", e.policy), ("critic", e.critic)):
        if m is None:
            continue
        weights = torch.load(ckpt / f"{name}.pt")
        if t.cfg.lora.enabled:  # the trained tensors into the base the run was started from
            ppo_lora.restore(m, weights, optim[name])
        else:
            m.load(ckpt, name, weights, optim[name])
        m.scheduler.load_state_dict(optim[f"sched_{name}"])
    t.sampler.load_state_dict(state["sampler"])
    t.kl_ctl.load_state_dict(state["kl_controller"])
    t.collapse.load_state_dict(state["collapse"])
    t.gradmon.load_state_dict(state["gradmon"])
    t.totals.load_state_dict(state["totals"])
    if (ckpt / "timings.json").exists():  # absent when a checkout restored the run from DVC
        t.totals.seconds = float(json.loads((ckpt / "timings.json").read_text())["seconds"])
    t.hooks.load_state_dict(state.get("hooks", {}))
    rng = torch.load(ckpt / f"rng-rank{t.dist.rank}.pt", weights_only=False)
    random.setstate(rng["python"])
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] is not None:
        torch.cuda.set_rng_state_all(rng["cuda"])
    if acc.is_main_process:
        t.recorder.truncate(step)
        # killed between `latest` and the row: write it now (same id, same parent)
        t.recorder.record_checkpoint(step, ckpt, state.get("parent_checkpoint"), t.data_version,
                                     only_if_missing=True)
    t.parent_checkpoint = paths.checkpoint_id(step)
    acc.wait_for_everyone()
    return step
