"""The prompt-embedding rollout scheduler (seed 001 §4.3): skip the rollout of a prompt
whose semantic neighbourhood's rewards have stopped varying, with GRESO-like exploration.

One object, `PromptScheduler`, is both a `PromptGate` (it decides before generation, on the whole
global batch, identically on every process) and a `StepObserver` (its only state change: the
rewards of every finished step). `ppo.schedule_on` turns it on (`hooks_for`); the trainer refills
skipped prompts from the sampler, so every step still trains on `batch_size` rollouts a process.

What "variance" means here. PPO draws one response per prompt per step, so a prompt's reward
variance is over its *own past rollouts* across steps (the policy changing in between): the
sample variance of its last `schedule_window` valid rewards, defined once it has two. For a
candidate prompt the neighbourhood is its `schedule_neighbours` (10) nearest *historical*
prompts (those with at least one valid reward this run) by cosine similarity of their MiniLM
embeddings, the candidate itself first when it has history (similarity 1). The seed's rule:

- skip when >= `schedule_min_low` (7) of the neighbours have a variance below `schedule_low`
  (0.3); a neighbour with fewer than two rewards has no variance and never counts as low. The
  skip records the neighbours' mean reward (mean of their window means, RM units) as the
  prompt's estimate; no gradient comes from it;
- roll out when the neighbours' mean variance is above `schedule_high` (0.8), and mark the
  candidate's topic cluster "high uncertainty" (`high_uncertainty_clusters()`: what a later
  tiered-rollout feature reads; the mark is in every schedule row too);
- cold start: a prompt never rolled out (or with no valid reward yet) is rolled out, and so is
  every prompt while fewer than `schedule_neighbours` prompts have history.

Scale. The seed's 0.3 / 0.8 are variances on a 0-5 RM scale. With `schedule_scale:
standardised` (the default) every variance is divided by the run's reward variance: the variance
of all rewards currently in the windows (every prompt's last `schedule_window`, pooled). So 0.3
means "this prompt's rewards vary less than 30 % as much as the run's rewards do", the same for
any RM and any reward offset or spread. `schedule_scale: raw` keeps the literal numbers in the
RM's own units.

Exploration (seed 000 §2.2's staleness; GRESO, arXiv 2506.02177): a prompt the rule would skip is
rolled out anyway with probability min(1, `schedule_explore_base` + steps since its last rollout
/ `schedule_explore_horizon`), drawn from a uniform that is a hash of (seed, step, prompt id): the
same on every process and after a resume, with no RNG state to carry.

Scale. Up to `index_min_history` (20,000) historical prompts, each decision ranks all of them
by a brute-force product (exact). Above it, the neighbours come from the dedup stage's index
(pipeline/ann.py: an inverted file over PCA-reduced rows, the candidates re-ranked by their float
cosine), searched once per select() for every candidate and filtered to the historical prompts
inside the scan, and the per-prompt window statistics are kept up to date by observe() rather
than recomputed over the whole history each step: a step costs the batch's searches, not a scan
of a million prompts (bench/bench_scheduler.py). Where the index's recall is exact (a flat index,
pools up to 4,096 prompts) the neighbours are the brute force's (tests/test_ppo_prompt_scheduler.py).

Every decision becomes a `schedule` row (store/schemas.py) through the trainer's step writer;
a candidate the gate kept but the batch did not need (the refill's last draw overshoots) is
recorded as `unused`.

    python -c "from rlhf.pipeline.ppo.features.prompt_scheduler import explore_probability as p; print(p(10, 0.05, 50))"
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any, Literal

import numpy as np

from rlhf.pipeline.config import ConfigError
from rlhf.pipeline.ppo.features.registry import ConfigField, Feature, Table, register
from rlhf.pipeline.ppo.hooks import HookBase
from rlhf.pipeline.ranges import COUNT, POS, PROB, Range

NAME = "prompt_scheduler"


def explore_probability(steps_since: int, base: float, horizon: int) -> float:
    """The chance a rule-skipped prompt is rolled out anyway, `steps_since` steps after its last
    rollout: base at 0 steps, rising linearly to 1 at `horizon` steps (GRESO-like)."""
    return float(min(1.0, base + max(0, steps_since) / horizon))


def uniform(seed: int, step: int, prompt_id: str) -> float:
    """A uniform in [0, 1) from (seed, step, prompt id): every process draws the same one."""
    h = hashlib.sha256(f"{seed}:{step}:{prompt_id}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2.0 ** 64


class PromptScheduler(HookBase):
    """Prompt gate + step observer: skip prompts whose neighbours' rewards stopped varying.

    `prompt_ids` / `embeddings`: the pool's prompt space (rows L2-normalised; from the dedup
    stage's `pool_embeddings` table); `clusters`: {prompt_id: topic cluster} (optional)."""

    name = NAME
    # above this many historical prompts, neighbours from the index (module docstring, Scale)
    index_min_history = 20_000

    def __init__(self, cfg, prompt_ids: list[str], embeddings: np.ndarray,
                 clusters: dict[str, int] | None = None, index_min_history: int | None = None):
        x = np.asarray(embeddings, np.float32)
        if x.ndim != 2 or len(x) != len(prompt_ids):
            raise ValueError(f"embeddings must be (n prompts, dim), got {x.shape} for "
                             f"{len(prompt_ids)} prompts")
        self.cfg = cfg
        self.ids = list(prompt_ids)
        self.index = {p: i for i, p in enumerate(self.ids)}
        self.x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        self.clusters = dict(clusters or {})
        # state (checkpointed; changed only by observe(), and by the marks select() sets, which
        # are the same on every process)
        self.history: dict[str, list[float]] = {}  # last `schedule_window` valid rewards
        self.last_rollout: dict[str, int] = {}  # step of the last rollout (fallbacks included)
        self.rollouts: dict[str, int] = {}  # rollouts so far
        self.marked: dict[int, int] = {}  # topic cluster -> last step marked high-uncertainty
        self._pending: list[dict] = []  # this step's decisions, until table_rows()
        if index_min_history is not None:
            self.index_min_history = index_min_history
        self._nn = None  # the neighbour index, built when the history first outgrows the scan
        self._windows = _Windows(len(self.ids))  # per-prompt window statistics (index path)

    # ----------------------------------------------------------------- the gate
    def select(self, step: int, candidates: list[tuple[str, str]]) -> list[bool]:
        stats = self._stats()
        if stats.get("indexed"):  # every candidate's neighbours in one batched search
            stats["near"] = self._neighbours([p for p, _ in candidates], stats)
        keep = []
        for pid, _ in candidates:
            row = self.decide(step, pid, stats)
            self._pending.append(row)
            keep.append(row["decision"] == "rollout")
        return keep

    def _stats(self) -> dict[str, Any]:
        """What every decision of one select() call shares: the historical prompts, their
        variances on the threshold scale and mean rewards, the run's reward variance."""
        if self._windows.count > self.index_min_history:
            stats = self._windows.stats(self.cfg)
            stats["hist"] = _Ids(self.ids, stats["rows"])
            return stats
        w = self.cfg.schedule_window
        hist = sorted(p for p, r in self.history.items() if r and p in self.index)
        pooled = [v for p in hist for v in self.history[p][-w:]]
        reward_var = float(np.var(pooled, ddof=1)) if len(pooled) > 1 else float("nan")
        unit = reward_var if self.cfg.schedule_scale == "standardised" else 1.0
        var = np.array([np.var(self.history[p][-w:], ddof=1) if len(self.history[p][-w:]) > 1
                        else np.nan for p in hist], np.float64)
        if not (unit > 0):  # no spread at all yet: nothing can be called low or high
            var = np.full(len(hist), np.nan)
        else:
            var = var / unit
        means = np.array([np.mean(self.history[p][-w:]) for p in hist], np.float64)
        rows = np.array([self.index[p] for p in hist], np.int64)
        return {"hist": hist, "var": var, "mean": means, "rows": rows, "reward_var": reward_var}

    def decide(self, step: int, pid: str, stats: dict | None = None) -> dict:
        """The decision for one candidate (a `schedule` row without run_id)."""
        cfg = self.cfg
        stats = stats or self._stats()
        k = cfg.schedule_neighbours
        own = self.history.get(pid, [])[-cfg.schedule_window:]
        last = self.last_rollout.get(pid)
        row = {"step": step, "prompt_id": pid, "topic_cluster": self.clusters.get(pid),
               "decision": "rollout", "reason": "", "own_rollouts": len(own),
               "steps_since_rollout": None if last is None else step - last,
               "n_neighbours": 0, "n_low": 0, "neighbour_mean": None, "neighbour_var": None,
               "reward_var": (stats["reward_var"] if np.isfinite(stats["reward_var"]) else None),
               "explore_p": None, "high_uncertainty": False, "neighbour_ids": []}
        if pid not in self.index or not own:
            row["reason"] = "cold_start"
            return row
        if len(stats["hist"]) < k:
            row["reason"] = "few_history"
            return row
        hist = stats["hist"]
        if stats.get("indexed"):
            near = stats.get("near", {}).get(pid)
            order = near if near is not None else self._neighbours([pid], stats)[pid]
        else:
            sims = self.x[stats["rows"]] @ self.x[self.index[pid]]
            # itself first, then nearest first; ties by prompt id: the same order on every process
            order = sorted(range(len(hist)), key=lambda i: (hist[i] != pid, -sims[i], hist[i]))[:k]
        var, mean = stats["var"][order], stats["mean"][order]
        n_low = int(np.sum(var < cfg.schedule_low))  # NaN (under two rewards) is never low
        defined = var[np.isfinite(var)]
        nvar = float(defined.mean()) if len(defined) else None
        row.update(n_neighbours=len(order), n_low=n_low, neighbour_mean=float(mean.mean()),
                   neighbour_var=nvar, neighbour_ids=[hist[i] for i in order])
        if n_low >= cfg.schedule_min_low:
            p = explore_probability(row["steps_since_rollout"], cfg.schedule_explore_base,
                                    cfg.schedule_explore_horizon)
            row["explore_p"] = p
            if uniform(cfg.seed, step, pid) < p:
                row["reason"] = "explore"
            else:
                row.update(decision="skip", reason="low_variance")
            return row
        if nvar is not None and nvar > cfg.schedule_high:
            row.update(reason="high_uncertainty", high_uncertainty=True)
            if row["topic_cluster"] is not None:
                self.marked[int(row["topic_cluster"])] = step
            return row
        row["reason"] = "varied"
        return row

    def _neighbours(self, pids: list[str], stats: dict) -> dict[str, np.ndarray]:
        """{candidate: positions in stats["hist"] of its k nearest historical prompts}, itself
        first, then nearest first, ties by prompt id (the brute-force order), from the index."""
        from rlhf.pipeline.ann import NeighbourIndex

        if self._nn is None:
            self._nn = NeighbourIndex.build(self.x)
        k = self.cfg.schedule_neighbours
        hist, rows = stats["hist"], stats["rows"]
        pos_of_row = stats["pos_of_row"]
        asked = [p for p in dict.fromkeys(pids) if p in self.index]
        if not asked:
            return {}
        q = np.array([self.index[p] for p in asked], np.int64)
        sims, ids = self._nn.search(self.x[q], k + 1, among=rows)
        out = {}
        for p, r, s_row, id_row in zip(asked, q, sims, ids):
            got = [(i != r, -float(s), hist[pos_of_row[i]], pos_of_row[i])
                   for s, i in zip(s_row, id_row) if i >= 0]
            out[p] = np.array([g[3] for g in sorted(got)[:k]], np.int64)
        return out

    def high_uncertainty_clusters(self, since_step: int = 0) -> list[int]:
        """Topic clusters marked high-uncertainty at or after `since_step` (for Level 2)."""
        return sorted(c for c, s in self.marked.items() if s >= since_step)

    def is_uncertain(self, prompt_id: str, within: int = 50) -> bool:
        """Whether `prompt_id`'s topic cluster was marked high-uncertainty in the last `within`
        steps (Level 2's cluster trigger)."""
        c = self.clusters.get(prompt_id)
        last = max(self.marked.values(), default=0)
        return c is not None and int(c) in self.marked and self.marked[int(c)] >= last - within

    # ----------------------------------------------------------------- the observer
    def observe(self, step: int, rows: list[dict], metrics: dict) -> None:
        """Every process's rollout rows of the step: rewards into the windows; then which kept
        candidates were not rolled out (`unused`)."""
        w = self.cfg.schedule_window
        for r in rows:
            pid = r["prompt_id"]
            self.last_rollout[pid] = step
            self.rollouts[pid] = self.rollouts.get(pid, 0) + 1
            if r.get("reward") is not None:
                self.history[pid] = (self.history.get(pid, []) + [float(r["reward"])])[-w:]
                if pid in self.index:
                    self._windows.set(self.index[pid], self.history[pid])
        left = Counter(r["prompt_id"] for r in rows)
        for d in self._pending:
            if d["step"] == step and d["decision"] == "rollout":
                if left[d["prompt_id"]] > 0:
                    left[d["prompt_id"]] -= 1
                else:
                    d["decision"] = "unused"

    def table_rows(self, step: int) -> dict[str, list[dict]]:
        """The step's decisions as `schedule` rows (the trainer adds run_id and writes them)."""
        rows = [d for d in self._pending if d["step"] == step]
        self._pending = [d for d in self._pending if d["step"] > step]
        return {"schedule": rows}

    # ----------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, Any]:
        return {"history": {p: list(v) for p, v in sorted(self.history.items())},
                "last_rollout": dict(sorted(self.last_rollout.items())),
                "rollouts": dict(sorted(self.rollouts.items())),
                "marked": {str(c): s for c, s in sorted(self.marked.items())}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = {p: [float(x) for x in v] for p, v in state["history"].items()}
        self.last_rollout = {p: int(s) for p, s in state["last_rollout"].items()}
        self.rollouts = {p: int(n) for p, n in state["rollouts"].items()}
        self.marked = {int(c): int(s) for c, s in state["marked"].items()}
        self._pending = []
        self._windows = _Windows(len(self.ids))
        for pid, rewards in self.history.items():
            if rewards and pid in self.index:
                self._windows.set(self.index[pid], rewards[-self.cfg.schedule_window:])


class _Windows:
    """Every pool prompt's reward window as running statistics (the index path's `_stats`):
    sample variance and mean per prompt, and the pooled sums of every window's rewards for the
    run's reward variance, each changed only where observe() changed a window."""

    def __init__(self, n: int):
        self.var = np.full(n, np.nan)  # sample variance of the window (NaN: under two rewards)
        self.mean = np.full(n, np.nan)
        self.has = np.zeros(n, bool)
        self.sums = np.zeros(n, np.float64)
        self.squares = np.zeros(n, np.float64)
        self.lens = np.zeros(n, np.int64)
        self.count = 0  # prompts with a window
        self.total = np.zeros(3)  # pooled (count, sum, sum of squares)

    def set(self, row: int, rewards: list[float]) -> None:
        v = np.asarray(rewards, np.float64)
        self.total -= (self.lens[row], self.sums[row], self.squares[row])
        self.count += not self.has[row]
        self.has[row] = True
        self.lens[row], self.sums[row], self.squares[row] = len(v), v.sum(), (v * v).sum()
        self.total += (len(v), v.sum(), (v * v).sum())
        self.mean[row] = v.mean()
        self.var[row] = np.var(v, ddof=1) if len(v) > 1 else np.nan

    def stats(self, cfg) -> dict[str, Any]:
        n, s1, s2 = self.total
        reward_var = float((s2 - s1 * s1 / n) / (n - 1)) if n > 1 else float("nan")
        unit = reward_var if cfg.schedule_scale == "standardised" else 1.0
        rows = np.flatnonzero(self.has)
        var = self.var[rows] / unit if unit > 0 else np.full(len(rows), np.nan)
        pos_of_row = np.full(len(self.has), -1, np.int64)
        pos_of_row[rows] = np.arange(len(rows))
        return {"indexed": True, "rows": rows, "var": var, "mean": self.mean[rows],
                "reward_var": reward_var, "pos_of_row": pos_of_row}


class _Ids:
    """The historical prompts' ids by position, without building a list of a million strings."""

    def __init__(self, ids: list[str], rows: np.ndarray):
        self.ids, self.rows = ids, rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> str:
        return self.ids[self.rows[i]]


def load_prompt_space(embeddings: str, prompts: list[tuple[str, str]],
                      pool: str | None = None) -> tuple[list[str], np.ndarray, dict[str, int]]:
    """(prompt ids, unit embeddings, {prompt id: topic cluster}) of the run's prompts, from a
    `pool_embeddings` table folder (and the pool table's topic clusters when `pool` is one).
    Every prompt must have an embedding (else the dedup stage is older than the pool)."""
    from pathlib import Path

    from rlhf.pipeline.dedup import load_pool_embeddings

    ids, x = load_pool_embeddings(embeddings)
    at = {p: i for i, p in enumerate(ids)}
    missing = [p for p, _ in prompts if p not in at]
    if missing:
        raise ValueError(f"{len(missing)} of {len(prompts)} prompts have no embedding in "
                         f"{embeddings}: rerun `rlhf dedup` (or --pool-embeddings-only)")
    keep = [at[p] for p, _ in prompts]
    clusters: dict[str, int] = {}
    if pool is not None and Path(pool).is_dir():
        from rlhf.store.io import read_table

        clusters = {r["prompt_id"]: int(r["topic_cluster"]) for r in
                    read_table("pool", pool).select(["prompt_id", "topic_cluster"]).to_pylist()}
    return [p for p, _ in prompts], x[keep], clusters


# --------------------------------------------------------------------------- the registry
def _build(cfg, ctx) -> list:
    return [PromptScheduler(cfg, *ctx.get("embeddings", "ppo.schedule_on"))]


def _check(cfg) -> None:
    """The rules across the scheduler's keys (each key's own range is in FIELDS)."""
    if not cfg.schedule_min_low <= cfg.schedule_neighbours:
        raise ConfigError(f"ppo.schedule_min_low must be in [1, ppo.schedule_neighbours = "
                          f"{cfg.schedule_neighbours}], got {cfg.schedule_min_low}")
    if not cfg.schedule_high >= cfg.schedule_low:
        raise ConfigError(f"ppo.schedule_high must be >= ppo.schedule_low "
                          f"({cfg.schedule_low}), got {cfg.schedule_high}")
    if cfg.schedule_scale == "standardised" and cfg.schedule_low >= 1.0:
        raise ConfigError(f"ppo.schedule_low must be < 1 with ppo.schedule_scale "
                          f"standardised (a share of the run's reward variance), "
                          f"got {cfg.schedule_low}")


FIELDS = (
    ConfigField("schedule_on", bool, False,
                help='prompt_scheduler: the prompt-embedding rollout scheduler (seed 001 §4.3, '
                     'pipeline/ppo/features/prompt_scheduler.py; `rlhf ppo --embeddings`). For a '
                     'candidate prompt, its `schedule_neighbours` nearest historical prompts '
                     "(MiniLM cosine; itself first when it has history); a prompt's variance is "
                     'the sample variance of its last `schedule_window` rewards (>= 2 needed). If'
                     ' >= `schedule_min_low` of them are below `schedule_low` -> skip (estimate: '
                     "the neighbours' mean reward), unless exploration retries it; neighbours' "
                     'mean variance above `schedule_high` -> roll out and mark its topic cluster '
                     'high-uncertainty. A prompt never rolled out is always rolled out (cold '
                     'start).'),
    ConfigField("schedule_neighbours", int, 10, range=COUNT),
    ConfigField("schedule_min_low", int, 7, range=COUNT),
    ConfigField("schedule_low", float, 0.3, range=POS),
    ConfigField("schedule_high", float, 0.8, range=POS),
    ConfigField("schedule_scale", Literal["standardised", "raw"], "standardised",
                help='"standardised": variances over the run\'s reward variance (every prompt\'s '
                     'last `schedule_window` rewards pooled), so 0.3 / 0.8 mean the same for any '
                     'RM; "raw": the RM\'s own units (the seed\'s literal numbers were on a 0-5 RM '
                     'scale)'),
    ConfigField("schedule_window", int, 4, range=Range(2, why="a variance needs two rewards")),
    ConfigField("schedule_explore_base", float, 0.05, range=PROB,
                help='exploration (GRESO-like, seed 000 §2.2 staleness): a prompt the rule skips '
                     'is rolled out anyway with probability min(1, base + steps since its last '
                     'rollout / horizon)'),
    ConfigField("schedule_explore_horizon", int, 50, range=COUNT),
)

FEATURE = register(Feature(
    NAME, ("schedule_on",),
    help="prompt_scheduler: skip prompts whose neighbourhood's rewards stopped varying "
         "(seed 001 §4.3)",
    fields=FIELDS, check=_check,
    build=_build, inputs={"embeddings": ()},
    tables=(Table("schedule", "every rollout-scheduler decision (rlhf audit schedule)"),),
    modules=("pipeline/dedup.py",)))
