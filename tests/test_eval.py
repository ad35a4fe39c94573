"""The eval stage (pipeline/eval.py): metrics on hand-made inputs, the exact KL against an
unbatched computation, and the whole stage (CLI) on tiny models the test builds itself."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import ppo_tiny
import pytest
from rlhf.pipeline.eval import EvalConfig, repetition_rate, win_rate


def test_repetition_rate_hand_made():
    # bigrams: ab ba ab ba ab -> 5 grams, 2 distinct
    assert repetition_rate("a b a b a b", n=2) == pytest.approx(1 - 2 / 5)
    assert repetition_rate("the cat sat on the mat", n=4) == 0.0
    assert repetition_rate("too short", n=4) == 0.0
    assert repetition_rate("", n=1) == 0.0
    # 4-grams of "x y z w x y z w": xyzw yzwx zwxy wxyz xyzw -> 5 grams, 4 distinct
    assert repetition_rate("x y z w x y z w", n=4) == pytest.approx(1 / 5)


def test_win_rate_counts_ties_as_half():
    assert win_rate([3.0, 2.0, 1.0, 2.0], [1.0, 2.0, 3.0, 2.0 + 1e-12]) == pytest.approx(0.5)
    assert win_rate([1.0, 1.0], [0.0, 0.5]) == 1.0
    assert win_rate([0.0], [0.5]) == 0.0
    with pytest.raises(ValueError):
        win_rate([1.0], [1.0, 2.0])


def test_config_rejects_bad_values():
    with pytest.raises(ValueError):
        EvalConfig(n_prompts=-1)
    with pytest.raises(ValueError):
        EvalConfig(max_new_tokens=0)


def _perturbed(tok, scale: float, seed: int):
    import torch


    model = ppo_tiny.policy(tok)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return model


@pytest.mark.parametrize("engine", ["hf", "native"])
def test_batched_kl_matches_unbatched_sum(tmp_path, engine):
    """Left padding and position ids must not change the KL: each row's sum equals the KL
    computed from a forward over that prompt + response alone (with either rollout engine)."""
    import torch
    from rlhf.pipeline.eval import sample_with_kl
    from rlhf.pipeline.decode import Sampling, full_kl, get_generator
    from rlhf.pipeline.models.text import format_prompt

    tok = ppo_tiny.tokenizer()
    ref, pol = ppo_tiny.policy(tok), _perturbed(tok, 0.05, 1)
    prompts = ppo_tiny.PROMPTS[:5]
    cfg = EvalConfig(max_new_tokens=6, batch_size=5, engine=engine)
    outs = sample_with_kl(pol, ref, tok, prompts, cfg, temperature=0.8, top_p=1.0)
    assert len(outs) == 5 and any(o["kl"] > 0 for o in outs)
    # regenerate row by row is not the same sample; instead re-score the batch's own tokens
    tok.padding_side = "left"
    enc = tok([format_prompt(p) for p in prompts], return_tensors="pt", padding=True)
    torch.manual_seed(0)
    with torch.no_grad():
        seq = get_generator(engine).generate(pol, tok, enc, Sampling(0.8, 1.0, 6)).sequences
    gen = seq[:, enc["input_ids"].shape[1]:].tolist()
    for i, p in enumerate(prompts):
        stop = gen[i].index(tok.eos_token_id) + 1 if tok.eos_token_id in gen[i] else len(gen[i])
        q = tok(format_prompt(p), return_tensors="pt")["input_ids"]
        ids = torch.cat([q, torch.tensor([gen[i][:stop]])], 1)
        P = q.shape[1]
        with torch.no_grad():
            lp = pol(input_ids=ids).logits[:, P - 1:P - 1 + stop] / (0.8 + 1e-7)
            lr = ref(input_ids=ids).logits[:, P - 1:P - 1 + stop] / (0.8 + 1e-7)
        assert outs[i]["n_tokens"] == stop
        assert outs[i]["kl"] == pytest.approx(float(full_kl(lp, lr).sum()), rel=1e-4,
                                              abs=1e-6)


def _world(tmp_path):
    import torch


    paths = ppo_tiny.build_world(tmp_path / "world")
    tok = ppo_tiny.tokenizer()
    ppo = tmp_path / "ppo"
    for step, scale in ((2, 0.02), (4, 0.2)):  # further from SFT at the later checkpoint
        folder = ppo / "checkpoints" / f"step-{step:06d}"
        folder.mkdir(parents=True)
        torch.save(_perturbed(tok, scale, step).state_dict(), folder / "policy.pt")
        (folder / "trainer_state.json").write_text(json.dumps(
            {"step": step, "config": {"critic": "trunk", "critic_layers": 1}}))
    (ppo / "checkpoints" / "latest").write_text("step-000004")
    # the trainer's per-step log: the value quality the eval report averages per checkpoint
    (ppo / "metrics.jsonl").write_text("".join(json.dumps(
        {"step": k, "value_explained_variance": 0.1 * k, "value_rmse": 1.0 / k}) + "\n"
        for k in (1, 2, 3, 4)))
    return paths, ppo


def _params(tmp_path, **eval_kw):
    ev = {"seed": 0, "max_new_tokens": 6, "max_prompt_tokens": 16, "n_prompts": 10,
          "batch_size": 4, **eval_kw}
    from params_file import write_params

    return write_params(tmp_path / "params.yaml", ppo=dict(ppo_tiny.PARAMS), eval=ev, judge={})


def _invoke(args):
    from rlhf.cli.app import app
    from typer.testing import CliRunner

    return CliRunner().invoke(app, ["eval", *map(str, args)])


def test_eval_stage_writes_report_plots_curves_metrics(tmp_path):
    paths, ppo = _world(tmp_path)
    out, metrics = tmp_path / "eval", tmp_path / "metrics" / "eval.json"
    args = ["--sft", paths["policy"], "--ppo", ppo, "--light-rm", paths["reward"],
            "--strong-rm", paths["reward"], "--prompts", paths["prompts"], "--out", out,
            "--params", _params(tmp_path), "--metrics", metrics,
            "--report", tmp_path / "reports" / "eval.json"]
    res = _invoke(args)
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader((out / "curves.csv").read_text().splitlines()))
    assert [int(r["step"]) for r in rows] == [0, 2, 4]
    assert float(rows[0]["kl_mean"]) == 0.0 and float(rows[0]["win_rate"]) == 0.5
    kls = [float(r["kl_mean"]) for r in rows]
    assert 0 < kls[1] < kls[2]
    for r in rows:
        assert math.isclose(float(r["sqrt_kl"]), math.sqrt(float(r["kl_mean"])), rel_tol=1e-4)
        assert 0 <= float(r["win_rate"]) <= 1 and 0 <= float(r["gold_mean"]) <= 5
    # the light and strong RM are the same model here: the two proxy columns must agree
    assert [r["light_rm_mean"] for r in rows] == [r["strong_rm_mean"] for r in rows]
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 3 * 10
    step4 = [s for s in samples if s["step"] == 4]
    assert float(rows[2]["gold_mean"]) == pytest.approx(sum(s["gold"] for s in step4) / 10,
                                                        abs=1e-5)
    for png in ("gold_proxy_vs_kl.png", "metrics_sft_vs_ppo.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "report.md").read_text()
    assert "| 4 |" in report and "gold_proxy_vs_kl.png" in report
    m = json.loads((tmp_path / "reports" / "eval.json").read_text())["eval"]
    assert json.loads(metrics.read_text())["eval"]["final"] == {
        k: m["final"][k] for k in ("step", "gold_mean", "win_rate", "sqrt_kl")}
    assert m["n_prompts"] == 10 and m["final"]["step"] == 4 and m["sft"]["step"] == 0
    # the critic's value quality at each checkpoint: metrics.jsonl's steps since the one before
    logged = [json.loads(line) for line in (ppo / "metrics.jsonl").read_text().splitlines()]
    value = m["critic"]
    assert value["critic"] == "trunk (critic_layers 1)"
    assert [r["step"] for r in value["by_checkpoint"]] == [2, 4]
    for r, window in zip(value["by_checkpoint"], ((1, 2), (3, 4))):
        rows_w = [x for x in logged if x["step"] in window]
        assert r["steps"] == 2
        assert r["value_rmse"] == pytest.approx(
            sum(x["value_rmse"] for x in rows_w) / 2, rel=1e-4)
    assert "## Critic" in report and "value explained variance" in report
    # fixed seeds: a second run writes the same curves (dvc status stays clean)
    first = (out / "curves.csv").read_text()
    assert _invoke(args).exit_code == 0
    assert (out / "curves.csv").read_text() == first


def test_value_windows_average_the_steps_since_the_checkpoint_before():
    from rlhf.pipeline.eval import value_windows

    rows = [{"step": 1, "value_explained_variance": 0.2, "value_rmse": 1.0},
            {"step": 2, "value_explained_variance": float("nan"), "value_rmse": 3.0},
            {"step": 3, "value_explained_variance": 0.6, "value_rmse": 0.5},
            {"step": 4}]
    got = value_windows(rows, [4, 2])
    assert got == [{"step": 2, "steps": 2, "value_explained_variance": 0.2, "value_rmse": 2.0},
                   {"step": 4, "steps": 2, "value_explained_variance": 0.6, "value_rmse": 0.5}]
    from rlhf.pipeline.eval import value_quality

    assert value_quality(Path("/nonexistent"), [2]) == {}  # a run that logged none: no section
    assert value_windows(rows[:1], [5, 9])[1] == {
        "step": 9, "steps": 0, "value_explained_variance": None, "value_rmse": None}


def test_eval_checkpoint_selection_and_clean_errors(tmp_path):
    paths, ppo = _world(tmp_path)
    base = ["--sft", paths["policy"], "--ppo", ppo, "--light-rm", paths["reward"],
            "--strong-rm", paths["reward"], "--prompts", paths["prompts"],
            "--out", tmp_path / "eval"]
    res = _invoke([*base, "--params", _params(tmp_path, checkpoints=[4], n_prompts=3)])
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader((tmp_path / "eval" / "curves.csv").read_text().splitlines()))
    assert [int(r["step"]) for r in rows] == [0, 4]
    res = _invoke([*base, "--params", _params(tmp_path, checkpoints=[6])])
    assert res.exit_code == 2 and "step(s) [6]" in res.output
    res = _invoke([*base[:3], tmp_path / "nope", *base[4:], "--params", _params(tmp_path)])
    assert res.exit_code == 2 and "does not exist" in res.output
    assert "Traceback" not in res.output


def test_prompt_cap_is_a_seeded_subset(tmp_path):
    from rlhf.pipeline.eval import load_eval_prompts

    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt_id": f"q{i:02d}", "text": t}) + "\n"
                            for i, t in enumerate(ppo_tiny.PROMPTS)))
    every = load_eval_prompts(path)
    assert len(every) == len(ppo_tiny.PROMPTS)
    five = load_eval_prompts(path, cap=5, seed=3)
    assert len(five) == 5 and set(five) <= set(every) and five == sorted(five)
    assert five == load_eval_prompts(path, cap=5, seed=3)
    assert five != load_eval_prompts(path, cap=5, seed=4)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="no held-out prompts"):
        load_eval_prompts(tmp_path / "empty.jsonl")


@pytest.mark.slow  # spawned workers: a torch import each
@pytest.mark.usefixtures("one_torch_thread")  # as the stage (quiet_hf) and its workers run
def test_policies_evaluated_in_workers_equal_the_inline_ones(tmp_path, monkeypatch):
    """`make run` (RLHF_WORKERS=0) samples and scores the policies in one process per core:
    every curve and sample row equals the inline run's, exactly."""
    from rlhf.pipeline.eval import evaluate, load_eval_prompts

    paths, ppo = _world(tmp_path)
    cfg = EvalConfig(max_new_tokens=6, max_prompt_tokens=16, n_prompts=10, batch_size=4)
    prompts = load_eval_prompts(paths["prompts"], cfg.n_prompts, cfg.seed)
    runs = {}
    for workers in ("1", "2"):
        monkeypatch.setenv("RLHF_WORKERS", workers)
        runs[workers] = evaluate(cfg, paths["policy"], ppo, paths["reward"], paths["reward"],
                                 prompts, temperature=0.8, top_p=1.0, progress=False)
    curves, samples = runs["2"]
    assert [c["step"] for c in curves] == [0, 2, 4] and len(samples) == 3 * 10
    assert runs["2"] == runs["1"]


