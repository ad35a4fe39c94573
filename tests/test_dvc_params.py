"""dvc.yaml declares what each stage reads: every param (a stage given only its declared params
still loads its config), the store modules of the tables it writes, its metrics and report files,
and the CSV columns its plots name. Each stage's command is run exactly as dvc.yaml writes it, in
an empty folder, so it stops at its first missing input, after reading its params."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml
from rlhf.cli.app import app
from rlhf.cli.common import HEADLINES
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[1]
DVC = yaml.safe_load((REPO / "dvc.yaml").read_text())
STAGES = DVC["stages"]
PARAMS = yaml.safe_load((REPO / "params.yaml").read_text())
PARAMS_ERRORS = ("missing required key", "unknown key", "params file not found", "section")


def _declared(stage: str) -> list[str]:
    return [p for p in STAGES[stage].get("params", []) if isinstance(p, str)]


def _only(declared: list[str], drop: str = "") -> dict:
    """params.yaml cut down to the `declared` entries (whole sections or section.key)."""
    out: dict = {}
    for entry in declared:
        if entry == drop:
            continue
        section, _, key = entry.partition(".")
        if key:
            out.setdefault(section, {})[key] = PARAMS[section][key]
        else:
            out[section] = PARAMS[section]
    return out


def _run_as_dvc(stage: str, folder: Path, params: dict, monkeypatch) -> str:
    (folder / "params.yaml").write_text(yaml.safe_dump(params))
    if stage == "world":  # no inputs: an output path in the way stops it after the params
        (folder / "artifacts").mkdir()
        (folder / "artifacts" / "world").write_text("in the way")
    argv = shlex.split(STAGES[stage]["cmd"])
    assert argv[0] == "rlhf"
    monkeypatch.chdir(folder)
    res = CliRunner().invoke(app, argv[1:], env={"COLUMNS": "400"})
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), (res.output,
                                                                          res.exception)
    return res.output


@pytest.mark.parametrize("stage", list(STAGES))
def test_a_stage_reads_only_the_params_its_dvc_stage_declares(stage, tmp_path, monkeypatch):
    out = _run_as_dvc(stage, tmp_path, _only(_declared(stage)), monkeypatch)
    # it got past its params (every key it reads is declared) and stopped at a missing input
    assert not any(e in out for e in PARAMS_ERRORS), out
    assert "artifacts" in out, out


@pytest.mark.parametrize("stage, entry", [("reward", "ppo.top_p"), ("sft", "sft.lora_r"),
                                          ("eval", "eval"), ("ppo", "ppo")])
def test_an_undeclared_param_is_caught(stage, entry, tmp_path, monkeypatch):
    """The check above has teeth: without one of its entries the stage stops at its params."""
    assert entry in _declared(stage)
    out = _run_as_dvc(stage, tmp_path, _only(_declared(stage), drop=entry), monkeypatch)
    assert any(e in out for e in PARAMS_ERRORS), out
    assert entry.partition(".")[2] in out or f"'{entry}'" in out, out


def _paths(entries: list) -> set[str]:
    return {next(iter(e)) if isinstance(e, dict) else e for e in entries}


@pytest.mark.parametrize("stage", list(STAGES))
def test_a_stage_that_writes_store_tables_depends_on_the_store_modules(stage):
    outs, deps = _paths(STAGES[stage].get("outs", [])), _paths(STAGES[stage]["deps"])
    if any(o.startswith("artifacts/store/") for o in outs):
        assert {"store/schemas.py", "store/io.py", "store/hashing.py"} <= deps, stage


@pytest.mark.parametrize("dvc_file", ["dvc.yaml", "profiles/realdata/dvc.yaml"])
def test_every_stage_depends_on_the_writer_of_its_metrics(dvc_file):
    """cli/common.write_metrics decides what a stage's metrics and report hold (the headlines,
    the precision, the wall-clock figures left out): a change to it must rerun the stage."""
    stages = yaml.safe_load((REPO / dvc_file).read_text())["stages"]
    prefix = "../../" if "/" in dvc_file else ""
    missing = [name for name, st in stages.items() if "rlhf " in st["cmd"]
               and f"{prefix}cli/common.py" not in _paths(st["deps"])]
    assert missing == []


@pytest.mark.parametrize("stage", list(STAGES))
def test_each_stage_writes_its_headline_metrics_and_its_report(stage):
    cmd = STAGES[stage]["cmd"]
    metrics, report = f"artifacts/metrics/{stage}.json", f"artifacts/reports/{stage}.json"
    assert f"--metrics {metrics}" in cmd and f"--report {report}" in cmd
    # a headline file is a DVC metric (what `dvc metrics show` lists) or an uncached output
    declared = _paths(STAGES[stage].get("metrics", []))
    assert declared == {metrics} or (not declared and {metrics: {"cache": False}}
                                     in STAGES[stage]["outs"])
    assert {report: {"cache": False}} in STAGES[stage]["outs"]
    assert HEADLINES[stage]


def test_dvc_metrics_show_lists_at_most_20_columns():
    """`dvc metrics show` prints one column per distinct headline key of the declared files."""
    keys = set()
    for stage, spec in STAGES.items():
        if spec.get("metrics"):
            keys |= set(HEADLINES[stage])
    assert 0 < len(keys) <= 20, sorted(keys)


def test_the_plots_name_the_metrics_csv_columns():
    from rlhf.pipeline.ppo.records import CSV_COLUMNS, SIX_METRICS
    from rlhf.store.schemas import TABLES

    plot = next(p["artifacts/ppo/metrics.csv"] for p in DVC["plots"]
                if "artifacts/ppo/metrics.csv" in p)
    assert plot["x"] in CSV_COLUMNS and set(plot["y"]) <= set(CSV_COLUMNS)
    assert set(SIX_METRICS.values()) <= set(TABLES["train_metrics"].names)


# Params a stage reads only while a switch is on (that switch's value): dvc.yaml declares them
# all the same, so flipping the switch in params.yaml reruns the stage with them.
CONDITIONAL = {"ppo": {"judge": {"ppo.heldout_eval": True},
                       **{f"preferences.{k}": {"ppo.human_labels_per_step": 1}
                          for k in ("annotators", "seed", "labels")}}}


def _entries_read(read: dict) -> set[str]:
    return set(read) | {f"{s}.{k}" for s, values in read.items() for k in values}


@pytest.mark.parametrize("stage", list(STAGES))
def test_a_stage_reads_every_param_its_dvc_stage_declares(stage, tmp_path, monkeypatch):
    """The other direction: a param dvc.yaml declares that the stage never reads (a stale entry,
    or one a constant shadows at load time) fails. `load_config`, the one loader every command
    reads its params with, records what it returned (common.params_read); the stage's report
    holds that record as `params`."""
    from rlhf.cli.common import params_read

    _run_as_dvc(stage, tmp_path, _only(_declared(stage)), monkeypatch)
    read = params_read()
    unread = [e for e in _declared(stage) if e not in _entries_read(read)]
    # a section a switch makes the stage read: read once that switch is on
    switched = {e: on for e, on in CONDITIONAL.get(stage, {}).items() if e in unread}
    for entry, on in switched.items():
        section, _, key = next(iter(on)).partition(".")
        params = _only(_declared(stage))
        params[section] = {**params[section], key: on[f"{section}.{key}"]}
        _run_as_dvc(stage, tmp_path, params, monkeypatch)
        assert entry in _entries_read(params_read()), (entry, on)
        unread.remove(entry)
        read = {**params_read(), **read}
    assert not unread, f"{stage}: declared in dvc.yaml but never read: {unread}"
    for entry in _declared(stage):  # and the values read are the file's
        section, _, key = entry.partition(".")
        want = PARAMS[section] if not key else {key: PARAMS[section][key]}
        for k, v in want.items():
            got = read[section][k]
            assert got == v or (isinstance(v, dict) and all(got[x] == y for x, y in v.items())), \
                (entry, k)


def test_an_unread_declared_param_is_caught(tmp_path, monkeypatch):
    """The check above has teeth: had dvc.yaml declared `sft` for the world stage, the record
    of what the stage read would not hold it."""
    from rlhf.cli.common import params_read

    _run_as_dvc("world", tmp_path, {**_only(_declared("world")), "sft": PARAMS["sft"]},
                monkeypatch)
    assert "world" in params_read() and "sft" not in _entries_read(params_read())
