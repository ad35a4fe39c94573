"""Progress bars (pipeline/progress.py): counts and an estimate on a terminal, periodic plain lines
when stderr is a pipe (dvc repro into a log), nothing in library use; the libraries' own noise
that a user cannot act on is filtered."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import time
from rlhf.pipeline import progress
progress.enable({enabled})
progress.MIN_SECONDS = {min_seconds}
with progress.bar("outer work", total=20, unit="items") as advance:
    for _ in progress.track(range(3), "inner steps", unit="steps"):
        time.sleep(0.01)
    for _ in range(20):
        advance(1)
print("done")
"""


def _run(enabled: bool, terminal: bool, min_seconds: float = 2.0) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "NO_COLOR", "TERM")}
    if terminal:
        env.update(FORCE_COLOR="1", COLUMNS="120")  # rich treats the pipe as a terminal
    return subprocess.run([sys.executable, "-c", SCRIPT.format(enabled=enabled, min_seconds=min_seconds)], env=env,
                          capture_output=True, text=True, timeout=120, check=True)


def test_a_pipe_gets_plain_lines_with_counts_and_an_estimate():
    res = _run(enabled=True, terminal=False)
    lines = res.stderr.splitlines()
    assert res.stdout == "done\n"  # progress goes to stderr, never into a command's output
    assert "\x1b" not in res.stderr  # no cursor movement or colour in a log file
    assert lines[-1].startswith("outer work  20/20 items  100%  elapsed 0:00:0")
    assert lines[-1].endswith("eta 0:00:00")
    assert [line for line in lines if line.startswith("inner steps")] == [lines[0]]
    assert lines[0].startswith("inner steps  3/3 steps  100%")
    # a quick bar: its last line only, never one per item
    assert sum(line.startswith("outer work") for line in lines) == 1


def test_a_long_bar_prints_a_line_per_tenth():
    lines = _run(enabled=True, terminal=False, min_seconds=0.0).stderr.splitlines()
    outer = [line for line in lines if line.startswith("outer work")]
    assert len(outer) == 10 and outer[4].startswith("outer work  10/20 items   50%")
    assert all("eta " in line for line in outer)


def test_a_terminal_gets_one_live_display_for_nested_bars():
    res = _run(enabled=True, terminal=True)
    assert res.stdout == "done\n"
    assert "outer work" in res.stderr and "20/20" in res.stderr and "eta" in res.stderr
    assert "LiveError" not in res.stderr


def test_library_use_prints_nothing():
    res = _run(enabled=False, terminal=False)
    assert res.stderr == "" and res.stdout == "done\n"


def test_unactionable_library_messages_are_dropped():
    script = """
import logging, warnings
from rlhf.pipeline import progress
progress.quiet_libraries()
import deepspeed  # on a machine without a GPU it logs 'Setting accelerator to CPU'
from deepspeed.accelerator import get_accelerator
get_accelerator()
warnings.warn("`is_gradient_checkpointing` is deprecated", FutureWarning)
logging.getLogger("DeepSpeed").warning("a real DeepSpeed warning")
"""
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, check=True)
    out = res.stdout + res.stderr
    assert "Setting accelerator to CPU" not in out and "is_gradient_checkpointing" not in out
    assert "a real DeepSpeed warning" in out  # only the named messages go


WORKER_SAVES = """
from rlhf.pipeline import progress
progress.quiet_libraries()  # as the CLI does, in the stage's own process
from rlhf.pipeline.workers import worker_pool
with worker_pool(2) as pool:  # a spawned worker saving a model imports DeepSpeed (accelerate)
    pool.submit(exec, "from deepspeed.accelerator import get_accelerator; get_accelerator()").result()
print("done")
"""


def test_a_worker_drops_the_same_messages():
    """make run printed DeepSpeed's 'Setting accelerator to CPU' from the reward stage's
    workers: their logging filters are their own, so a worker sets them as the CLI does."""
    env = dict(os.environ, RLHF_WORKERS="2")
    res = subprocess.run([sys.executable, "-c", WORKER_SAVES], capture_output=True, text=True,
                         timeout=300, check=True, env=env)
    assert res.stdout.strip() == "done"
    assert "Setting accelerator to CPU" not in res.stdout + res.stderr


SAVE_AND_LOAD = """
import sys
if sys.argv[1] == "quiet":
    from rlhf.pipeline import progress
    progress.quiet_libraries()
from transformers import LlamaConfig, LlamaForCausalLM
m = LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32,
                                 num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
m.save_pretrained(sys.argv[2])
LlamaForCausalLM.from_pretrained(sys.argv[2])
"""


def test_no_library_bars_when_saving_and_loading_a_model(tmp_path):
    # as on a terminal, where the bars would show; without what quiet_libraries() sets (a CLI
    # test in this process may have set it)
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS",
                        "TRANSFORMERS_VERBOSITY", "TRANSFORMERS_NO_ADVISORY_WARNINGS")}
    env["FORCE_COLOR"] = "1"

    def output(mode: str) -> str:
        res = subprocess.run([sys.executable, "-c", SAVE_AND_LOAD, mode, str(tmp_path / mode)],
                             env=env, capture_output=True, text=True, timeout=300, check=True)
        return res.stdout + res.stderr

    loud = output("loud")
    assert "Loading weights" in loud and "Writing model shards" in loud  # the check has teeth
    quiet = output("quiet")
    assert "Loading weights" not in quiet and "Writing model shards" not in quiet
