"""Where and in what precision every stage that runs a model runs it: params.yaml `compute`.

One section for sft, preferences, reward (training and scoring), difficulty, the judge, ppo and
eval: the device (`auto | cpu | cuda | cuda:N`), the dtype the model's weights are loaded or
built in (`auto | float32 | bfloat16 | float16`), the attention implementation (`auto | sdpa |
flash_attention_2 | eager`) and gradient checkpointing where a model is trained. `stages` holds a
stage's own values, merged over the global ones (`stages: {reward: {device: "cuda:1"}}`).

`auto` is CUDA and bf16 where a GPU is present (flash_attention_2 where flash-attn imports), else
exactly what the stages did before this section existed: the CPU, float32 and the library's
default attention, with no extra op on the way, so a CPU run's bytes do not move. `resolve` is a
pure function of the section and the machine's facts (`Machine`); `rlhf doctor` prints what it
gives here, and why.

    python -c "from rlhf.pipeline.models.compute import ComputeConfig, resolve; \
print(resolve(ComputeConfig()).describe())"
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

# the stages that run a model: the keys `stages` may hold
STAGES = ("sft", "preferences", "reward", "difficulty", "judge", "ppo", "eval")
DTYPES = ("float32", "bfloat16", "float16")
ATTENTION = ("sdpa", "flash_attention_2", "eager")
_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")
CHOICES = {"dtype": ("auto", *DTYPES), "attn_implementation": ("auto", *ATTENTION)}


class ComputeError(ValueError):
    """A compute setting this machine cannot honour (one line, naming the key)."""


@dataclass(frozen=True)
class ComputeConfig:
    """params.yaml `compute`: device, dtype, attention and gradient checkpointing of every stage
    that runs a model."""

    device: str = "auto"  # auto (cuda when a GPU is present, else cpu) | cpu | cuda | cuda:N
    # the weights' dtype; auto: bfloat16 on a GPU that has it, else float32
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # auto: flash_attention_2 on a GPU where flash-attn imports, else the library's default
    # (sdpa where the model supports it)
    attn_implementation: Literal["auto", "sdpa", "flash_attention_2", "eager"] = "auto"
    gradient_checkpointing: bool = False  # where a model is trained: sft, reward, ppo's policy
    # a stage's own values over the ones above, e.g. {reward: {device: "cuda:1"}}
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self):
        if not _DEVICE.fullmatch(str(self.device)):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        own = {f.name for f in dataclasses.fields(self)} - {"stages"}
        for stage, values in self.stages.items():
            if stage not in STAGES:
                raise ValueError(f"stages: unknown stage {stage!r}; stages that run a model: "
                                 f"{', '.join(STAGES)}")
            if not isinstance(values, dict) or set(values) - own:
                raise ValueError(f"stages.{stage}: a mapping of {', '.join(sorted(own))}, got "
                                 f"{values!r}")
            for key, value in values.items():
                allowed = CHOICES.get(key, (True, False))
                if key != "device" and value not in allowed:
                    raise ValueError(f"stages.{stage}.{key} must be one of "
                                     f"{', '.join(map(str, allowed))}, got {value!r}")
            dataclasses.replace(self, stages={}, **values)  # the device checked as the global one

    def for_stage(self, stage: str | None) -> ComputeConfig:
        """The values `stage` runs with: its `stages` entry over the global ones."""
        if stage is not None and stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; stages that run a model: "
                             f"{', '.join(STAGES)}")
        return dataclasses.replace(self, stages={}, **self.stages.get(stage or "", {}))


@dataclass(frozen=True)
class Machine:
    """The facts `resolve` reads: whether CUDA is there, how many GPUs, bf16 on them, and
    flash-attn."""

    cuda: bool
    gpus: int = 0
    bf16: bool = False
    flash_attn: bool = False

    @classmethod
    def here(cls) -> Machine:
        import torch
        from importlib.util import find_spec

        cuda = torch.cuda.is_available()
        return cls(cuda=cuda, gpus=torch.cuda.device_count() if cuda else 0,
                   bf16=cuda and torch.cuda.is_bf16_supported(),
                   flash_attn=cuda and find_spec("flash_attn") is not None)


@dataclass(frozen=True)
class Compute:
    """What a stage runs with: `device` and `dtype` as torch spells them ("cpu", "cuda:0";
    "float32"), the attention implementation (None: the library's default, which is what the
    stages used before this section), gradient checkpointing, and why `auto` gave each."""

    device: str = "cpu"
    dtype: str = "float32"
    attn_implementation: str | None = None
    gradient_checkpointing: bool = False
    why: tuple[str, ...] = ()

    @property
    def on_cpu(self) -> bool:
        return self.device == "cpu"

    @property
    def torch_dtype(self):
        import torch

        return getattr(torch, self.dtype)

    @property
    def torch_device(self):
        import torch

        return torch.device(self.device)

    def load_kwargs(self) -> dict[str, Any]:
        """from_pretrained / from_config keywords: the dtype, and the attention when one is
        asked for (none: the library picks, as before)."""
        kw: dict[str, Any] = {"dtype": self.torch_dtype}
        if self.attn_implementation is not None:
            kw["attn_implementation"] = self.attn_implementation
        return kw

    def place(self, model):
        """`model` on this device. On the CPU nothing is called: a CPU run does what it did."""
        return model if self.on_cpu else model.to(self.torch_device)

    def describe(self) -> str:
        attn = self.attn_implementation or "library default (sdpa where the model has it)"
        ckpt = ", gradient checkpointing" if self.gradient_checkpointing else ""
        return f"{self.device}, {self.dtype}, attention {attn}{ckpt}"


def resolve(cfg: ComputeConfig | None = None, stage: str | None = None,
            machine: Machine | None = None) -> Compute:
    """The concrete device, dtype and attention of `cfg` (its `stage` entry merged) on `machine`
    (default: this one). A device this machine lacks is a ComputeError, one line."""
    cfg = (cfg or ComputeConfig()).for_stage(stage)
    m = machine or Machine.here()
    where = f"compute (stage {stage})" if stage else "compute"
    why: list[str] = []
    if cfg.device == "auto":
        device = "cuda:0" if m.cuda else "cpu"
        why.append("device auto: " + ("a GPU is present" if m.cuda else
                                      "no GPU (torch sees no CUDA)"))
    elif cfg.device == "cpu":
        device = "cpu"
    else:
        if not m.cuda:
            raise ComputeError(f"{where}: device {cfg.device}: torch sees no CUDA GPU here "
                               "(use cpu or auto)")
        index = int(cfg.device.partition(":")[2] or 0)
        if index >= m.gpus:
            raise ComputeError(f"{where}: device {cfg.device}: this machine has {m.gpus} GPU(s)")
        device = f"cuda:{index}"
    gpu = device != "cpu"
    if cfg.dtype == "auto":
        dtype = "bfloat16" if gpu and m.bf16 else "float32"
        why.append("dtype auto: " + ("bf16 on the GPU" if dtype == "bfloat16" else
                                     "the GPU has no bf16" if gpu else "float32 on the CPU"))
    else:
        dtype = cfg.dtype
    if dtype == "float16" and not gpu:
        raise ComputeError(f"{where}: dtype float16 on the CPU: use float32 or bfloat16")
    attn: str | None = cfg.attn_implementation
    if attn == "auto":
        attn = "flash_attention_2" if gpu and m.flash_attn else None
        why.append("attention auto: " + ("flash-attn imports" if attn else
                                         "the library's default, flash-attn not installed" if gpu
                                         else "the library's default on the CPU"))
    if attn == "flash_attention_2" and not (gpu and m.flash_attn):
        raise ComputeError(f"{where}: attn_implementation flash_attention_2 needs a GPU and "
                           "flash-attn (pip install flash-attn)")
    return Compute(device, dtype, attn, cfg.gradient_checkpointing, tuple(why))


def saved_dtype(folder: str | Path) -> str | None:
    """The dtype a `save_pretrained` folder's weights were saved in (its config.json's `dtype`,
    `torch_dtype` before transformers 5), None when it does not say."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = config.get("dtype") or config.get("torch_dtype")
    return value if isinstance(value, str) else None


