"""A checkpoint as a standard `save_pretrained` folder (`rlhf export`): the weights (LoRA
adapters merged into the base when asked), the tokenizer with its chat template, and a model card
(README.md) naming the run, the data it was trained on with their hashes, and its figures.

What it exports: a model folder (the SFT policy, a PPO run's final `policy/`), a PPO run folder
(its `policy/`; a `ppo.lora` run's `adapter/`), a PPO checkpoint `checkpoints/step-NNNNNN` (its
`policy.pt` into the architecture and tokenizer of `base`, by default the run's `policy/`; a
`ppo.lora` run's checkpoint: its `adapter/` folder), or a peft adapter folder.
The data hashes are the ones DVC recorded: the dvc.lock stage whose output holds the checkpoint,
its inputs that a stage writes or that are not code, with their md5.

    rlhf export artifacts/ppo/checkpoints/step-000004 exported/ppo-step4
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CODE_FOLDERS = ("pipeline", "cli", "store", "bench")  # a dependency under these is code


class ExportError(ValueError):
    """A checkpoint that cannot be exported, or a folder that cannot be written (one line)."""


@dataclass
class Source:
    """What a checkpoint folder holds: its `kind`, the folder the weights load from, and the
    run it came from (`run`: run id, step, ...)."""

    kind: str  # model | adapter | ppo_checkpoint
    weights: Path
    # ppo_checkpoint: the architecture and tokenizer; adapter: the base (None: the one its
    # adapter_config.json names)
    base: Path | None = None
    run: dict[str, Any] = field(default_factory=dict)


def resolve(checkpoint: str | Path, base: str | Path | None = None) -> Source:
    """What `checkpoint` is (module docstring); an ExportError says why it is none of them."""
    ckpt = Path(checkpoint)
    if not ckpt.is_dir():
        raise ExportError(f"{ckpt} is not a folder: expected a checkpoint folder")
    if (ckpt / "policy").is_dir() and (ckpt / "summary.json").is_file():  # a PPO run folder
        summary = json.loads((ckpt / "summary.json").read_text())
        # a ppo.lora run: its adapters (policy/ holds them merged already)
        src = resolve(ckpt / ("adapter" if (ckpt / "adapter").is_dir() else "policy"))
        src.run = {"stage": "ppo", "run_id": summary.get("run_id"), "step": summary.get("steps")}
        return src
    if (ckpt / "policy.pt").is_file() and (ckpt / "trainer_state.json").is_file():
        state = json.loads((ckpt / "trainer_state.json").read_text())
        run = {"stage": "ppo", "run_id": ckpt.parent.parent.name, "step": state["step"]}
        if (ckpt / "adapter" / "adapter_config.json").is_file():  # a ppo.lora run's adapters
            return Source("adapter", ckpt / "adapter", Path(base) if base else None, run)
        base = Path(base) if base else ckpt.parent.parent / "policy"
        if not (base / "config.json").is_file():
            raise ExportError(f"{ckpt} is a PPO checkpoint: its architecture and tokenizer come "
                              f"from --base (a model folder), and {base} is none")
        return Source("ppo_checkpoint", ckpt, base, run)
    if (ckpt / "adapter_config.json").is_file():
        return Source("adapter", ckpt)
    if (ckpt / "config.json").is_file() and any(ckpt.glob("*.safetensors")) \
            or any(ckpt.glob("pytorch_model*.bin")):
        return Source("model", ckpt)
    raise ExportError(f"{ckpt} is not a checkpoint: no model weights (config.json + "
                      "*.safetensors), adapter_config.json, PPO run (policy/, summary.json) or "
                      "PPO checkpoint (policy.pt, trainer_state.json)")


def load(src: Source, merge: bool):
    """(model, tokenizer) of `src`; an adapter merged into its base with `merge`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if src.kind == "ppo_checkpoint":
        model = AutoModelForCausalLM.from_pretrained(str(src.base))
        model.load_state_dict(torch.load(src.weights / "policy.pt", map_location="cpu"))
        return model, AutoTokenizer.from_pretrained(str(src.base))
    if src.kind == "adapter":
        base = src.base or adapter_base(src.weights)
        model = with_adapter(AutoModelForCausalLM.from_pretrained(str(base)), src.weights, merge)
        tok_from = src.weights if (src.weights / "tokenizer_config.json").is_file() else base
        return model, AutoTokenizer.from_pretrained(str(tok_from))
    return AutoModelForCausalLM.from_pretrained(str(src.weights)), \
        AutoTokenizer.from_pretrained(str(src.weights))


def adapter_base(adapter: Path) -> str:
    """The base model an adapter folder names (its adapter_config.json)."""
    config = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))
    return config["base_model_name_or_path"]


