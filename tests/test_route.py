"""The Level-0 router (pipeline/route.py): the classifier on separable and on noise embeddings,
the budget map, save / load, config errors naming the key, the routes table through DuckDB, and
`rlhf route` end to end on a tiny pool (tiny_world.write_pool) with hand-made embeddings and
difficulty rows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from rlhf.pipeline.config import ConfigError, build, complete_section
from rlhf.pipeline.route import (
    BUCKETS,
    Route,
    Router,
    RouterConfig,
    binary_figures,
    fit_logistic,
    load_routes,
)

from tests.tiny_world import write_pool


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def separable(n_per: int = 30, d: int = 16, seed: int = 0):
    """Each bucket (and high risk) is one direction plus small noise."""
    rng = np.random.default_rng(seed)
    x, comp, risk = [], [], []
    for ci, c in enumerate(BUCKETS):
        for r in (False, True):
            centre = np.zeros(d)
            centre[ci] = 3.0
            centre[3] = 3.0 if r else -3.0
            x.append(centre + 0.3 * rng.normal(size=(n_per, d)))
            comp += [c] * n_per
            risk += [r] * n_per
    return _unit(np.vstack(x)), comp, risk


@pytest.mark.parametrize("method", ["logistic", "centroid"])
def test_separable_embeddings_are_classified_exactly(method):
    cfg = RouterConfig(method=method)
    x, comp, risk = separable(seed=0)
    router = Router.fit(cfg, x, comp, risk)
    xt, ct, rt = separable(seed=1)  # fresh points of the same classes
    c, r, budget = router.predict(xt)
    assert (c == np.asarray(ct)).mean() == 1.0
    assert (r == np.asarray(rt)).mean() == 1.0
    assert budget.tolist() == [cfg.max_new_tokens[b] for b in ct]


def test_noise_is_near_chance():
    rng = np.random.default_rng(0)
    n, d = 600, 32
    x = _unit(rng.normal(size=(2 * n, d)))
    comp = [BUCKETS[i] for i in rng.integers(0, 3, 2 * n)]
    risk = (rng.random(2 * n) < 0.5).tolist()
    router = Router.fit(RouterConfig(), x[:n], comp[:n], risk[:n])
    c, r, _ = router.predict(x[n:])
    acc_c = (c == np.asarray(comp[n:])).mean()
    acc_r = (r == np.asarray(risk[n:])).mean()
    assert abs(acc_c - 1 / 3) < 0.07, acc_c
    assert abs(acc_r - 0.5) < 0.07, acc_r


def test_logistic_matches_the_closed_form_on_one_feature():
    """Two points, one feature: the L2-penalised optimum is where the gradient vanishes."""
    x = np.array([[1.0], [-1.0]])
    y = np.array([1, 0])
    W = fit_logistic(x, y, 2, l2=0.1, steps=3000, balanced=False)
    z = np.hstack([x, np.ones((2, 1))]) @ W
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    grad = np.hstack([x, np.ones((2, 1))]).T @ ((p - np.eye(2)[y]) / 2) + 0.1 * np.array(
        [[1.0], [0.0]]) * W
    assert np.abs(grad).max() < 1e-8
    assert W[0, 1] > W[0, 0]  # the positive feature points at class 1


def test_budget_map_and_no_risk_labels():
    cfg = RouterConfig(max_new_tokens={"low": 8, "mid": 16, "high": 99})
    x, comp, _ = separable()
    router = Router.fit(cfg, x, comp, None)
    c, r, budget = router.predict(x)
    assert not r.any()  # no high-risk labels: never high risk
    assert dict(zip(c.tolist(), budget.tolist())) == {"low": 8, "mid": 16, "high": 99}


def test_a_bucket_absent_from_training_is_never_predicted():
    x, comp, _ = separable()
    keep = [i for i, c in enumerate(comp) if c != "high"]
    for method in ("logistic", "centroid"):
        router = Router.fit(RouterConfig(method=method), x[keep], [comp[i] for i in keep])
        assert "high" not in set(router.predict(x)[0].tolist())


@pytest.mark.parametrize("method", ["logistic", "centroid"])
def test_save_load_round_trip_gives_identical_predictions(method, tmp_path):
    x, comp, risk = separable()
    router = Router.fit(RouterConfig(method=method), x[::2], comp[::2], risk[::2], "enc==1")
    router.save(tmp_path / "router")
    again = Router.load(tmp_path / "router")
    for a, b in zip(router.predict(x), again.predict(x)):
        assert a.tolist() == b.tolist()
    assert np.array_equal(router.complexity_w, again.complexity_w)
    assert again.model_id == "enc==1" and again.method == method
    no_risk = Router.fit(RouterConfig(), x, comp, None)
    no_risk.save(tmp_path / "r2")
    assert Router.load(tmp_path / "r2").risk_w is None


@pytest.mark.parametrize("key, value, message", [
    ("held_out_fraction", 1.0, "router.held_out_fraction = 1.0: allowed in (0, 1)"),
    ("held_out_fraction", 0.0, "router.held_out_fraction = 0.0: allowed in (0, 1)"),
    ("method", "forest", "router.method must be one of"),
    ("l2", 0.0, "router.l2 = 0.0: allowed > 0"),
    ("steps", 0, "router.steps = 0: allowed >= 1"),
    ("bootstrap", -1, "router.bootstrap = -1: allowed >= 0"),
    ("timing_repeats", 0, "router.timing_repeats = 0: allowed >= 1"),
    ("max_new_tokens", {"low": 8, "mid": 16}, "router.max_new_tokens must have exactly the keys"),
    ("max_new_tokens", {"low": 0, "mid": 16, "high": 32}, "router.max_new_tokens.low = 0: allowed >= 1"),
])
def test_config_errors_name_the_key(key, value, message):
    with pytest.raises(ConfigError) as err:
        build(RouterConfig, {key: value}, "router")
    assert message in str(err.value)


def test_binary_figures():
    f = binary_figures([True, True, False, False], [True, False, True, False])
    assert (f["accuracy"], f["precision"], f["recall"]) == (0.5, 0.5, 0.5)
    assert binary_figures([False], [False])["precision"] is None


# --------------------------------------------------------------------------- the stage


RISKY = "What is the difference between type 1 and type 2 diabetes?"  # medical


def _tiny_store(root: Path, n: int = 120) -> tuple[Path, Path, Path, Path]:
    """pool (tiny_world), embeddings that encode each prompt's bucket (i % 3) and, for every
    fifth prompt, a high-risk text; difficulty rows with those buckets; topics.json."""
    from rlhf.pipeline.world.judge import infer_topic
    from rlhf.pipeline.world.topics import TOPICS
    from rlhf.store.io import read_table, write_shard

    pool = write_pool(root / "pool", n=n)
    rows = read_table("pool", pool).to_pylist()
    risky_topic = infer_topic(RISKY)
    assert risky_topic is not None and risky_topic.high_risk
    rng = np.random.default_rng(0)
    emb, diff = [], []
    for i, r in enumerate(sorted(rows, key=lambda r: r["source_line"])):
        if i % 5 == 0:
            r["text"] = f"{RISKY} ({i})"
        v = 0.2 * rng.normal(size=12)
        v[i % 3] += 3.0
        v[3] += 3.0 if i % 5 == 0 else -3.0
        emb.append({"prompt_id": r["prompt_id"], "model_id": "test==0",
                    "embedding": (v / np.linalg.norm(v)).tolist()})
        diff.append({"prompt_id": r["prompt_id"], "text": r["text"], "split": r["split"],
                     "topic_cluster": r["topic_cluster"], "length": 1, "logprob_std": 0.1,
                     "rm_score": 0.0, "score": [1.0, 5.0, 9.0][i % 3],
                     "bucket": BUCKETS[i % 3]})
    write_shard("pool", rows, pool / "part-00000.parquet")
    write_shard("pool_embeddings", emb, root / "pool_embeddings" / "part-00000.parquet")
    write_shard("difficulty", diff, root / "difficulty" / "part-00000.parquet")
    topics = root / "topics.json"
    topics.write_text(json.dumps([{"name": t.name, "category": t.category,
                                   "high_risk": t.high_risk} for t in TOPICS]))
    return pool, root / "pool_embeddings", root / "difficulty", topics


def _params(tmp_path: Path, **over) -> Path:
    p = tmp_path / "params.yaml"
    p.write_text(yaml.safe_dump({"router": complete_section(
        "router", {"split_repeats": 3, "bootstrap": 100, "timing_repeats": 5, **over})}))
    return p


def _route(tmp_path: Path, with_topics: bool = True, **over):
    from rlhf.cli.app import app
    from typer.testing import CliRunner

    pool, emb, diff, topics = _tiny_store(tmp_path / "store")
    out = tmp_path / "store" / "routes"
    argv = ["route", "--pool", str(pool), "--embeddings", str(emb), "--difficulty", str(diff),
            "--out", str(out), "--model", str(tmp_path / "models" / "router"),
            "--metrics", str(tmp_path / "m.json"), "--report", str(tmp_path / "r.json"),
            "--params", str(_params(tmp_path, **over))]
    if with_topics:
        argv += ["--topics", str(topics)]
    res = CliRunner().invoke(app, argv, env={"COLUMNS": "200"})
    assert res.exit_code == 0, (res.output, res.exception)
    return res.output, out, json.loads((tmp_path / "r.json").read_text())


def test_route_end_to_end_table_model_and_report(tmp_path):
    import duckdb

    output, out, report = _route(tmp_path)
    assert "complexity accuracy, held out" in output
    assert report["n_prompts"] == 120 and report["n_train"] + report["n_held_out"] == 120
    assert report["complexity"]["held_out_accuracy"] == 1.0
    assert report["high_risk"]["held_out_accuracy"] == 1.0
    assert report["high_risk"]["held_out"]["recall"] == 1.0
    assert report["complexity"]["held_out_accuracy_over_splits"]["n_splits"] == 3
    # the cost per prompt is a wall-clock figure: beside the report, in neither it nor the metrics
    timings = json.loads((tmp_path / "r.timings.json").read_text())
    assert timings["us_per_prompt"] > 0 and "us_per_prompt" not in report
    assert "µs per prompt" in output
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert set(metrics) == {"n_held_out", "complexity", "high_risk"}

    con = duckdb.connect()
    glob = str(out / "*.parquet")
    n, wrong, risky, splits = con.execute(
        f"SELECT count(*), sum((complexity <> label_complexity)::INT), sum(high_risk::INT), "
        f"count(DISTINCT split) FROM read_parquet('{glob}')").fetchone()
    assert (n, wrong, risky, splits) == (120, 0, 24, 2)
    budgets = dict(con.execute(f"SELECT complexity, max(max_new_tokens) FROM read_parquet('{glob}')"
                               " GROUP BY 1").fetchall())
    assert budgets == RouterConfig().max_new_tokens
    assert con.execute(f"SELECT count(*) FROM read_parquet('{glob}') WHERE label_high_risk "
                       "AND label_topic IS NOT NULL").fetchone()[0] == 24

    routes = load_routes(out)
    assert len(routes) == 120 and all(isinstance(r, Route) for r in routes.values())
    # the saved router gives the table's decisions
    from rlhf.pipeline.dedup import load_pool_embeddings

    ids, x = load_pool_embeddings(tmp_path / "store" / "pool_embeddings")
    c, h, b = Router.load(tmp_path / "models" / "router").predict(x)
    assert [routes[p] for p in ids] == [Route(str(ci), bool(hi), int(bi))
                                        for ci, hi, bi in zip(c, h, b)]


def test_route_without_a_world_says_high_risk_false_and_why(tmp_path):
    _, out, report = _route(tmp_path, with_topics=False)
    assert report["high_risk"]["labels"] == "absent" and "no --topics" in report["high_risk"]["why"]
    assert not any(r.high_risk for r in load_routes(out).values())
    from rlhf.store.io import read_table

    assert set(read_table("routes", out).column("label_high_risk").to_pylist()) == {None}


def test_route_fails_cleanly_on_a_missing_input(tmp_path):
    from rlhf.cli.app import app
    from typer.testing import CliRunner

    res = CliRunner().invoke(app, ["route", "--pool", str(tmp_path / "nope"), "--embeddings",
                                   str(tmp_path), "--difficulty", str(tmp_path), "--out",
                                   str(tmp_path / "o"), "--model", str(tmp_path / "m"),
                                   "--params", str(_params(tmp_path))])
    assert res.exit_code == 2 and "--pool" in res.output and "is not a folder" in res.output
