"""The strong RM ensemble of the `reward` stage: `n_ensemble` members, each trained on its own
bootstrap of the training prompts and its own seed, in worker processes where cores allow.

At one torch thread per process (`make run`: RLHF_TORCH_THREADS=1) a member trains on one core,
so `make run` (RLHF_WORKERS=0) trains the members in one spawned process per core
(pipeline/workers.py), each seeded inside the worker exactly as the inline path seeds it: a
member's weights are byte-identical whichever process trained it
(tests/test_reward_ensemble.py). Each worker saves its member as a kept model (reward/keep.py)
and the stage loads it from there, as it loads a member an earlier, killed run kept.

    python -c "from rlhf.pipeline.reward.ensemble import bootstrap; print(bootstrap([], 0))"
"""

from __future__ import annotations

import json
import random
import shutil
from collections import defaultdict
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from rlhf.pipeline.reward.keep import fingerprint, keep, kept_or_trained, load_kept
from rlhf.pipeline.workers import worker_pool

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor

    from rlhf.pipeline.reward.stage import RewardConfig


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


def _member_in_worker(cfg, i, init, tok, train_pairs, precision, checkpoints, inputs,
                      compute=None):
    """A spawned worker's job: train member `i` and keep it. -> its training history"""
    model, history = train_member(cfg, i, init, tok, train_pairs, precision, compute)
    keep(checkpoints, f"member_{i}", inputs, model, {})
    return history


def _train_in_workers(pool: ProcessPoolExecutor, cfg: RewardConfig, todo: list[int], init: str,
                      tok, train_pairs: list[dict], precision: str, checkpoints: Path,
                      members_fp: str, log, compute=None) -> dict[int, list]:
    """Train members `todo` in `pool`'s worker processes; each kept in `checkpoints`.
    -> {member: training history}"""
    log(f"training strong RM members {', '.join(str(i + 1) for i in todo)}/{cfg.n_ensemble} "
        f"in worker processes")
    jobs = {i: pool.submit(_member_in_worker, cfg, i, init, tok, train_pairs, precision,
                           checkpoints, fingerprint([members_fp, f"member_{i}"]), compute)
            for i in todo}
    return {i: job.result() for i, job in jobs.items()}


def train_strong(cfg: RewardConfig, init: str, tok, train_pairs: list[dict], folder: Path,
                 log, precision: str = "fp32", checkpoints: Path | None = None,
                 trackers=None, compute=None,
                 pool: ProcessPoolExecutor | None = None) -> tuple[list, list[str]]:
    """Step 2: the ensemble, each member on its own bootstrap and seed, saved under `folder`.
    With `checkpoints` (keep.checkpoints_of), each trained member is kept there too, and a member
    found there complete and trained from the same inputs is loaded, not retrained; the members
    still to train then train in worker processes: `pool`'s, else those pipeline/workers.py
    grants them (none: inline)."""
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
        with nullcontext(pool) if pool is not None else worker_pool(len(todo)) as workers:
            if workers is not None and todo:
                histories = _train_in_workers(workers, cfg, todo, init, tok, train_pairs,
                                              precision, checkpoints, members_fp, log, compute)
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
