"""The Level-0 router (seed 001 §4.1, seed 000 §6): a linear classifier over the prompt embeddings
that decides per prompt, in about a microsecond, its complexity bucket, whether its topic is high
risk, and its token budget.

Labels: the complexity bucket is the `difficulty` table's `bucket` (seed 000 §4.2: low / mid /
high); high risk is the world's topic category (`infer_topic(text)`, its `high_risk` flag read from
the world's topics.json: medical, legal, financial). Without a world (a user's own data) there
are no high-risk labels: the router says False for every prompt and its report says why. The
token budget is `router.max_new_tokens[complexity]`. Training uses a hashed split of the pool's
prompts (`store.hashing.hashed_split`); the report gives held-out accuracies (seed 000 §6 claims
92 %), a bootstrap interval, the spread over re-drawn splits and the cost per prompt.

    rlhf route --pool artifacts/store/pool --embeddings artifacts/store/pool_embeddings \
        --difficulty artifacts/store/difficulty --topics artifacts/world/topics.json \
        --out artifacts/store/routes --model artifacts/models/router

The math is numpy only: multinomial logistic regression with L2 (Nesterov gradient descent at
the step 1 / Lipschitz bound, so it needs no learning rate) or a nearest-centroid rule; either
ends as one linear score matrix, so `predict` is one matrix product and an argmax per head.
`load_routes(folder)` is what PPO reads.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rlhf.pipeline import ranges
from rlhf.pipeline.difficulty import BUCKETS

METHODS = ("logistic", "centroid")
MODEL_FILE = "router.json"
SPLITS = ("train", "held_out")


@dataclass(frozen=True)
class RouterConfig:
    """params.yaml `router`: the Level-0 classifier, its split, its budget map, its report."""

    method: str = "logistic"  # logistic (multinomial, L2) | centroid (nearest class mean)
    l2: float = 0.001  # logistic: L2 penalty on the weights (not the bias), per mean example loss
    steps: int = 1000  # logistic: full-batch Nesterov gradient steps
    balanced: bool = True  # weight each class by 1 / its count (the high-risk class is rare)
    held_out_fraction: float = 0.25  # share of prompts (by prompt-id hash) kept out of training
    split_salt: str = "router"  # hashed_split key prefix: another salt, another split
    split_repeats: int = 20  # re-drawn splits (salts salt:1..n) for the accuracy spread; 0 = none
    bootstrap: int = 1000  # bootstrap resamples of the held-out prompts for the 95 % interval
    timing_repeats: int = 200  # `predict` calls timed for the cost per prompt
    seed: int = 0  # the bootstrap's generator
    # the token budget per complexity bucket (PPO's max_new_tokens for that prompt)
    max_new_tokens: dict[str, int] = field(
        default_factory=lambda: {"low": 32, "mid": 48, "high": 64})

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"router.method must be one of {', '.join(METHODS)}, "
                             f"got {self.method!r}")
        ranges.check_fields("router", self)
        if set(self.max_new_tokens) != set(BUCKETS):
            raise ValueError(f"router.max_new_tokens must have exactly the keys "
                             f"{', '.join(BUCKETS)}, got {', '.join(sorted(self.max_new_tokens))}")


@dataclass(frozen=True)
class Route:
    """What the router decided for one prompt (PPO reads these through `load_routes`)."""

    complexity: str  # low / mid / high
    high_risk: bool  # a medical / legal / financial topic (False when no labels were known)
    max_new_tokens: int  # the budget of its complexity bucket


# ---------------------------------------------------------------------------------------------
# The math (pure numpy)


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def class_weights(y: np.ndarray, k: int, balanced: bool) -> np.ndarray:
    """Per-example weights summing to 1: equal, or 1 / (classes present x its class count)."""
    if not balanced:
        return np.full(len(y), 1.0 / len(y))
    counts = np.bincount(y, minlength=k).astype(np.float64)
    w = 1.0 / counts[y]
    return w / w.sum()


def fit_logistic(x: np.ndarray, y: np.ndarray, k: int, l2: float, steps: int,
                 balanced: bool = True) -> np.ndarray:
    """(d + 1, k) weights (last row: bias) of multinomial logistic regression: weighted mean
    cross-entropy + l2 / 2 |W|^2, by Nesterov gradient descent at step 1 / L, where
    L = 0.5 * lambda_max(X^T diag(w) X) + l2 bounds the loss's curvature (so no learning rate)."""
    x = np.asarray(x, dtype=np.float64)  # (n, d)
    n, d = x.shape
    xb = np.hstack([x, np.ones((n, 1))])  # (n, d + 1)
    w = class_weights(y, k, balanced)  # (n,)
    onehot = np.eye(k)[y]  # (n, k)
    lip = 0.5 * np.linalg.eigvalsh(xb.T @ (xb * w[:, None]))[-1] + l2
    mask = np.ones((d + 1, 1))
    mask[-1] = 0.0  # no penalty on the bias
    W = np.zeros((d + 1, k))
    V, t = W.copy(), 1.0
    for _ in range(steps):
        grad = xb.T @ ((_softmax(xb @ V) - onehot) * w[:, None]) + l2 * mask * V
        W_next = V - grad / lip
        t_next = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * t * t))
        V = W_next + ((t - 1.0) / t_next) * (W_next - W)
        W, t = W_next, t_next
    return W


