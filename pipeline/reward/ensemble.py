"""The strong RM ensemble of the `reward` stage: `n_ensemble` members, each trained on its own
bootstrap of the training prompts and its own seed, in worker processes where cores allow.

At one torch thread per process (`make run`: RLHF_TORCH_THREADS=1) a member trains on one core,
so `make run` (RLHF_RM_WORKERS=0) trains the members in one spawned process per core, each
seeded inside the worker exactly as the inline path seeds it: a member's weights are
byte-identical whichever process trained it (tests/test_reward_ensemble.py). Each worker saves its member as a kept model
(reward/keep.py) and the stage loads it from there, as it loads a member an earlier, killed run
kept.

    python -c "from rlhf.pipeline.reward.ensemble import member_workers; print(member_workers(3))"
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

from rlhf.pipeline.reward.keep import checkpoints_of, fingerprint, keep, kept_or_trained, load_kept

if TYPE_CHECKING:
    from rlhf.pipeline.reward.stage import RewardConfig

member_checkpoints = checkpoints_of  # the hidden sibling of the strong RM folder


def member_workers(n_members: int) -> int:
    """Processes that train members at once: $RLHF_RM_WORKERS, unset or 1 = none beside the
    stage's own (inline), 0 = one per core this process may use, N = N; never more than
    `n_members`. `make run` sets 0: its stages run one at a time at one torch thread, so the
    second core is free. Where processes already share the cores (the test suite's two
    workers), more processes only slow each other: there it stays unset (on this 2-core machine
    under other load, 3 members at a quarter epoch took 95 s in 2 workers against 72 s inline)."""
    env = os.environ.get("RLHF_RM_WORKERS", "").strip() or "1"
    n = int(env)
    if n == 0:
        n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(n or 1, n_members))


def bootstrap(pairs: list[dict], seed: int) -> list[dict]:
    """Resample prompts with replacement (all pairs of a drawn prompt come along)."""
    by_prompt: dict[str, list[dict]] = defaultdict(list)
    for p in pairs:
        by_prompt[p["prompt_id"]].append(p)
    keys = sorted(by_prompt)
    rng = random.Random(seed)
    return [p for _ in keys for p in by_prompt[rng.choice(keys)]]


def members_fingerprint(cfg: RewardConfig, init: str, train_pairs: list[dict],
                        precision: str) -> str:
    """What the members are trained from: a checkpoint of other inputs is never loaded."""
    import hashlib

    from rlhf.pipeline.config import effective

    pairs = hashlib.sha256(json.dumps(train_pairs, sort_keys=True, default=str).encode())
    return json.dumps({"train": effective(cfg.train), "seed": cfg.seed, "init": init,
                       "bootstrap": cfg.bootstrap, "n_ensemble": cfg.n_ensemble,
                       "precision": precision, "train_pairs_sha256": pairs.hexdigest()},
                      sort_keys=True)


def save_tokenizer(tok, folder: Path) -> None:
    """`tok.save_pretrained(folder)` without the padding and truncation a fast tokenizer's
    backend carries: a tokenizer.json may ship with them (all-MiniLM-L6-v2's: fixed 128), and
    the first encode clears them, so a member trained here and one loaded from its checkpoint
    by a resumed run (whose tokenizer never encoded) would save different bytes."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:
        backend.no_padding()
        backend.no_truncation()
    tok.save_pretrained(folder)


def train_member(cfg: RewardConfig, i: int, init: str, tok, train_pairs: list[dict],
                 precision: str, compute=None):
    """Member `i`: its bootstrap (seed + 1000 + i) and its seed (seed + i). -> (model, history)"""
    from rlhf.pipeline.reward.train import init_rm, train_rm

    data = (bootstrap(train_pairs, cfg.seed + 1000 + i)
            if cfg.bootstrap and cfg.n_ensemble > 1 else train_pairs)
    return train_rm(init_rm(init, seed=cfg.seed + i, compute=compute), tok, data, cfg.train,
                    seed=cfg.seed + i,
                    precision=precision)


def _worker_init(parent: int) -> None:
    """A worker trains at one torch thread and dies with the stage: a killed stage (the rerun
    then trains the members not yet kept, reliability.md) leaves no worker training on."""
    import torch
    from rlhf.pipeline.models.policy import quiet_hf

    quiet_hf()  # as the stage's own process: no library progress bars or load reports
    torch.set_num_threads(1)
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the stage died before the line above took effect
        os._exit(1)


def _member_in_worker(cfg, i, init, tok, train_pairs, precision, checkpoints, inputs,
                      compute=None):
    """A spawned worker's job: train member `i` and keep it. -> its training history"""
    model, history = train_member(cfg, i, init, tok, train_pairs, precision, compute)
    keep(checkpoints, f"member_{i}", inputs, model, {})
    return history


def _train_in_workers(cfg: RewardConfig, todo: list[int], init: str, tok,
                      train_pairs: list[dict], precision: str, checkpoints: Path,
                      members_fp: str, log, compute=None) -> dict[int, list]:
    """Train members `todo` in `member_workers` spawned processes; each kept in `checkpoints`.
    -> {member: training history}"""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    workers = member_workers(len(todo))
    log(f"training strong RM members {', '.join(str(i + 1) for i in todo)}/{cfg.n_ensemble} "
        f"in {workers} processes")
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"),
                             initializer=_worker_init, initargs=(os.getpid(),)) as pool:
        jobs = {i: pool.submit(_member_in_worker, cfg, i, init, tok, train_pairs, precision,
                               checkpoints, fingerprint([members_fp, f"member_{i}"]), compute)
                for i in todo}
        return {i: job.result() for i, job in jobs.items()}