@pytest.mark.usefixtures("one_torch_thread")
def test_eval_scores_with_a_reward_server_in_the_policys_chat_template(tmp_path):
    """`rlhf eval --light-rm http://...` (as `rlhf ppo --reward`): the server gets each prompt
    and response as the policy saw them, in its ChatML template (OpenRLHF's contract), and a
    row it declines (valid false) is left out of the mean and kept as null in samples.jsonl."""
    from rlhf.pipeline.models.text import render_prompt, render_sample
    from test_chat_templates import CHATML, MULTI, SINGLE, _tokenizer
    from test_ppo_rewards import Server

    tok = _tokenizer(CHATML)
    pol = ppo_tiny.policy(tok)
    pol.config.max_position_embeddings = 256
    pol.save_pretrained(tmp_path / "policy")
    tok.save_pretrained(tmp_path / "policy")
    (tmp_path / "ppo" / "checkpoints").mkdir(parents=True)  # no checkpoint: SFT alone
    stored = [MULTI, SINGLE]
    (tmp_path / "prompts.jsonl").write_text("".join(
        json.dumps({"prompt_id": f"p{i}", "text": t}) + "\n" for i, t in enumerate(stored)))

    def answer(body, hit):  # the multi-turn prompt's row scored, the single turn's declined
        return 200, {"rewards": [float(len(q)) for q in body["query"]],
                     "valid": ["Why is it blue?" in p for p in body["prompts"]]}

    with Server(answer) as srv:
        res = _invoke(["--sft", tmp_path / "policy", "--ppo", tmp_path / "ppo",
                       "--light-rm", srv.url, "--strong-rm", srv.url,
                       "--prompts", tmp_path / "prompts.jsonl", "--out", tmp_path / "eval",
                       "--params", _params(tmp_path, max_prompt_tokens=96)])
    assert res.exit_code == 0, res.output
    assert len(srv.bodies) == 2  # the light and the strong reward, one batch each
    samples = [json.loads(x) for x in (tmp_path / "eval" / "samples.jsonl").read_text()
               .splitlines()]
    by_prompt = {s["prompt"]: s for s in samples}
    assert sorted(by_prompt) == sorted(stored)
    for body in srv.bodies:
        assert sorted(body["prompts"]) == sorted(render_prompt(p, tok) for p in stored)
        for prompt, query, response in zip(body["prompts"], body["query"], body["responses"]):
            stored_prompt = next(p for p in stored if render_prompt(p, tok) == prompt)
            assert prompt.endswith("<|im_start|>assistant\n") and "Human:" not in query
            assert response == by_prompt[stored_prompt]["response"]
            assert query == render_sample(stored_prompt, response, tok)
    multi = by_prompt[MULTI]
    assert multi["light_rm"] == multi["strong_rm"] == float(
        len(render_sample(MULTI, multi["response"], tok)))
    assert by_prompt[SINGLE]["light_rm"] is None and by_prompt[SINGLE]["strong_rm"] is None
    (row,) = csv.DictReader((tmp_path / "eval" / "curves.csv").read_text().splitlines())
    assert float(row["light_rm_mean"]) == pytest.approx(multi["light_rm"])
