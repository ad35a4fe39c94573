"""How PPO's models are sharded and trained (`ppo.sharding` picks the kind): the policy and the
critic each a `ShardedModel` (its optimiser, LR schedule, how a loss updates it, how its weights
are read and restored), the reference policy an inference one. ("Engine" names the decode loop,
pipeline/decode/, and DeepSpeed's own objects; the summary's `engines` key keeps its name so the
recorded outputs stay as they were.)

    rlhf ppo ...                                                    # ppo.sharding: none
    torchrun --nproc_per_node 2 -m rlhf.cli.app ppo ...             # none: data parallel (DDP)
    torchrun --nproc_per_node 2 -m rlhf.cli.app ppo ... -p p.yaml   # p.yaml: sharding: zero3

`none` (the default) is plain data parallel: accelerate prepares both models and optimisers (DDP
with more than one process) and every process holds a full reference copy.

`zero3`: accelerate hands DeepSpeed one model at most, so, like OpenRLHF's DeepSpeed strategy,
the policy and the critic are each given to `deepspeed.initialize` with their own optimiser (one
engine each) and the reference to one without an optimiser (an inference engine). All three are
ZeRO-3 partitioned over the processes. The settings are a DeepSpeed JSON (`rlhf ppo
--deepspeed-config`, default configs/deepspeed_zero3.json: optimiser state offloaded to the CPU,
parameters not, fp16 gradient communication; seed 000 §4.1, §5.5) whose "auto" fields are filled
here from PPOConfig and the launch. Gradient accumulation is `ppo.gradient_accumulation_steps`
in both kinds; under ZeRO-3 it must be a multiple of the processes (§5.5). Generation gathers the
policy's parameters for the whole `generate` call (as TRL does for ZeRO-3): processes stop
sampling at different lengths, so per-forward all-gathers would not line up.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import sys
import time
import warnings
from pathlib import Path

import torch

from rlhf.pipeline.config import ConfigError
from rlhf.pipeline.ppo.config import check_gradient_accumulation

DEFAULT_DEEPSPEED_CONFIG = Path("configs/deepspeed_zero3.json")
STALE_BUILD_LOCK_S = 900.0  # a JIT build of DeepSpeed's CPU ops takes about a minute on 2 cores


class ShardedModel:
    """One trained model: `module` is what forward calls (DDP wrapper, DeepSpeed engine or the
    model itself), `model` the model (weights, save_pretrained)."""

    def __init__(self, module, model, optimizer, scheduler, acc, max_grad_norm: float):
        self.module, self.model, self.acc = module, model, acc
        self.optimizer, self.scheduler, self.max_grad_norm = optimizer, scheduler, max_grad_norm
        self.grad_norms: list[float] = []  # per parameter, before clipping, at the last update

    def step(self) -> float:
        """Clip and apply the accumulated gradient; the pre-clip global norm."""
        self.grad_norms = [float(p.grad.norm()) for p in self.model.parameters()
                           if p.grad is not None]
        gnorm = self.acc.clip_grad_norm_(self.module.parameters(), self.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad()
        return float(gnorm)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def full_state(self) -> dict:
        """The full weights (every process calls it)."""
        return self.model.state_dict()

    def save(self, folder: Path, name: str) -> dict | None:
        """Optimiser state for optim.pt (every process calls it)."""
        return self.optimizer.state_dict()

    def load(self, folder: Path, name: str, weights: dict, optim: dict | None) -> None:
        self.model.load_state_dict(weights)
        self.optimizer.load_state_dict(optim)

    @contextlib.contextmanager
    def generation(self):
        from trl.models.utils import unwrap_model_for_generation

        with unwrap_model_for_generation(self.module, self.acc) as model:
            yield model


class ZeroShardedModel(ShardedModel):
    """A DeepSpeed ZeRO-3 engine: it scales the loss for accumulation, steps the optimiser only at
    accumulation boundaries and clips by `gradient_clipping` itself."""

    def step(self) -> float | None:
        before = self.module.global_steps
        self.module.step()
        if self.module.global_steps == before:
            return None  # inside an accumulation window
        norm = self.module.get_global_grad_norm()
        return float(norm) if norm is not None else math.nan

    def zero_grad(self) -> None:
        self.module.zero_grad()

    def full_state(self) -> dict:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(self.model.parameters())):
            return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}

    def save(self, folder: Path, name: str) -> None:
        # the fp32 master weights and Adam moments stay partitioned: DeepSpeed writes each
        # process's share (exact resume), optim.pt keeps only the schedules
        self.module.save_checkpoint(str(folder / "zero3"), tag=name, save_latest=False)

    def load(self, folder: Path, name: str, weights: dict, optim: dict | None) -> None:
        self.module.load_checkpoint(str(folder / "zero3"), tag=name, load_optimizer_states=True,
                                    load_lr_scheduler_states=False, load_module_strict=True)

    @contextlib.contextmanager
    def generation(self):
        import deepspeed
        from trl.models.utils import add_hooks, remove_hooks

        with deepspeed.zero.GatheredParameters(list(self.model.parameters())):
            remove_hooks(self.module)
            try:
                yield self.model
            finally:
                add_hooks(self.module)


class ShardedModels:
    """The policy and critic sharded models and the reference, updated together once per minibatch;
    `critic` is None for an estimator without one (advantages.py: GRPO, RLOO)."""

    def __init__(self, kind: str, policy: ShardedModel, critic: ShardedModel, ref, accumulation: int,
                 acc, described: dict):
        self.kind, self.policy, self.critic, self.ref = kind, policy, critic, ref
        self.accumulation, self.acc, self.described = accumulation, acc, described
        self._micro = 0

    def update(self, p_loss: torch.Tensor, c_loss: torch.Tensor) -> float | None:
        """Backward one minibatch; at an accumulation boundary clip and step both optimisers.
        Returns the policy's pre-clip gradient norm when it stepped, else None."""
        if self.kind == "zero3":
            self.policy.module.backward(p_loss)
            if self.critic is not None:
                self.critic.module.backward(c_loss)
            gnorm = self.policy.step()
            if self.critic is not None:
                self.critic.step()
            return gnorm
        loss = p_loss + c_loss
        self.acc.backward(loss / self.accumulation if self.accumulation > 1 else loss)
        self._micro += 1
        if self._micro % self.accumulation:
            return None
        gnorm = self.policy.step()
        if self.critic is not None:
            self.critic.step()
        return gnorm

    def zero_grad(self) -> None:
        self.policy.zero_grad()
        if self.critic is not None:
            self.critic.zero_grad()

    def step_schedulers(self) -> None:
        self.policy.scheduler.step()
        if self.critic is not None:
            self.critic.scheduler.step()