def train_strong(cfg: RewardConfig, init: str, tok, train_pairs: list[dict], folder: Path,
                 log, precision: str = "fp32", checkpoints: Path | None = None,
                 trackers=None, compute=None) -> tuple[list, list[str]]:
    """Step 2: the ensemble, each member on its own bootstrap and seed, saved under `folder`.
    With `checkpoints` (member_checkpoints), each trained member is kept there too, and a member
    found there complete and trained from the same inputs is loaded, not retrained; the members
    still to train then train in `member_workers` processes at once when that is more than 1."""
    members_fp = members_fingerprint(cfg, init, train_pairs, precision)
    histories: dict[int, list] = {}
    if checkpoints is not None:  # kept models of other inputs: cleared at once
        stamp = checkpoints / "inputs.json"
        if not stamp.is_file() or stamp.read_text() != members_fp:
            shutil.rmtree(checkpoints, ignore_errors=True)
            checkpoints.mkdir(parents=True)
            stamp.write_text(members_fp)
        todo = [i for i in range(cfg.n_ensemble)
                if load_kept(checkpoints, f"member_{i}",
                             fingerprint([members_fp, f"member_{i}"])) is None]
        if member_workers(len(todo)) > 1:
            histories = _train_in_workers(cfg, todo, init, tok, train_pairs, precision,
                                          checkpoints, members_fp, log, compute)
    members, names = [], []
    for i in range(cfg.n_ensemble):
        name = f"member_{i}"

        def train(i: int = i):
            log(f"training strong RM member {i + 1}/{cfg.n_ensemble}")
            model, histories[i] = train_member(cfg, i, init, tok, train_pairs, precision,
                                               compute)
            return model, {}

        inputs = fingerprint([members_fp, name])
        if i in histories:  # trained by a worker just now
            model = load_kept(checkpoints, name, inputs, compute)[0]
        else:
            model, _, _ = kept_or_trained(checkpoints, name, inputs, train, log,
                                          f"strong RM member {i + 1}/{cfg.n_ensemble}", compute)
        if trackers is not None and i in histories:
            trackers.log_history(f"reward/{name}", histories[i])
        model.save_pretrained(folder / name)
        save_tokenizer(tok, folder / name)
        members.append(model)
        names.append(name)
    return members, names
