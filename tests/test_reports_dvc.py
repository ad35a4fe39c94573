"""`make report`'s pipeline (reports/dvc.yaml): the figures no stage of `make run` reads. Its
stages run commands the CLI has, start from what the root pipeline writes (so `make report`
follows `make run`), read params that exist, and write a metrics file per stage with its own
headline list; `make report` reproduces this file and only it."""

from __future__ import annotations

import re
import shlex

import yaml


def _stages(repo):
    return yaml.safe_load((repo / "reports" / "dvc.yaml").read_text())["stages"]


def _root_outs(repo) -> set[str]:
    outs = set()
    for stage in yaml.safe_load((repo / "dvc.yaml").read_text())["stages"].values():
        for entry in stage.get("outs", []) + stage.get("metrics", []):
            outs.add(next(iter(entry)) if isinstance(entry, dict) else entry)
    return outs


def test_each_stage_runs_a_command_of_the_cli_on_the_pipelines_outputs(repo):
    from rlhf.cli.app import app
    from rlhf.cli.common import HEADLINES

    commands = {c.name for c in app.registered_commands}
    root_outs = _root_outs(repo)
    for name, stage in _stages(repo).items():
        argv = shlex.split(stage["cmd"])
        assert argv[0] == "rlhf" and argv[1] in commands, name
        for dep in stage["deps"]:
            assert dep.startswith("../"), dep  # relative to reports/
            path = dep[3:]
            if path.startswith("artifacts/"):  # an output of dvc.yaml or a file inside one
                assert any(path == out or path.startswith(out + "/") for out in root_outs), (
                    f"{name}: {path} is no output of dvc.yaml")
            else:
                assert (repo / path).exists(), dep
        metrics = [next(iter(m)) for m in stage["metrics"]]
        assert metrics == [f"../artifacts/metrics/{name}.json"]
        assert argv[argv.index("--metrics") + 1] == metrics[0]
        assert name in HEADLINES  # what its metrics file holds


def test_the_params_it_reads_exist(repo):
    params = yaml.safe_load((repo / "params.yaml").read_text())
    for name, stage in _stages(repo).items():
        for entry in stage["params"]:
            (path, keys), = entry.items()
            assert path == "../params.yaml", name
            for key in keys:
                node = params
                for part in key.split("."):
                    assert part in node, f"{name}: params.yaml has no {key}"
                    node = node[part]


def test_make_report_reproduces_the_report_pipeline_only(repo):
    make = (repo / "Makefile").read_text()
    recipe = re.search(r"^report:.*\n((?:\t.*\n)+)", make, re.MULTILINE)
    assert recipe and "dvc repro reports/dvc.yaml" in recipe.group(1)
    run = re.search(r"^run:.*\n((?:\t.*\n)+)", make, re.MULTILINE).group(1)
    assert "reports/" not in run  # `make run` leaves the report's stages alone
