"""Engines and drafters by name, as params.yaml names them: `get_generator(engine, draft=...)`
(`ENGINES`), `resolve_engine(engine, device)` (`auto`: the engine measured fastest on that device
kind) and `get_drafter(name)` (`DRAFTS`), each a one-line error for a name it does not know.

    python -c "from rlhf.pipeline.decode import resolve_engine; print(resolve_engine('auto', 'cpu'))"
"""

from __future__ import annotations

from rlhf.pipeline.decode.draft_model import ModelDrafter
from rlhf.pipeline.decode.drafted import DraftedGenerator
from rlhf.pipeline.decode.drafters import DRAFTS, Drafter, LookupDrafter, ReuseDrafter
from rlhf.pipeline.decode.hf import HFGenerator
from rlhf.pipeline.decode.native import NativeGenerator
from rlhf.pipeline.decode.protocol import Generator

ENGINES = ("hf", "native", "static", "vllm")
# `auto` per device type: only engines whose speed was measured on that kind (docs/engine.md).
# CPU: native, 0.41-0.50x the seconds of hf + the old-log-prob pass at batch 16, 0.22-0.29x at
# 64 (bench/data/engine_sft*.json; docs/engine.md).
# CUDA: hf, the only GPU figures (bench/data/gpu/device_run2.log, an H200) put native 2.7x
# slower; bench/gpu_device.sh measures static, whose figures will decide. Other device types
# are unmeasured: hf, the library's own loop.
AUTO = {"cpu": "native", "cuda": "hf"}


def resolve_engine(name: str, device) -> str:
    """The engine `name` names on `device` (a torch.device or its string: "cpu", "cuda:0"):
    `auto` resolves to AUTO's engine for the device type (hf where unmeasured), any other name
    of ENGINES is itself; a one-line error for an unknown name or device."""
    import torch
    from rlhf.pipeline.config import ConfigError

    if name != "auto":
        if name not in ENGINES:
            raise ConfigError(f"unknown engine {name!r}; engines: auto, {', '.join(ENGINES)}")
        return name
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"engine 'auto': not a torch device: {device!r}") from exc
    return AUTO.get(kind, "hf")


def get_generator(name: str, draft: Drafter | None = None, draft_k: int = 4) -> Generator:
    """The engine called `name` (one of ENGINES); with a drafter (`draft`, native only), the
    native engine drafting up to `draft_k` tokens per row and forward through it (the caller
    keeps the drafter, whose state carries across calls). A one-line error otherwise."""
    from rlhf.pipeline.config import ConfigError

    if draft is not None and name != "native":
        raise ConfigError(f"drafts ({draft.name!r}) need the native engine, not {name!r}")
    if name == "hf":
        return HFGenerator()
    if name == "native":
        return NativeGenerator() if draft is None else DraftedGenerator(draft, draft_k)
    if name == "static":
        from rlhf.pipeline.decode.static import StaticGenerator

        return StaticGenerator()
    if name == "auto":
        raise ConfigError("engine 'auto' picks per device: resolve_engine('auto', device) first")
    if name == "vllm":  # reserved (docs/engine.md): nothing to install, no extra carries vLLM
        raise ConfigError("engine 'vllm' is not built yet (installing vLLM does not change "
                          "that); use 'native' or 'hf'")
    raise ConfigError(f"unknown engine {name!r}; engines: auto, {', '.join(ENGINES)}")


def get_drafter(name: str, draft_layers: int = 0) -> Drafter | None:
    """The drafter called `name` (one of DRAFTS; "none": None); `draft_layers`: the draft
    model's depth (`model`; 0 = a quarter of the policy's layers). A one-line error for an
    unknown name."""
    from rlhf.pipeline.config import ConfigError

    if name == "none":
        return None
    if name == "lookup":
        return LookupDrafter()
    if name == "reuse":
        return ReuseDrafter()
    if name == "model":
        return ModelDrafter(draft_layers)
    raise ConfigError(f"unknown draft {name!r}; drafts: {', '.join(DRAFTS)}")