def fit_centroid(x: np.ndarray, y: np.ndarray, k: int) -> np.ndarray:
    """(d + 1, k) scores of the nearest-centroid rule on unit rows: column c is the unit mean of
    class c (cosine similarity; bias 0); a class with no example never wins (bias -inf)."""
    x = np.asarray(x, dtype=np.float64)
    W = np.zeros((x.shape[1] + 1, k))
    for c in range(k):
        rows = x[y == c]
        if len(rows) == 0:
            W[-1, c] = -np.inf
            continue
        m = rows.mean(axis=0)
        W[:-1, c] = m / max(np.linalg.norm(m), 1e-12)
    return W


def scores(x: np.ndarray, W: np.ndarray) -> np.ndarray:
    """(n, k) linear scores of (n, d) rows."""
    return x @ W[:-1] + W[-1]


def fit_head(x: np.ndarray, y: np.ndarray, k: int, cfg: RouterConfig) -> np.ndarray:
    if cfg.method == "centroid":
        return fit_centroid(x, y, k)
    W = fit_logistic(x, y, k, cfg.l2, cfg.steps, cfg.balanced)
    W[-1, np.bincount(y, minlength=k) == 0] = -np.inf  # never predict a class it never saw
    return W


def binary_figures(pred: np.ndarray, truth: np.ndarray) -> dict[str, Any]:
    """Accuracy, precision and recall of the positive class (None where undefined)."""
    pred, truth = np.asarray(pred, bool), np.asarray(truth, bool)
    tp = int((pred & truth).sum())
    return {"accuracy": float((pred == truth).mean()) if len(pred) else None,
            "precision": tp / int(pred.sum()) if pred.sum() else None,
            "recall": tp / int(truth.sum()) if truth.sum() else None,
            "n_positive": int(truth.sum()), "n_predicted_positive": int(pred.sum())}


def bootstrap_interval(correct: np.ndarray, n_resamples: int, seed: int) -> list[float] | None:
    """95 % percentile interval of the mean of a 0/1 vector over resamples of its entries."""
    correct = np.asarray(correct, dtype=np.float64)
    if n_resamples == 0 or len(correct) == 0:
        return None
    rng = np.random.default_rng(seed)
    means = correct[rng.integers(0, len(correct), (n_resamples, len(correct)))].mean(axis=1)
    return [float(q) for q in np.quantile(means, [0.025, 0.975])]


# ---------------------------------------------------------------------------------------------
# The router


