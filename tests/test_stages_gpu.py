"""bench/gpu_device.sh's step F (`GPU_DEVICE_STEPS=stages`) is wired, checked without running a
model: the script parses, takes the step and refuses an unknown one; bench/stages_gpu.py runs
every stage of profiles/realdata/dvc.yaml as written there, ppo twice (the LoRA run's outputs
apart from the plain run's, which eval reads); and the JSON it writes (built here with its own
functions, with made-up figures) is what docs/stages_bench.py renders into docs/gpus.md, which
says the figures are pending while no stages_*.json is committed in bench/data/gpu/.

    python -m pytest -q tests/test_stages_gpu.py
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "gpu_device.sh"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


driver = _load("bench_stages_gpu", REPO / "bench" / "stages_gpu.py")
render = _load("docs_stages_bench", REPO / "docs" / "stages_bench.py")
gen = _load("docs_generate_stages", REPO / "docs" / "generate.py")


def test_the_script_parses_and_takes_the_stages_step(tmp_path):
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    text = SCRIPT.read_text(encoding="utf-8")
    assert "GPU_DEVICE_STEPS=stages bash bench/gpu_device.sh" in text
    assert 'if [[ $STEPS == stages ]]; then' in text and "\n    stages_step\n" in text
    assert "bench/stages_gpu.py" in text and '"$OUT/stages_gpu.json"' in text
    env = {**os.environ, "GPU_DEVICE_STEPS": "nope", "GPU_DEVICE_REHEARSAL": "1",
           "PYTHON": sys.executable, "OUT": str(tmp_path / "out")}
    res = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.returncode == 2 and "all, engine or stages, got nope" in res.stdout


def test_every_stage_of_the_profile_runs_as_written_ppo_twice():
    dvc = yaml.safe_load((REPO / "profiles/realdata/dvc.yaml").read_text())["stages"]
    runs = driver.profile_runs()
    names = [r[0] for r in runs]
    assert [n for n in names if n != "ppo_lora"] == list(dvc)
    assert names.index("ppo_lora") == names.index("ppo") - 1  # eval reads the plain run
    for name, stage, args, _ in runs:
        if name != "ppo_lora":
            assert ["rlhf", *args] == dvc[name]["cmd"].split(), name
        assert name in driver.CAPS and stage in dvc
    lora = runs[names.index("ppo_lora")][2]
    assert lora[-2:] == ["-p", "params_lora.yaml"]
    outs = [next(iter(o)) if isinstance(o, dict) else o for o in dvc["ppo"]["outs"]]
    assert outs and not set(outs) & set(lora)  # the LoRA run overwrites nothing of the plain one
    models = {r[0]: r[3] for r in runs}
    assert models["sft"] == ["artifacts/models/sft"]
    assert models["ppo_lora"] == ["artifacts/ppo_lora"]


def _fake_result() -> dict:
    """A result as the driver writes it: its skeleton and rows, made-up figures."""
    result = driver.skeleton(False, "qwen2-0.5b", {"gpu": "NVIDIA H100 80GB HBM3",
                                                  "torch": "2.11.0+cu130", "cuda": "13.0",
                                                  "transformers": "5.24.0", "cpus": 16})
    result["model"] = {"architecture": "Qwen2ForCausalLM (random weights)",
                       "params": 494032768, "shape": "qwen2-0.5b", "layers": 24, "hidden": 896,
                       "vocab_size": 151936, "dtype_built": "bfloat16", "chat_template": "chatml"}
    record = {"seconds_in_process": 11.0, "peak_gpu_gib": 7.25, "peak_gpu_reserved_gib": 8.5,
              "device": "cuda:0", "dtype": "bfloat16", "attention": "library default"}
    sft = driver.row_of("sft", "sft", ["sft", "--out", "x"], 0, 12.5, 90, record,
                        "policy x: saved in float32, cast to bfloat16 (compute.dtype)\n")
    sft.update(saved_dtypes={"artifacts/models/sft": "bfloat16"}, steps=20)
    ppo = driver.row_of("ppo", "ppo", ["ppo"], 124, 100.0, 100, None, "step 1\nstep 2\n")
    ppo.update(saved_dtypes={}, steps=2)
    result["runs"] += [sft, ppo]
    result["doctor"] = ["compute: auto  cuda:0, bfloat16, attention library default"]
    return result


def test_the_json_the_step_writes_is_what_gpus_md_renders(tmp_path):
    assert {k for k, _ in render.COLUMNS} <= set(driver.ROW_KEYS)
    result = _fake_result()
    for row in result["runs"]:
        assert set(row) <= set(driver.ROW_KEYS), set(row) - set(driver.ROW_KEYS)
    cast = "policy x: saved in float32, cast to bfloat16 (compute.dtype)"
    assert result["runs"][0]["casts"] == [cast]
    timed_out = result["runs"][1]
    assert timed_out["status"] == "FAIL" and "timed out at 100s" in timed_out["note"]
    gpu = tmp_path / "bench" / "data" / "gpu"
    gpu.mkdir(parents=True)
    driver.save(gpu / "stages_h100.json", result)
    assert json.loads((gpu / "stages_h100.json").read_text())["schema"] == "stages_gpu/1"
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "gpus.md").write_text(f"# GPUs\n\n{render.BEGIN}\nold\n{render.END}\n\nafter\n")
    text = {rel: t for rel, _, t in gen.blocks(tmp_path)}["docs/gpus.md"]
    assert "| sft | ok | 12.5 | 20 | 7.25 | 8.5 | cuda:0 | bfloat16 | library default | " \
           "bfloat16 |" in text
    assert "| ppo | FAIL | 100 | 2 | – | – | – | – | – | – |" in text
    assert "- ppo: timed out at 100s: step 1 | step 2" in text
    assert "NVIDIA H100 80GB HBM3" in text and "494,032,768 parameters" in text
    assert "\nold\n" not in text and text.endswith(f"{render.END}\n\nafter\n")
    assert "pending" not in text


def test_without_a_committed_run_the_figures_are_pending(tmp_path):
    assert render.block(tmp_path, lambda root, path: [], str).startswith(
        "**pending: no GPU lent yet.**")
    gpus = (REPO / "docs" / "gpus.md").read_text(encoding="utf-8")
    assert gpus.count(render.BEGIN) == 1 and gpus.count(render.END) == 1
    assert (render.BEGIN, render.END) == (gen.STAGES_BEGIN, gen.STAGES_END)
