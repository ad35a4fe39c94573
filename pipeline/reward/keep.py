"""Trained RMs kept across a kill: every model the reward stage trains (each strong member, the
distilled light RM, the external side RM) is saved into a hidden sibling of the strong RM folder
once trained, and a rerun loads it instead of training it again, as long as it was trained from
the same inputs.

A kept model is a folder `<checkpoints>/<name>` holding the model's `save_pretrained` files, an
optional `extra.json` (figures of its training the report needs, e.g. the distillation's final
loss), and the mark file, written last, that holds the fingerprint of its inputs: a folder
without the mark (a kill mid-save) or with another fingerprint is trained again. The stage
removes the whole folder once both RM folders are swapped in (stage.run).

    python -c "from rlhf.pipeline.reward.keep import fingerprint; print(fingerprint({'a': 1}))"
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

MARK = ".complete"  # written into a kept model's folder once all of it is saved


def checkpoints_of(out_strong: str | Path) -> Path:
    """The hidden sibling of the strong RM folder that keeps each trained model until the stage
    completes."""
    out_strong = Path(out_strong)
    return out_strong.parent / f".{out_strong.name}.checkpoints"


def fingerprint(inputs: Any) -> str:
    """A stable digest of JSON-able inputs (sorted keys; anything else by its str)."""
    blob = json.dumps(inputs, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def folder_digest(path: str | Path) -> str:
    """sha256 over a folder's file names and bytes (a model folder the kept model depends on)."""
    path = Path(path)
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def load_kept(checkpoints: Path, name: str, inputs: str,
              compute=None) -> tuple[Any, dict] | None:
    """(model, extra) of the model kept as `checkpoints/name` when it is complete and was
    trained from `inputs` (a fingerprint), loaded in `compute`'s device and dtype
    (pipeline/models/compute.py; None: float32 on the CPU); None otherwise."""
    from rlhf.pipeline.reward.scorer import load_rm

    kept = checkpoints / name
    mark = kept / MARK
    if not (mark.is_file() and mark.read_text() == inputs):
        return None
    extra_file = kept / "extra.json"
    extra = json.loads(extra_file.read_text()) if extra_file.is_file() else {}
    return load_rm(kept, compute), extra


def keep(checkpoints: Path, name: str, inputs: str, model, extra: dict) -> None:
    """Save a trained `model` (and `extra`) as `checkpoints/name`, the mark last."""
    kept = checkpoints / name
    shutil.rmtree(kept, ignore_errors=True)
    model.save_pretrained(kept)
    if extra:
        (kept / "extra.json").write_text(json.dumps(extra, sort_keys=True))
    (kept / MARK).write_text(inputs)  # last: a folder without it is incomplete


def kept_or_trained(checkpoints: Path | None, name: str, inputs: str,
                    train: Callable[[], tuple[Any, dict]], log: Callable[[str], None],
                    what: str, compute=None) -> tuple[Any, dict, bool]:
    """(model, extra, loaded): the model kept as `checkpoints/name` when complete and trained
    from `inputs` (a fingerprint), else `train()` -> (model, extra), saved there and reloaded.

    Either way the model returned is the one loaded from disk, so a run that trained it and a
    rerun that loads it score with the same weights and kernels (a freshly trained model's
    attention can differ from a loaded one's in the last bits). Without `checkpoints` the
    trained model is returned as it is. `compute`: the device and dtype it is loaded in."""
    if checkpoints is None:
        model, extra = train()
        return model, extra, False
    found = load_kept(checkpoints, name, inputs, compute)
    if found is not None:
        log(f"{what}: trained before the last run was stopped, loaded from {checkpoints / name}")
        return found[0], found[1], True
    model, extra = train()
    keep(checkpoints, name, inputs, model, extra)
    return load_kept(checkpoints, name, inputs, compute)[0], extra, False