def build(cfg, acc, policy, critic, ref, deepspeed_config: Path | None = None) -> ShardedModels:
    """The sharded models of `cfg.sharding` for these models (every process calls it); `critic` None:
    no critic engine (a group estimator)."""
    world = acc.num_processes
    def decay(s: int) -> float:  # the LR schedule of both models, stepped once per PPO step
        return max(0.1, 1.0 - s / max(cfg.total_steps, 1))

    if acc.gradient_accumulation_steps != 1:
        raise ConfigError("gradient accumulation is ppo.gradient_accumulation_steps, not the "
                          f"accelerate config's ({acc.gradient_accumulation_steps})")
    if hasattr(critic, "copy_from_policy"):  # a trunk critic starts as the (SFT) policy's layers
        critic.copy_from_policy(policy)
    described = {"sharding": cfg.sharding, "processes": world,
                 "gradient_accumulation_steps": cfg.gradient_accumulation_steps}
    if cfg.sharding == "none":
        if acc.state.deepspeed_plugin is not None:
            raise ConfigError("launched with a DeepSpeed accelerate config: set ppo.sharding: "
                              "zero3 (accelerate cannot prepare the policy and the critic "
                              "together under DeepSpeed)")
        opt_p = torch.optim.AdamW(policy.parameters(), lr=cfg.learning_rate)
        sched_p = torch.optim.lr_scheduler.LambdaLR(opt_p, decay)
        critic_engine = None
        if critic is None:
            mod_p, opt_p = acc.prepare(policy, opt_p)
        else:
            opt_c = torch.optim.AdamW(critic.parameters(), lr=cfg.critic_learning_rate)
            sched_c = torch.optim.lr_scheduler.LambdaLR(opt_c, decay)
            mod_p, mod_c, opt_p, opt_c = acc.prepare(policy, critic, opt_p, opt_c)
            critic_engine = ShardedModel(mod_c, acc.unwrap_model(mod_c), opt_c, sched_c, acc,
                                   cfg.max_grad_norm)
        ref = ref.to(acc.device)
        return ShardedModels("none", ShardedModel(mod_p, acc.unwrap_model(mod_p), opt_p, sched_p, acc,
                                      cfg.max_grad_norm),
                       critic_engine, ref, cfg.gradient_accumulation_steps, acc, described)
    return _zero3(cfg, acc, policy, critic, ref, deepspeed_config or DEFAULT_DEEPSPEED_CONFIG,
                  decay, described)