def with_adapter(model, adapter: Path, merge: bool):
    """`model` (the base, loaded in the dtype and on the device wanted) with the peft adapters of
    the folder `adapter`, merged into its weights with `merge`: how `rlhf export` and the eval
    stage (a `ppo.lora` run's checkpoints) load adapters."""
    try:
        from peft import PeftModel
    except ImportError:
        raise ExportError("loading LoRA adapters needs peft: pip install 'rlhf[lora]'") from None
    model = PeftModel.from_pretrained(model, str(adapter))
    return model.merge_and_unload() if merge else model


def dvc_records(lock: Path, checkpoint: Path) -> dict[str, Any] | None:
    """The dvc.lock stage whose output holds `checkpoint`: {"stage", "data": [(path, md5)],
    "reports": [report / metrics files among its outputs]}; None when no stage does."""
    import yaml

    if not lock.is_file():
        return None
    stages = (yaml.safe_load(lock.read_text()) or {}).get("stages", {})
    root = lock.resolve().parent
    ckpt = checkpoint.resolve()

    def holds(out_path: str, path: Path) -> bool:
        out = (root / out_path).resolve()
        return path == out or out in path.parents

    produced = [o["path"] for s in stages.values() for o in s.get("outs", [])]
    for name, stage in stages.items():
        if not any(holds(o["path"], ckpt) for o in stage.get("outs", [])):
            continue
        data = []
        for d in stage.get("deps", []):
            parts = [p for p in Path(d["path"]).parts if p != ".."]
            code = d["path"].endswith(".py") or (parts and parts[0] in CODE_FOLDERS)
            if "md5" in d and (any(holds(o, (root / d["path"]).resolve()) for o in produced)
                               or not code):
                data.append((d["path"], d["md5"]))
        reports = [root / o["path"] for o in stage.get("outs", []) if o["path"].endswith(".json")]
        return {"stage": name, "data": data, "reports": reports}
    return None


def model_card(name: str, checkpoint: Path, src: Source, merged: bool,
               records: dict[str, Any] | None, figures: dict[str, Any]) -> str:
    """README.md of the exported folder (Hugging Face model-card layout: YAML front matter)."""
    run = {**src.run, **({"stage": records["stage"]} if records else {})}
    lines = ["---", "library_name: transformers",
             f"tags: [rlhf{', ' + run['stage'] if run.get('stage') else ''}]", "---", "",
             f"# {name}", "",
             (f"Exported by `rlhf export` from `{checkpoint}` ({src.kind.replace('_', ' ')}"
              f"{', adapters merged' if merged else ''}). Load it with "
              f"`AutoModelForCausalLM.from_pretrained(\"{name}\")`."), "", "## Run", ""]
    lines += [f"- {k.replace('_', ' ')}: `{v}`" for k, v in run.items() if v is not None]
    if not run:
        lines.append("- no run records found beside the checkpoint")
    lines += ["", "## Data", ""]
    if records and records["data"]:
        lines += ["What the run was trained on, as DVC recorded it (dvc.lock):", "",
                  "| input | md5 |", "| --- | --- |"]
        lines += [f"| `{p}` | `{md5}` |" for p, md5 in records["data"]]
    else:
        lines.append("No dvc.lock stage writes this checkpoint: its data hashes are unknown.")
    lines += ["", "## Figures", ""]
    if figures:
        lines += [("The run's headline figures, from its report: at the run's end, not at "
                   "this checkpoint's step where they differ (held-out figures where the stage "
                   "measures them)."), "",
                  "| figure | value |", "| --- | --- |"]
        lines += [f"| {k} | {v} |" for k, v in figures.items()]
    else:
        lines.append("No report of the run was found (`rlhf export --report`).")
    return "\n".join(lines) + "\n"


def export(checkpoint: str | Path, folder: str | Path, merge: bool = False,
           base: str | Path | None = None, records: dict[str, Any] | None = None,
           figures: dict[str, Any] | None = None) -> Source:
    """Write `folder` (which must not exist) from `checkpoint`; returns what was exported."""
    from rlhf.store.io import staged_folders

    checkpoint, folder = Path(checkpoint), Path(folder)
    if folder.exists():
        raise ExportError(f"{folder} exists: export into a new folder")
    src = resolve(checkpoint, base)
    if merge and src.kind != "adapter":
        raise ExportError(f"--merge: {checkpoint} holds no LoRA adapters (no adapter_config.json)")
    model, tok = load(src, merge)
    with staged_folders([folder]) as staged:
        model.save_pretrained(staged[folder])
        tok.save_pretrained(staged[folder])  # with its chat template, when it has one
        (staged[folder] / "README.md").write_text(
            model_card(folder.name, checkpoint, src, merge, records, figures or {}),
            encoding="utf-8")
    return src
