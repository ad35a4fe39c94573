"""The judge is a choice (pipeline/models/judges.py): `eval` run three times on the same tiny policies
with the world's gold judge, a held-out gold RM trained by `rlhf judge` on a gold split, and a
sequence-classification RM the test saves, gives the same report structure, each naming its
judge; the ppo stage's held-out figure takes the same judge object."""

from __future__ import annotations

import csv
import json

import ppo_tiny
import pytest
from params_file import write_params
from test_eval import _invoke, _world


def _params(tmp_path, name, judge=None):
    ev = {"seed": 0, "max_new_tokens": 6, "max_prompt_tokens": 16, "n_prompts": 8,
          "batch_size": 4}
    return write_params(tmp_path / f"{name}.yaml", ppo=dict(ppo_tiny.PARAMS), eval=ev,
                        judge=judge or {})


def _gold_preferences(folder):
    """A preferences table whose `gold` split says: responses naming a good word win."""
    from rlhf.store.hashing import content_hash
    from rlhf.store.io import write_shard

    rows = []
    for i, p in enumerate(ppo_tiny.PROMPTS * 2):
        pid = content_hash(p)
        for rank, resp in enumerate(("the cat is good and happy", "the cat is bad and sad")):
            rows.append({"ranking_id": f"r{i:03d}", "prompt_id": pid, "prompt": p,
                         "response_hash": content_hash(resp), "response": resp,
                         "annotator_id": "alice", "labeled_at": None, "score": None,
                         "rank": rank, "source": "queue", "response_source": "human",
                         "split": "gold" if i % 4 else "heldout", "gold_score": None})
    write_shard("preferences", rows, folder / "part-00000.parquet")
    return folder


@pytest.mark.slow
def test_swapping_the_judge_keeps_the_report_and_names_the_judge(tmp_path):
    paths, ppo = _world(tmp_path)
    base = ["eval", "--sft", paths["policy"], "--ppo", ppo, "--light-rm", paths["reward"],
            "--strong-rm", paths["reward"], "--prompts", paths["prompts"]]
    # the held-out gold RM: `rlhf judge` on the gold split (backbone: the tiny policy, offline)
    judge_cfg = {"kind": "heldout_rm", "backbone": str(paths["policy"]), "max_length": 64,
                 "train": {"epochs": 2.0, "learning_rate": 0.002, "batch_size": 8,
                           "max_length": 64}}
    p_held = _params(tmp_path, "held", judge_cfg)
    prefs = _gold_preferences(tmp_path / "prefs")
    res = _invoke_raw(["judge", "--preferences", prefs, "--out", tmp_path / "judge",
                       "--params", p_held, "--metrics", tmp_path / "judge.json"])
    assert res.exit_code == 0, res.output
    jm = json.loads((tmp_path / "judge.json").read_text())
    assert jm["n_gold_pairs"] == 18 and jm["heldout_pair_accuracy"] == 1.0
    cases = {
        "world_gold": (_params(tmp_path, "world"), []),
        f"heldout_gold_rm:{tmp_path / 'judge'}": (p_held, ["--judge-model", tmp_path / "judge"]),
        f"rm:{paths['reward']}": (_params(tmp_path, "rm", {"kind": "rm",
                                                           "model": str(paths["reward"])}), []),
    }
    shapes, golds = [], []
    for name, (params, extra) in cases.items():
        out = tmp_path / f"eval-{len(shapes)}"
        metrics = tmp_path / f"eval-{len(shapes)}.json"  # the report: every figure (--metrics: headline)
        res = _invoke([*base[1:], "--out", out, "--params", params, "--report", metrics, *extra])
        assert res.exit_code == 0, res.output
        assert f"judge {name}" in res.output
        m = json.loads(metrics.read_text())["eval"]
        assert m["judge"] == name
        assert f"Judge: `{name}`" in (out / "report.md").read_text()
        rows = list(csv.DictReader((out / "curves.csv").read_text().splitlines()))
        shapes.append((sorted(m), sorted(m["final"]), list(rows[0]), len(rows)))
        golds.append([round(float(r["gold_mean"]), 4) for r in rows])
    assert shapes[0] == shapes[1] == shapes[2]
    # three different verdicts of the same samples (the proxy columns are the same RM's)
    assert len({tuple(g) for g in golds}) == 3
    # the world judge's scale is 0-5; the held-out gold RM learned "good" > "bad"
    assert all(0 <= g <= 5 for g in golds[0])


def _invoke_raw(args):
    from rlhf.cli.app import app
    from typer.testing import CliRunner

    return CliRunner().invoke(app, [str(a) for a in args])


def test_heldout_figure_takes_the_judge(tmp_path):
    """The ppo stage's held-out figure (pipeline/ppo/heldout_gold.gold_eval) scores with the judge
    it is given: the world default equals an explicit WorldGoldJudge, an RM judge's mean is the
    mean of that RM's scores of the same samples."""
    from rlhf.pipeline.decode import Sampling
    from rlhf.pipeline.models.judges import JudgeConfig, WorldGoldJudge, load_judge
    from rlhf.pipeline.models.policy import load_policy, sample
    from rlhf.pipeline.ppo.heldout_gold import gold_eval

    paths = ppo_tiny.build_world(tmp_path / "w")
    prompts = [(f"p{i}", t) for i, t in enumerate(ppo_tiny.PROMPTS[:6])]
    s = Sampling(0.8, 1.0, 6)
    assert gold_eval(paths["policy"], prompts, s, 0) == gold_eval(paths["policy"], prompts, s, 0,
                                                                  judge=WorldGoldJudge())
    rm = load_judge(JudgeConfig(kind="rm", model=str(paths["reward"])))
    got = gold_eval(paths["policy"], prompts, s, 0, judge=rm)
    model, tok = load_policy(paths["policy"])
    outs = sample(model, tok, [t for _, t in prompts], n=1, max_new_tokens=6, temperature=0.8,
                  top_p=1.0, seed=0)
    scores = rm.score([t for _, t in prompts], [o[0].response for o in outs])
    assert got["gold_mean"] == pytest.approx(sum(scores) / len(scores), abs=1e-4)
    # `engine` picks the sampler (the ppo stage passes ppo.engine): the native engine's draws at
    # the same seed are other responses, and the figure is theirs
    native = gold_eval(paths["policy"], prompts, s, 0, judge=rm, per_prompt=True, engine="native")
    outs_n = sample(model, tok, [t for _, t in prompts], n=1, max_new_tokens=6, temperature=0.8,
                    top_p=1.0, seed=0, engine="native")
    assert [o[0].response for o in outs_n] != [o[0].response for o in outs]
    assert native["scores"] == pytest.approx(
        rm.score([t for _, t in prompts], [o[0].response for o in outs_n]), abs=1e-4)


def test_bad_judge_is_one_error_line(tmp_path):
    paths, ppo = _world(tmp_path)
    base = ["--sft", paths["policy"], "--ppo", ppo, "--light-rm", paths["reward"],
            "--strong-rm", paths["reward"], "--prompts", paths["prompts"], "--out",
            tmp_path / "e"]
    for judge, needle in (({"kind": "heldout_rm"}, "--judge-model"),
                          ({"kind": "gold"}, "kind must be one of"),
                          ({"kind": "rm", "model": str(tmp_path / "no-such-rm")}, "cannot load")):
        res = _invoke([*base, "--params", _params(tmp_path, "bad", judge)])
        assert res.exit_code == 2, res.output
        assert needle in res.output and "Traceback" not in res.output