def deepspeed_config(cfg, acc, hidden_size: int, path: Path | None = None) -> dict:
    """The DeepSpeed JSON at `path` with its "auto" fields filled in. Read from the file even
    under an accelerate DeepSpeed launch: accelerate's plugin fills "auto" with its own
    defaults (gradient accumulation 1, clipping 1.0), not PPO's."""
    path = Path(path or DEFAULT_DEEPSPEED_CONFIG)
    try:
        ds = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--deepspeed-config {path}: not a readable DeepSpeed JSON: "
                          f"{exc}") from None
    zero = ds.setdefault("zero_optimization", {})
    if zero.get("stage") != 3:
        raise ConfigError(f"ppo.sharding zero3 needs zero_optimization.stage 3, the DeepSpeed "
                          f"config has {zero.get('stage')}")
    if zero.get("offload_param", {}).get("device", "none") != "none":
        # seed 000 §4.1: offloading parameters slowed rollout generation 3.2 s -> 11.7 s
        raise ConfigError("ppo.sharding zero3: offload_param must be none (seed 000 §4.1)")
    ga = cfg.gradient_accumulation_steps
    auto = {"train_micro_batch_size_per_gpu": cfg.mini_batch_size,
            "gradient_accumulation_steps": ga,
            "train_batch_size": cfg.mini_batch_size * ga * acc.num_processes,
            "gradient_clipping": cfg.max_grad_norm}
    for key, value in auto.items():
        if ds.get(key, "auto") == "auto":
            ds[key] = value
        elif ds[key] != value:
            raise ConfigError(f"DeepSpeed config {key} is {ds[key]}, PPO needs {value} "
                              "(set it to \"auto\")")
    for key, value in (("reduce_bucket_size", hidden_size * hidden_size),
                       ("stage3_prefetch_bucket_size", int(0.9 * hidden_size * hidden_size)),
                       ("stage3_param_persistence_threshold", 10 * hidden_size)):
        if zero.get(key) == "auto":  # accelerate's fill for "auto" (hidden size based)
            zero[key] = value
    for mp in ("bf16", "fp16"):  # from the launch (ACCELERATE_MIXED_PRECISION / --mixed_precision)
        if ds.get(mp, {}).get("enabled") == "auto":
            ds[mp]["enabled"] = acc.mixed_precision == mp
    return ds