def note_cast(folder: str | Path, compute: Compute, what: str = "model") -> None:
    """One line on stderr when `folder` was saved in another dtype than `compute` loads it in."""
    saved = saved_dtype(folder)
    if saved is not None and saved != compute.dtype:
        print(f"{what} {folder}: saved in {saved}, cast to {compute.dtype} (compute.dtype)",
              file=sys.stderr, flush=True)


def load_pretrained(cls, folder: str | Path, compute: Compute | None, what: str = "model",
                    **kwargs):
    """`cls.from_pretrained(folder)` in `compute`'s dtype and attention, on its device; with
    `compute` None, float32 on the CPU as the stages loaded before (`kwargs` go through)."""
    import torch

    if compute is None:
        return cls.from_pretrained(str(folder), dtype=torch.float32, **kwargs)
    note_cast(folder, compute, what)
    return compute.place(cls.from_pretrained(str(folder), **compute.load_kwargs(), **kwargs))


def model_kwargs(compute: Compute | None) -> dict[str, Any]:
    """from_pretrained / from_config keywords of a model a stage builds: `compute`'s dtype and
    attention; float32 (what the stages built before) with `compute` None."""
    import torch

    return {"dtype": torch.float32} if compute is None else compute.load_kwargs()


def for_training(model, compute: Compute | None):
    """`model`, about to be trained, on `compute`'s device, with gradient checkpointing where
    `compute` asks for it (off by default: nothing is called)."""
    if compute is None:
        return model
    if compute.gradient_checkpointing:
        model.activation_checkpointing_enable()  # transformers 5 name
    return compute.place(model)


@contextlib.contextmanager
def own_accelerate_state():
    """Run a block that builds accelerate state of its own (sft's Trainer) and leave the
    process's as the block found it. accelerate keeps the device, the mixed precision and the
    gradient accumulation in process-wide singletons (PartialState, AcceleratorState,
    GradientState) that every later Accelerator of the process reuses: without this, sft's
    bf16 autocast would be the mixed precision of an `rlhf ppo` run later in the same Python
    process, whatever that stage's `compute` says. (Each DVC stage is a process of its own; a
    library user chaining stages in one process is not.)"""
    from accelerate.state import AcceleratorState, GradientState, PartialState

    singletons = (PartialState, AcceleratorState, GradientState)
    saved = [dict(s._shared_state) for s in singletons]
    try:
        yield
    finally:
        for singleton, state in zip(singletons, saved):
            singleton._shared_state.clear()  # in place: every instance's __dict__ is this dict
            singleton._shared_state.update(state)
