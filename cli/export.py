"""`rlhf export`: a checkpoint as a standard `save_pretrained` folder with a model card
(pipeline/export.py).

    rlhf export artifacts/models/sft exported/sft
    rlhf export artifacts/ppo/checkpoints/step-000004 exported/ppo-step4
    rlhf export my-lora-adapters exported/merged --merge
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rlhf.cli.common import HEADLINES, fail, headline


def _figures(stage: str | None, report: Path | None) -> dict:
    """The report's headline figures (`HEADLINES[stage]`) as dotted keys; for a stage without
    headlines, its top-level numbers."""
    if report is None:
        return {}
    try:
        data = json.loads(report.read_text())
    except (OSError, ValueError) as exc:
        fail(f"--report {report}: not a JSON report ({exc})")
    if stage in HEADLINES:
        data = headline(stage, data)

    def flat(d: dict, prefix: str = "") -> dict:
        out = {}
        for k, v in d.items():
            if isinstance(v, dict):
                out.update(flat(v, f"{prefix}{k}."))
            elif isinstance(v, (int, float, str)) and not isinstance(v, bool):
                out[f"{prefix}{k}"] = v
        return out

    return flat(data)


def export(
    checkpoint: Path = typer.Argument(..., help="A model folder (artifacts/models/sft, a PPO "
                                      "run's policy/), a PPO run folder, a PPO checkpoint "
                                      "(checkpoints/step-NNNNNN) or a LoRA adapter folder."),
    folder: Path = typer.Argument(..., help="The new folder to write (must not exist)."),
    merge: bool = typer.Option(False, "--merge", help="Merge LoRA adapters into the base "
                               "weights (a plain model folder; needs peft)."),
    base: Path | None = typer.Option(None, "--base", help="A PPO checkpoint's architecture and "
                                     "tokenizer (default: the run's policy/ folder); a LoRA "
                                     "checkpoint's base (default: the one its adapters name)."),
    report: Path | None = typer.Option(None, "--report", help="The run's report or metrics JSON "
                                       "for the card's figures (default: the one dvc.lock "
                                       "records with the checkpoint's stage)."),
    lock: Path = typer.Option(Path("dvc.lock"), "--lock", help="dvc.lock whose stage wrote the "
                              "checkpoint: the card's data hashes."),
) -> None:
    """Export a checkpoint as a `save_pretrained` folder that
    `AutoModelForCausalLM.from_pretrained` loads: weights (adapters merged with --merge),
    tokenizer and chat template, and a README.md model card naming the run, its data hashes
    (dvc.lock) and its figures (the run's report)."""
    from rlhf.pipeline import export as ex

    try:
        src = ex.resolve(checkpoint, base)
        records = ex.dvc_records(lock, checkpoint)
        if report is None and records:
            found = [p for p in records["reports"] if p.is_file()]
            report = next((p for p in found if "reports" in p.parts), found[0] if found else None)
        stage = records["stage"] if records else src.run.get("stage")
        ex.export(checkpoint, folder, merge, base, records, _figures(stage, report))
    except (ex.ExportError, OSError) as exc:
        fail(str(exc))
    typer.echo(f"exported {checkpoint} ({src.kind.replace('_', ' ')}) -> {folder}")
