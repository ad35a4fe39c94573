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