@dataclass
class Router:
    """Two linear heads over unit embeddings: complexity (BUCKETS) and high risk ([False, True],
    None without labels), plus the budget map. Fit, predict, save, load."""

    complexity_w: np.ndarray  # (d + 1, len(BUCKETS)) scores; last row the bias
    risk_w: np.ndarray | None  # (d + 1, 2) scores of [not high risk, high risk]; None: no labels
    max_new_tokens: dict[str, int]
    method: str = "logistic"
    model_id: str = ""  # the encoder of the embeddings it was trained on

    @classmethod
    def fit(cls, cfg: RouterConfig, x: np.ndarray, complexity: list[str],
            high_risk: list[bool] | None = None, model_id: str = "") -> Router:
        """Train on (n, d) unit embeddings with their buckets (and high-risk flags, if known)."""
        x = np.asarray(x, dtype=np.float64)
        y = np.array([BUCKETS.index(c) for c in complexity], dtype=np.int64)
        if len(y) != len(x) or len(y) == 0:
            raise ValueError(f"{len(x)} embeddings but {len(y)} complexity labels")
        risk_w = None
        if high_risk is not None:
            r = np.asarray(high_risk, dtype=np.int64)
            if len(r) != len(x):
                raise ValueError(f"{len(x)} embeddings but {len(r)} high-risk labels")
            risk_w = fit_head(x, r, 2, cfg)
        return cls(fit_head(x, y, len(BUCKETS), cfg), risk_w, dict(cfg.max_new_tokens),
                   cfg.method, model_id)

    def predict(self, embeddings: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(complexity (n,) str, high_risk (n,) bool, max_new_tokens (n,) int) of (n, d) rows."""
        x = np.asarray(embeddings, dtype=np.float64)
        level = scores(x, self.complexity_w).argmax(axis=1)
        complexity = np.asarray(BUCKETS)[level]
        if self.risk_w is None:
            risk = np.zeros(len(x), dtype=bool)
        else:
            risk = scores(x, self.risk_w).argmax(axis=1) == 1
        budget = np.array([self.max_new_tokens[b] for b in BUCKETS], dtype=np.int64)[level]
        return complexity, risk, budget

    def save(self, folder: str | Path) -> Path:
        """`folder/router.json` (float64 weights round-trip exactly through JSON), atomically."""
        from rlhf.store.io import write_text_atomic

        def mat(w):
            return None if w is None else [[None if not np.isfinite(v) else float(v) for v in row]
                                           for row in w.tolist()]

        data = {"method": self.method, "model_id": self.model_id, "buckets": list(BUCKETS),
                "max_new_tokens": self.max_new_tokens, "complexity_w": mat(self.complexity_w),
                "risk_w": mat(self.risk_w)}
        return write_text_atomic(Path(folder) / MODEL_FILE, json.dumps(data) + "\n")

    @classmethod
    def load(cls, folder: str | Path) -> Router:
        data = json.loads((Path(folder) / MODEL_FILE).read_text(encoding="utf-8"))
        if tuple(data["buckets"]) != BUCKETS:
            raise ValueError(f"{folder}: router buckets {data['buckets']} are not {BUCKETS}")

        def mat(w):
            return None if w is None else np.array(
                [[-np.inf if v is None else v for v in row] for row in w], dtype=np.float64)

        return cls(mat(data["complexity_w"]), mat(data["risk_w"]), dict(data["max_new_tokens"]),
                   data["method"], data["model_id"])


def load_routes(table_folder: str | Path) -> dict[str, Route]:
    """{prompt_id: Route} of a `routes` table folder (what the PPO trainer reads)."""
    from rlhf.store.io import read_table

    t = read_table("routes", table_folder).select(
        ["prompt_id", "complexity", "high_risk", "max_new_tokens"]).to_pylist()
    return {r["prompt_id"]: Route(r["complexity"], bool(r["high_risk"]), int(r["max_new_tokens"]))
            for r in t}


# ---------------------------------------------------------------------------------------------
# The stage


def router_split(prompt_id: str, cfg: RouterConfig, salt: str | None = None) -> str:
    from rlhf.store.hashing import hashed_split

    return hashed_split(f"{salt or cfg.split_salt}:{prompt_id}",
                        [("held_out", cfg.held_out_fraction), ("train", 1.0 - cfg.held_out_fraction)])


def topic_labels(texts: list[str], topics_path: str | Path) -> tuple[list[str | None], list[bool]]:
    """(topic name or None, high risk) per text: the world judge's `infer_topic`, with the
    high-risk flag of that topic read from the world's topics.json (`topics[].high_risk`)."""
    from rlhf.pipeline.world.judge import infer_topic

    flags = {t["name"]: bool(t["high_risk"])
             for t in json.loads(Path(topics_path).read_text(encoding="utf-8"))}
    names, risk = [], []
    for text in texts:
        topic = infer_topic(text)
        if topic is not None and topic.name not in flags:
            raise ValueError(f"{topics_path} has no topic {topic.name!r} (another world?)")
        names.append(topic.name if topic else None)
        risk.append(flags[topic.name] if topic else False)
    return names, risk


def _evaluate(cfg: RouterConfig, x: np.ndarray, buckets: list[str], risk: list[bool] | None,
              held: np.ndarray) -> dict[str, Any] | None:
    """Fit on ~held, the figures on held (None: a split with an empty side)."""
    tr = ~held
    if held.all() or not held.any():
        return None
    router = Router.fit(cfg, x[tr], [buckets[i] for i in np.flatnonzero(tr)],
                        None if risk is None else [risk[i] for i in np.flatnonzero(tr)])
    comp, hr, _ = router.predict(x)
    truth = np.asarray(buckets)
    out = {"complexity_held_out": float((comp[held] == truth[held]).mean()),
           "complexity_train": float((comp[tr] == truth[tr]).mean()),
           "complexity_correct": comp[held] == truth[held]}
    if risk is not None:
        r = np.asarray(risk, bool)
        out["high_risk_held_out"] = binary_figures(hr[held], r[held])
        out["high_risk_train"] = binary_figures(hr[tr], r[tr])["accuracy"]
        out["high_risk_correct"] = hr[held] == r[held]
    return out


@dataclass(frozen=True)
class RouteInputs:
    """The prompts that have a pool row, an embedding and a difficulty row, aligned, with their
    labels and their train / held-out split."""

    ids: list[str]
    x: np.ndarray  # (n, d) float64 unit embeddings
    buckets: list[str]  # complexity labels (difficulty bucket)
    scores: list[float]  # difficulty scores
    pool_splits: list[str]  # the pool's own split (reward / ppo / eval)
    topics: list[str | None] | None  # None: no --topics
    risk: list[bool] | None  # high-risk labels; None: no --topics
    split: list[str]  # router split per prompt (train / held_out)
    held: np.ndarray  # (n,) bool, split == held_out
    model_id: str  # the encoder of the embeddings


def load_inputs(cfg: RouterConfig, pool_dir: str | Path, embeddings_dir: str | Path,
                difficulty_dir: str | Path, topics_path: str | Path | None) -> RouteInputs:
    """Read and align the stage's tables; a clear error when too few prompts remain or the
    hashed split leaves a side empty."""
    from rlhf.pipeline.dedup import load_pool_embeddings
    from rlhf.store.io import read_table

    pool = {r["prompt_id"]: r for r in read_table("pool", pool_dir).select(
        ["prompt_id", "text", "split"]).to_pylist()}
    diff = {r["prompt_id"]: r for r in read_table("difficulty", difficulty_dir).select(
        ["prompt_id", "score", "bucket"]).to_pylist()}
    ids, emb = load_pool_embeddings(embeddings_dir)
    model_id = read_table("pool_embeddings", embeddings_dir).column("model_id")[0].as_py()
    keep = [i for i, p in enumerate(ids) if p in pool and p in diff]
    if len(keep) < 2:
        raise ValueError(f"{len(keep)} prompts have a pool row, an embedding and a difficulty "
                         "row: nothing to train on")
    ids = [ids[i] for i in keep]
    texts = [pool[p]["text"] for p in ids]
    topics, risk = topic_labels(texts, topics_path) if topics_path else (None, None)
    split = [router_split(p, cfg) for p in ids]
    held = np.array([s == "held_out" for s in split])
    if held.all() or not held.any():
        raise ValueError(f"the hashed split put all {len(ids)} prompts on one side "
                         "(router.held_out_fraction)")
    return RouteInputs(ids=ids, x=emb[keep].astype(np.float64),
                       buckets=[diff[p]["bucket"] for p in ids],
                       scores=[float(diff[p]["score"]) for p in ids],
                       pool_splits=[pool[p]["split"] for p in ids], topics=topics, risk=risk,
                       split=split, held=held, model_id=model_id)


def evaluate_splits(cfg: RouterConfig, data: RouteInputs
                    ) -> tuple[dict[str, dict[str, Any] | None], list[dict[str, Any]]]:
    """(figures per method on the stage's split, figures of `cfg.method` on each re-drawn split
    that has two non-empty sides): the choice of method and the split's luck, measured."""
    evals = {m: _evaluate(RouterConfig(**{**asdict(cfg), "method": m}), data.x, data.buckets,
                          data.risk, data.held)
             for m in METHODS}
    repeats = [_evaluate(cfg, data.x, data.buckets, data.risk, np.array(
        [router_split(p, cfg, f"{cfg.split_salt}:{r}") == "held_out" for p in data.ids]))
        for r in range(1, cfg.split_repeats + 1)]
    return evals, [e for e in repeats if e is not None]


def time_predict(router: Router, x: np.ndarray, repeats: int) -> tuple[float, float]:
    """(microseconds per prompt of a whole-batch `predict`, microseconds of a one-prompt call),
    means over `repeats` calls."""
    calls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        router.predict(x)
        calls.append(time.perf_counter() - t0)
    single = []
    for i in range(min(repeats, len(x))):
        t0 = time.perf_counter()
        router.predict(x[i:i + 1])
        single.append(time.perf_counter() - t0)
    return 1e6 * float(np.mean(calls)) / len(x), 1e6 * float(np.mean(single))


def route_rows(data: RouteInputs, comp: np.ndarray, hr: np.ndarray,
               budget: np.ndarray) -> list[dict[str, Any]]:
    """The `routes` table: the decision per prompt beside its labels."""
    return [{"prompt_id": p, "pool_split": ps, "split": s, "complexity": str(c),
             "high_risk": bool(h), "max_new_tokens": int(b), "label_complexity": bk,
             "label_score": sc,
             "label_topic": None if data.topics is None else data.topics[i],
             "label_high_risk": None if data.risk is None else data.risk[i]}
            for i, (p, ps, s, c, h, b, bk, sc) in enumerate(zip(
                data.ids, data.pool_splits, data.split, comp, hr, budget, data.buckets,
                data.scores))]


def _spread(values) -> dict[str, Any] | None:
    v = np.asarray([a for a in values if a is not None], dtype=np.float64)
    return None if v.size == 0 else {"mean": float(v.mean()), "std": float(v.std()),
                                      "min": float(v.min()), "max": float(v.max()),
                                      "n_splits": int(v.size)}


def complexity_report(cfg: RouterConfig, data: RouteInputs, main: dict[str, Any],
                      repeats: list[dict[str, Any]], comp: np.ndarray) -> dict[str, Any]:
    """Held-out complexity accuracy with its interval, spread and the majority-bucket baseline."""
    truth, held = np.asarray(data.buckets), data.held
    majority = max(BUCKETS, key=lambda b: (truth[~held] == b).sum())
    return {
        "held_out_accuracy": main["complexity_held_out"],
        "held_out_accuracy_ci95": bootstrap_interval(main["complexity_correct"],
                                                     cfg.bootstrap, cfg.seed),
        "train_accuracy": main["complexity_train"],
        "majority_bucket": majority,
        "majority_held_out_accuracy": float((truth[held] == majority).mean()),
        "held_out_accuracy_over_splits": _spread(e["complexity_held_out"] for e in repeats),
        "label_counts": {b: int((truth == b).sum()) for b in BUCKETS},
        "confusion_held_out": {b: {c: int(((truth == b) & (comp == c) & held).sum())
                                   for c in BUCKETS} for b in BUCKETS},
    }


def high_risk_report(cfg: RouterConfig, data: RouteInputs, main: dict[str, Any],
                     repeats: list[dict[str, Any]], hr: np.ndarray) -> dict[str, Any]:
    """Held-out high-risk figures, or why there are none (no topic labels)."""
    if data.risk is None:
        return {
            "labels": "absent",
            "why": "no --topics (no world: a user's own data has no topic categories), so the "
                   "router has no high-risk head and says high_risk = False for every prompt; "
                   "Level 2's other triggers (low score, low confidence) still apply"}
    r = np.asarray(data.risk, bool)
    return {
        "labels": "world topics (infer_topic, topics.json high_risk)",
        "held_out_accuracy": main["high_risk_held_out"]["accuracy"],
        "held_out_accuracy_ci95": bootstrap_interval(main["high_risk_correct"],
                                                     cfg.bootstrap, cfg.seed),
        "held_out": main["high_risk_held_out"],
        "train_accuracy": main["high_risk_train"],
        "held_out_accuracy_over_splits": _spread(e["high_risk_held_out"]["accuracy"]
                                                 for e in repeats),
        "held_out_recall_over_splits": _spread(e["high_risk_held_out"]["recall"]
                                               for e in repeats),
        "label_share": float(r.mean()),
        "predicted_share": float(hr.mean()),
        "no_topic_prompts": sum(t is None for t in data.topics),
    }


def run(cfg: RouterConfig, pool_dir: str | Path, embeddings_dir: str | Path,
        difficulty_dir: str | Path, out_dir: str | Path, model_dir: str | Path,
        topics_path: str | Path | None = None) -> dict[str, Any]:
    """The `route` stage: fit on the train split, report on the held-out one, route every pool
    prompt, write the `routes` table and the router."""
    from rlhf.store.io import staged_folders, write_shard

    data = load_inputs(cfg, pool_dir, embeddings_dir, difficulty_dir, topics_path)
    evals, repeats = evaluate_splits(cfg, data)
    train = ~data.held
    router = Router.fit(cfg, data.x[train], [b for b, h in zip(data.buckets, data.held) if not h],
                        None if data.risk is None
                        else [r for r, h in zip(data.risk, data.held) if not h],
                        data.model_id)
    comp, hr, budget = router.predict(data.x)
    us_per_prompt, us_single = time_predict(router, data.x, cfg.timing_repeats)

    out_dir, model_dir = Path(out_dir), Path(model_dir)
    with staged_folders([out_dir, model_dir]) as staged:
        write_shard("routes", route_rows(data, comp, hr, budget),
                    staged[out_dir] / "part-00000.parquet")
        router.save(staged[model_dir])

    main = evals[cfg.method]
    return {
        "method": cfg.method,
        "model_id": data.model_id,
        "n_prompts": len(data.ids),
        "n_train": int(train.sum()),
        "n_held_out": int(data.held.sum()),
        "us_per_prompt": us_per_prompt,
        "us_per_single_prompt_call": us_single,
        "complexity": complexity_report(cfg, data, main, repeats, comp),
        "methods_held_out": {m: {"complexity_accuracy": e["complexity_held_out"],
                                 **({"high_risk": e["high_risk_held_out"]}
                                    if data.risk is not None else {})}
                             for m, e in evals.items()},
        "route_counts": {b: int((comp == b).sum()) for b in BUCKETS},
        "max_new_tokens": dict(cfg.max_new_tokens),
        "mean_max_new_tokens": float(budget.mean()),
        "high_risk": high_risk_report(cfg, data, main, repeats, hr),
    }
