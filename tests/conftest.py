"""Shared fixtures. Tests make their own tiny data and models; nothing comes from a hub."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# one torch thread in every stage a test runs (pipeline/models/policy.set_threads): the suite's tiny
# models run faster so, and a stage that shares the cores with pytest crawls with two
os.environ.setdefault("RLHF_TORCH_THREADS", "1")
# no worker processes and no member threads beside a test's stage (pipeline/workers.worker_count):
# the suite's two pytest workers already share the cores, and `make test` inherits the Makefile's
# RLHF_WORKERS=0 (make run's setting). The tests of the workers set it themselves.
os.environ.pop("RLHF_WORKERS", None)

REPO = Path(__file__).resolve().parents[1]
REALDATA = REPO.parent / "shared" / "realdata"


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def realdata() -> Path:
    if not REALDATA.is_dir():
        pytest.skip(f"real data folder {REALDATA} is absent")
    return REALDATA


@pytest.fixture
def one_torch_thread():
    """One torch thread for the test (tiny models run faster and reproducibly so on 2 cores)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def _fresh_params_record():
    """Each test starts with an empty record of what params a command read (cli/common
    `params_read`, which a report's `params` holds): commands run in-process by an earlier test
    of the same worker must not show up in this one's reports."""
    from rlhf.cli.common import forget_params_read

    forget_params_read()
    yield


@pytest.fixture(autouse=True)
def _own_accelerate_state():
    """accelerate keeps the device and mixed precision in process-wide singletons, and TRL's
    SFTConfig turns bf16 on by default: a test that builds a Trainer directly (not through
    sft.train_sft, which owns its state) would hand its bf16 to the next PPO test of the worker
    (an Accelerator(cpu=True) built later reuses it). Each test leaves the state as it found it
    (pipeline/models/compute.own_accelerate_state); in-process chains within one test still see
    each other, which is what tests/test_compute.py checks of the product."""
    import sys

    if "accelerate.state" not in sys.modules:  # nothing to save, and no import for tests
        yield                                 # that never touch torch
        state = sys.modules.get("accelerate.state")
        if state is not None:  # started empty: end empty
            for singleton in (state.PartialState, state.AcceleratorState, state.GradientState):
                singleton._shared_state.clear()
        return
    from rlhf.pipeline.models.compute import own_accelerate_state

    with own_accelerate_state():
        yield
