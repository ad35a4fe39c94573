from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from rlhf.cli.app import app
from rlhf.cli.doctor import known_bad

runner = CliRunner()


def _rlhf() -> str:
    exe = Path(sys.executable).with_name("rlhf")
    return str(exe) if exe.exists() else shutil.which("rlhf")


def test_console_script_help_and_doctor():
    out = subprocess.run([_rlhf(), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "doctor" in out.stdout
    out = subprocess.run([_rlhf(), "doctor"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "torch" in out.stdout and "duckdb" in out.stdout
    assert "loads offline (dim 384)" in out.stdout


def test_known_bad_combinations(tmp_path):
    versions = {"flash-attn": "2.8.3", "torch": "2.2.1", "transformers": "4.30.0"}
    cfg = tmp_path / "zero3.json"
    cfg.write_text(json.dumps({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}))
    messages = " ".join(f.message for f in known_bad(versions, "12.2", [cfg]))
    for needle in ("flash-attn 2.8.3", "CUDA 12.2", "torch 2.2", "transformers < 4.36.2", "offload_param"):
        assert needle in messages
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"zero_optimization": {"offload_optimizer": {"device": "cpu"}}}))
    assert known_bad({"flash-attn": "2.5.8", "torch": "2.13.0"}, None, [good]) == []


def test_params_check_reports_bad_key_without_traceback(tmp_path, repo):
    bad = tmp_path / "params.yaml"
    bad.write_text((repo / "params.yaml").read_text() + "\nnot_a_section: {}\n")
    result = runner.invoke(app, ["params", "check", "--params", str(bad)])
    assert result.exit_code == 2
    assert "not_a_section" in result.output
    assert "Traceback" not in result.output
    ok = runner.invoke(app, ["params", "check", "--params", str(repo / "params.yaml")])
    assert ok.exit_code == 0, ok.output


def test_namespace_only_rlhf_installed(tmp_path):
    code = (
        "import importlib.util as u, rlhf.store, rlhf.pipeline, rlhf.cli;"
        "print([m for m in ('store', 'cli', 'pipeline') if u.find_spec(m) is not None])"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_write_metrics_splits_the_headline_from_the_report(tmp_path):
    import datetime as dt
    import json

    from rlhf.cli.common import HEADLINES, headline, write_metrics

    report = {"eval": {"n_prompts": 3, "gold_gain": float("nan"), "sampling": {"seed": 0},
                       "sft": {"gold_mean": 1.0, "step": 0}, "final": {"step": 4, "win_rate": 0.5,
                                                                     "at": dt.date(2026, 1, 5)}}}
    m, r = tmp_path / "metrics" / "eval.json", tmp_path / "reports" / "eval.json"
    write_metrics("eval", report, m, r)
    # the headline: only HEADLINES["eval"], nested as in the report; a figure not computed is left
    # out, NaN is null (JSON has no NaN)
    assert json.loads(m.read_text()) == {"eval": {"n_prompts": 3, "gold_gain": None,
                                                  "sft": {"gold_mean": 1.0},
                                                  "final": {"step": 4, "win_rate": 0.5}}}
    full = json.loads(r.read_text())
    assert full["eval"]["sampling"] == {"seed": 0} and full["eval"]["final"]["at"] == "2026-01-05"
    assert headline("reward", {"heldout_accuracy_mean": 0.8, "n_train_pairs": 9}) == {
        "heldout_accuracy_mean": 0.8}
    assert "spearman_light_vs_gold_onpolicy_within_prompt" in HEADLINES["reward_figures"]


def test_wall_clock_figures_go_beside_the_report_not_into_versioned_files(tmp_path):
    """A stage's seconds and speeds (cli/common.TIMINGS) differ on every run: they go to
    <report>.timings.json, and two runs that differ only in them write byte-identical metrics
    and reports (what keeps dvc.lock and `git status` clean after `make run`)."""
    import json

    from rlhf.cli.common import HEADLINES, TIMINGS, write_metrics

    def report(seconds: float) -> dict:
        return {"heldout_accuracy_mean": 0.8, "seconds": seconds,
                "phase_seconds": {"strong_ensemble": seconds}, "n_train_pairs": 9,
                "external": {"hh": {"accuracy": 0.6}, "train_seconds": seconds}}

    files = {}
    for name, secs in (("a", 455.1), ("b", 398.7)):
        m, r = tmp_path / name / "metrics.json", tmp_path / name / "reward.json"
        full = report(secs)
        write_metrics("reward", full, m, r)
        assert full["seconds"] == secs  # the caller's dict (what the command prints) keeps them
        files[name] = (m.read_bytes(), r.read_bytes(),
                       json.loads((tmp_path / name / "reward.timings.json").read_text()))
    assert files["a"][:2] == files["b"][:2]
    assert files["a"][2] == {"seconds": 455.1,
                             "phase_seconds": {"strong_ensemble": 455.1},
                             "external": {"train_seconds": 455.1}}
    assert json.loads(files["a"][1]) == {"heldout_accuracy_mean": 0.8, "n_train_pairs": 9,
                                         "external": {"hh": {"accuracy": 0.6}}}
    # a stage without wall-clock figures, or without a report path, writes no timings file
    write_metrics("eval", {"eval": {"n_prompts": 3}}, None, tmp_path / "e" / "eval.json")
    assert not (tmp_path / "e" / "eval.timings.json").exists()
    write_metrics("sft", {"train_seconds": 3.0, "train_loss": 1.0}, tmp_path / "s.json", None)
    assert json.loads((tmp_path / "s.json").read_text()) == {"train_loss": 1.0}
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == ["s.json"]
    # the embedding cache's hits say what a run found, not what it made
    write_metrics("dedup", {"kept": 5, "embedded_new": 0, "embedded_cached": 9}, None,
                  tmp_path / "d" / "dedup.json")
    assert json.loads((tmp_path / "d" / "dedup.json").read_text()) == {"kept": 5}
    assert json.loads((tmp_path / "d" / "dedup.timings.json").read_text()) == {
        "embedded_new": 0, "embedded_cached": 9}
    # no wall-clock figure is a headline: the headlines hold only what the inputs determine
    for stage, keys in TIMINGS.items():
        assert not set(HEADLINES[stage]) & set(keys), stage


def test_a_report_holds_every_param_its_command_read(tmp_path):
    """`params` in a stage's report: each value the command read through `load_config`, by
    section; a section read for a few fields holds those fields only. The metrics file never
    holds them (headlines only)."""
    import json

    import yaml
    from rlhf.cli.common import load_config, params_read, write_metrics
    from rlhf.pipeline.config import complete_section

    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({
        "difficulty": complete_section("difficulty", {"seed": 5}),
        "ppo": complete_section("ppo", {"temperature": 0.7, "top_p": 0.9})}))
    cfg = load_config(params, "difficulty")
    load_config(params, "ppo", ("temperature", "top_p"))
    assert params_read()["ppo"] == {"temperature": 0.7, "top_p": 0.9}
    assert params_read()["difficulty"]["seed"] == cfg.seed == 5
    write_metrics("difficulty", {"n_prompts": 3}, tmp_path / "m.json", tmp_path / "r.json")
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["params"]["ppo"] == {"temperature": 0.7, "top_p": 0.9}
    assert report["params"]["difficulty"]["seed"] == 5
    assert set(report["params"]["difficulty"]) == set(complete_section("difficulty", {}))
    assert "params" not in json.loads((tmp_path / "m.json").read_text())


def test_every_stage_with_a_judge_declares_judge_model_once(tmp_path):
    """`--judge-model` is one option (cli/common.py JUDGE_MODEL) in every command that reports
    a judge's figures: the same flag and help everywhere."""
    import inspect

    from rlhf.cli import common, ppo, reward, sft
    from rlhf.cli import eval as eval_cli

    commands = {"sft": sft.sft, "reward": reward.reward, "reward-figures": reward.reward_figures,
                "eval": eval_cli.eval_cmd, "ppo": ppo.ppo}
    for name, fn in commands.items():
        assert inspect.signature(fn).parameters["judge_model"].default is common.JUDGE_MODEL, name
    helps = set()
    for name in commands:
        out = runner.invoke(app, [name, "--help"], env={"COLUMNS": "400"}).output
        helps |= {" ".join(ln.split()) for ln in out.splitlines() if "--judge-model" in ln}
    assert len(helps) == 1, helps
