"""docs/gpus.md's "realdata stages on a GPU" block, one of docs/generate.py's outputs: what
bench/stages_gpu.py wrote (bench/gpu_device.sh's step F, `GPU_DEVICE_STEPS=stages`) and was
committed as stages_*.json in bench/data/gpu/, one table of the runs per file (seconds, steps, peak
GPU memory, the resolved device and dtype, the dtype each saved model records), each stamped
with its source file, content hash and last commit. With no such file, the block says the
figures are pending.

    python docs/generate.py            # rewrites the block between its markers in docs/gpus.md
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

GPU_COMMAND = "GPU_DEVICE_STEPS=stages bash bench/gpu_device.sh"
BEGIN = "<!-- generated:stages-gpu (python docs/generate.py) -->"
END = "<!-- /generated:stages-gpu -->"
# the run fields the table shows (bench/stages_gpu.py's ROW_KEYS holds them all)
COLUMNS = (("name", "run"), ("status", "status"), ("seconds", "seconds"), ("steps", "steps"),
           ("peak_gpu_gib", "peak GPU GiB"), ("peak_gpu_reserved_gib", "reserved GiB"),
           ("device", "device"), ("dtype", "dtype"), ("attention", "attention"),
           ("saved_dtypes", "saved dtype"))


def files(root: Path) -> list[Path]:
    return sorted((root / "bench" / "data" / "gpu").glob("stages_*.json"))


def _cell(key: str, value: Any, fmt: Callable[[Any], str]) -> str:
    if value is None or value == {} or value == []:
        return "–"
    if key == "saved_dtypes":  # {folder: dtype}: the dtypes, once each
        return ", ".join(sorted({str(v) for v in value.values()}))
    if key == "steps" and isinstance(value, dict):  # RM members
        return ", ".join(str(v) for v in value.values())
    return fmt(value).replace("|", "/")


def _count(n: Any) -> str:
    return f"{n:,}" if isinstance(n, int) else str(n)


def _one(r: dict, path: Path, root: Path, stamp, fmt) -> list[str]:
    m, model, sizes = r.get("machine", {}), r.get("model", {}), r.get("sizes", {})
    lines = [f"**{path.stem}**" + (" (a CPU rehearsal)" if r.get("rehearsal") else ""), "",
             *stamp(root, path),
             f"- command: `{r.get('command')}`; {fmt(r.get('seconds_total'))} s in all",
             (f"- machine: {m.get('gpu') or 'no GPU'}, torch {m.get('torch')} (CUDA "
              f"{m.get('cuda')}), transformers {m.get('transformers')}, {m.get('cpus')} CPUs"),
             (f"- base model: {model.get('architecture')}, {_count(model.get('params'))} "
              f"parameters ({model.get('shape')}: {model.get('layers')} layers, hidden "
              f"{model.get('hidden')}, vocabulary {model.get('vocab_size')}), built in "
              f"{model.get('dtype_built')}, chat template {model.get('chat_template')}; a "
              f"prompt as the stages render it: `{json.dumps(model.get('prompt_as_rendered'))}`"),
             (f"- sizes: SFT {sizes.get('sft_steps')} steps, RM {sizes.get('rm_steps')} steps "
              f"a member, PPO {sizes.get('ppo_steps')} steps (LoRA and not), eval "
              f"{sizes.get('eval_prompts')} prompts"),
             f"- data: {r.get('data', {}).get('source')}",
             f"- {r.get('data', {}).get('encoder')}", ""]
    lines += ["| " + " | ".join(h for _, h in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in r.get("runs", []):
        lines.append("| " + " | ".join(_cell(k, row.get(k), fmt) for k, _ in COLUMNS) + " |")
    failed = [f"- {row['name']}: {row.get('note')}" for row in r.get("runs", [])
              if row.get("status") != "ok" and row.get("note")]
    doctor = [f"    {ln}" for ln in r.get("doctor", [])]
    return [*lines, "", *(["Failed or skipped:", "", *failed, ""] if failed else []),
            *(["`rlhf doctor -p params.yaml` there:", "", *doctor, ""] if doctor else [])]


def block(root: Path, stamp: Callable[[Path, Path], list[str]],
          fmt: Callable[[Any], str]) -> str:
    """The text between BEGIN and END; `stamp` and `fmt` are generate.py's."""
    found = files(root)
    if not found:
        return ("**pending: no GPU lent yet.** No stages_*.json is committed in bench/data/gpu/: "
                f"`{GPU_COMMAND}` on a device writes `stages_gpu.json` (rehearsed on the CPU "
                "with `GPU_DEVICE_REHEARSAL=1`); commit it there as stages_<card>.json "
                "and run `python docs/generate.py`.")
    lines: list[str] = []
    for path in found:
        lines += _one(json.loads(path.read_text(encoding="utf-8")), path, root, stamp, fmt)
    return "\n".join(lines).rstrip()
