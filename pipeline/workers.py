"""Worker processes for a stage's independent, self-seeded jobs (the reward stage's strong
members and distillation rollouts, eval's policies, difficulty's sampled batches): both cores
busy, the bytes of the inline run.

At one torch thread per process (`make run`: RLHF_TORCH_THREADS=1) a job runs on one core. Each
job seeds torch itself (a member its seed, a sampled batch its (seed, batch)), so what it returns
does not depend on which process ran it or what ran there before: a stage's outputs are
byte-identical whether its jobs ran inline or in workers (tests/test_reward_ensemble.py,
tests/test_eval.py). $RLHF_WORKERS says how many processes: `make run` sets 0 (one per core);
unset (the test suite, whose two pytest workers already share the cores) or 1 runs every job
inline, in the stage's own process. The same count sets the threads the strong RM ensemble
scores its members in (reward/scorer.py `member_threads`: no model copies, the same bytes).
Inside a job process (a worker, or a stage's own process running its share beside its workers)
`worker_count` is 1: that process has one core, the other jobs hold the rest.

    python -c "from rlhf.pipeline.workers import worker_count; print(worker_count(3))"
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor

# set while this process is one of a stage's job processes (a spawned worker, or the stage's own
# process running its share beside them): it has one core, so nothing in it starts more workers
_one_core = {"on": False}


def worker_count(n_jobs: int) -> int:
    """Processes that run `n_jobs` jobs at once: $RLHF_WORKERS, unset or 1 = none beside the
    stage's own (inline), 0 = one per core this process may use, N = N; never more than
    `n_jobs`. `make run` sets 0: its stages run one at a time at one torch thread, so the
    second core is free. Where processes already share the cores (the test suite's two
    workers), more processes only slow each other: there it stays unset (on this 2-core machine
    under other load, 3 RM members at a quarter epoch took 95 s in 2 workers against 72 s
    inline). 1 inside a job process (a worker, or a stage running a share beside its workers:
    `worker_pool(beside_stage=True)`): the other cores are busy with the other jobs."""
    if _one_core["on"]:
        return 1
    env = os.environ.get("RLHF_WORKERS", "").strip() or "1"
    try:
        n = int(env)
    except ValueError:
        raise ValueError(f"RLHF_WORKERS must be a whole number (0 = one per core), got {env!r}")
    if n == 0:
        n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(n or 1, n_jobs))


def _init(parent: int, fmt: str) -> None:
    """A worker runs at one torch thread, renders prompts in the stage's text.prompt_format (a
    spawned process starts with the library default), drops the libraries' unactionable
    messages as the CLI does (a worker that saves a model imports DeepSpeed, which announces the
    CPU) and dies with the stage: a killed stage leaves no worker running on."""
    from rlhf.pipeline.progress import quiet_libraries

    quiet_libraries()  # before the libraries: their loggers' filters are per process
    import torch
    from rlhf.pipeline.models.policy import quiet_hf
    from rlhf.pipeline.models.text import use_prompt_format

    quiet_hf()  # as the stage's own process: no library progress bars or load reports
    torch.set_num_threads(1)
    _one_core["on"] = True
    use_prompt_format(fmt)
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the stage died before the line above took effect
        os._exit(1)


@contextmanager
def worker_pool(n_jobs: int, beside_stage: bool = False) -> Iterator[ProcessPoolExecutor | None]:
    """Spawned processes for `n_jobs` jobs: `worker_count(n_jobs)` of them, one fewer with
    `beside_stage` (the stage's own process runs a share of the jobs itself: one spawn and one
    model load fewer; inside the block `worker_count` is 1 in the stage's process too); None where
    `worker_count` is 1: run them inline. Leaving the block cancels the jobs not yet started and
    waits for the rest."""
    n = worker_count(n_jobs)
    if n <= 1:
        yield None
        return
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    from rlhf.pipeline.models.text import prompt_format

    pool = ProcessPoolExecutor(n - beside_stage, mp_context=mp.get_context("spawn"),
                               initializer=_init, initargs=(os.getpid(), prompt_format()))
    was = _one_core["on"]
    _one_core["on"] = was or beside_stage
    try:
        yield pool
    finally:
        _one_core["on"] = was
        pool.shutdown(wait=True, cancel_futures=True)
