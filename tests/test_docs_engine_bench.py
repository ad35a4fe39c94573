"""docs/engine_bench.py, the engine-bench page's renderer: from committed bench/engine.py JSON it
renders the counts and the step figures; without a GPU run of the static step it says the GPU
figures are pending (with no GPU run at all, and with only older GPU runs); once one is
committed it names it instead."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("docs_engine_bench",
                                               REPO / "docs" / "engine_bench.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)
CPU = REPO / "bench" / "data" / "engine_sft_static.json"


def render(root: Path) -> str:
    return bench.page(root, "cmd", lambda root, path: [f"- source: `{path.name}`"], str)


def test_cpu_only_renders_the_step_table_and_gpu_pending(tmp_path):
    (tmp_path / "bench" / "data").mkdir(parents=True)
    shutil.copy(CPU, tmp_path / "bench" / "data" / CPU.name)
    text = render(tmp_path)
    assert "**GPU figures pending**: no GPU run committed" in text
    assert "| static | " in text and "host syncs / step" in text
    assert "- note: a 2-CPU machine shared" in text


def test_a_gpu_run_of_static_replaces_pending(tmp_path):
    gpu = tmp_path / "bench" / "data" / "gpu"
    gpu.mkdir(parents=True)
    old = {"batches": {"16": {"hf": {"seconds_median": 1.0, "seconds_min": 1.0,
                                      "seconds_max": 1.0}}}}
    (gpu / "engine_old.json").write_text(json.dumps(old))
    assert "older ones (`hf` against `native` only)" in render(tmp_path)
    run = json.loads(CPU.read_text())
    (gpu / "engine_gpu.json").write_text(json.dumps({**run, "gpu": "H100", "dtype": "bf16"}))
    text = render(tmp_path)
    assert "pending" not in text
    assert "GPU figures of the static step: `engine_gpu` below." in text and "H100" in text