def extension_builds(stale_after_s: float = STALE_BUILD_LOCK_S) -> Path:
    """Where torch JIT-builds DeepSpeed's ops (cpu_adam, shm_comm), made safe to wait on: one
    folder per Python environment (`sys.prefix`/torch_extensions, unless TORCH_EXTENSIONS_DIR
    names another or the environment is read-only), so two checkouts' venvs do not rebuild each
    other's ops in the shared ~/.cache; and a build lock older than `stale_after_s` is removed
    with a warning: torch waits on a lock without end, and a build killed mid-way leaves one."""
    if "TORCH_EXTENSIONS_DIR" not in os.environ and os.access(sys.prefix, os.W_OK):
        os.environ["TORCH_EXTENSIONS_DIR"] = str(Path(sys.prefix) / "torch_extensions")
    from torch.utils.cpp_extension import get_default_build_root

    named = os.environ.get("TORCH_EXTENSIONS_DIR")  # else ~/.cache/torch_extensions/py311_cpu/
    root = Path(named) if named else Path(get_default_build_root())
    for lock in root.glob("*/lock" if named else "*/*/lock"):
        try:
            age = time.time() - lock.stat().st_mtime
            if age > stale_after_s:
                lock.unlink()
                warnings.warn(f"removed a stale build lock ({age / 60:.0f} min old): {lock}",
                              stacklevel=2)
        except FileNotFoundError:  # another process finished or removed it meanwhile
            pass
    return root


def _zero3(cfg, acc, policy, critic, ref, config_path: Path, decay, described: dict) -> ShardedModels:
    try:
        import deepspeed
    except ImportError:
        raise ConfigError("ppo.sharding zero3 needs DeepSpeed (pip install deepspeed)") from None
    extension_builds()
    world = acc.num_processes
    check_gradient_accumulation(cfg.gradient_accumulation_steps, world)
    if not torch.distributed.is_initialized():  # one process, started without torchrun
        for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                     ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29533")):
            os.environ.setdefault(k, v)
        deepspeed.init_distributed(auto_mpi_discovery=False)
    ds = deepspeed_config(cfg, acc, policy.config.hidden_size, config_path)
    offload = ds["zero_optimization"].get("offload_optimizer", {}).get("device", "none") != "none"
    sharded = []
    for model, lr in ((policy, cfg.learning_rate), (critic, cfg.critic_learning_rate)):
        if model is None:  # no critic (a group estimator)
            sharded.append(None)
            continue
        if offload:  # the CPU-side Adam that ZeRO-Offload steps (torch AdamW's defaults)
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            opt = DeepSpeedCPUAdam(model.parameters(), lr=lr, weight_decay=0.01, adamw_mode=True)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=lr)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, decay)  # stepped once per PPO step, here
        engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=copy.deepcopy(ds))
        sharded.append(ZeroShardedModel(engine, engine.module, opt, sched, acc, cfg.max_grad_norm))
    # the reference: partitioned like the policy, no optimiser (OpenRLHF's eval engine)
    eval_ds = {k: copy.deepcopy(v) for k, v in ds.items() if k not in ("optimizer", "scheduler")}
    eval_ds["zero_optimization"] = {
        k: v for k, v in ds["zero_optimization"].items() if k != "offload_optimizer"}
    ref_engine, *_ = deepspeed.initialize(model=ref, config=eval_ds)
    zero = ds["zero_optimization"]
    described.update({
        "engines": {"policy": "deepspeed", "ref": "deepspeed (inference)",
                    "critic": "deepspeed" if critic is not None else None},
        "zero_stage": zero["stage"],
        "offload_optimizer": zero.get("offload_optimizer", {}).get("device", "none"),
        "offload_param": zero.get("offload_param", {}).get("device", "none"),
        "communication_data_type": ds.get("communication_data_type"),
        "bf16": bool(ds.get("bf16", {}).get("enabled")),
        "fp16": bool(ds.get("fp16", {}).get("enabled")),
        "optimizer": type(sharded[0].optimizer).__name__,
        "train_micro_batch_size_per_gpu": ds["train_micro_batch_size_per_gpu"]})
    if torch.cuda.is_available():  # what the three engines hold on this GPU before step 1
        described["gpu_gib_after_setup"] = round(torch.cuda.memory_allocated() / 2**30, 3)
    return ShardedModels("zero3", sharded[0], sharded[1], ref_engine,
                   cfg.gradient_accumulation_steps, acc, described)
