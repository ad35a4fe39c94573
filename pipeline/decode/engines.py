"""Engines and drafters by name, as params.yaml names them: `get_generator(engine, draft=...)`
(`ENGINES`) and `get_drafter(name)` (`DRAFTS`), each a one-line error for a name it does not know.

    python -c "from rlhf.pipeline.decode import get_generator; print(get_generator('native').name)"
"""

from __future__ import annotations

from rlhf.pipeline.decode.draft_model import ModelDrafter
from rlhf.pipeline.decode.drafted import DraftedGenerator
from rlhf.pipeline.decode.drafters import DRAFTS, Drafter, LookupDrafter, ReuseDrafter
from rlhf.pipeline.decode.hf import HFGenerator
from rlhf.pipeline.decode.native import NativeGenerator
from rlhf.pipeline.decode.protocol import Generator

ENGINES = ("hf", "native", "static", "vllm")


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
    if name == "vllm":  # reserved (docs/engine.md): nothing to install, no extra carries vLLM
        raise ConfigError("engine 'vllm' is not built yet (installing vLLM does not change "
                          "that); use 'native' or 'hf'")
    raise ConfigError(f"unknown engine {name!r}; engines: {', '.join(ENGINES)}")


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
