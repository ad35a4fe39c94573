"""Metrics and reports are written at a stated precision (cli/common.METRIC_DIGITS significant
digits), so float noise below it leaves the files, dvc.lock and `git status` unchanged."""

import json

from rlhf.cli.common import METRIC_DIGITS, write_metrics


def test_float_noise_below_the_precision_leaves_the_bytes(tmp_path):
    a = {"train_loss": 1.2345678901, "eval_loss": 0.1 + 0.2, "gold_mean": 3.0, "n": 7,
         "nested": {"x": [2.000000000001, 5e-9 * (1 + 1e-9)]}}
    b = {"train_loss": 1.2345678899, "eval_loss": 0.3, "gold_mean": 3.0000000001, "n": 7,
         "nested": {"x": [1.999999999999, 5e-9]}}
    paths = {}
    for name, report in (("a", a), ("b", b)):
        paths[name] = (tmp_path / name / "metrics.json", tmp_path / name / "report.json")
        write_metrics("sft", report, *paths[name])
    for i in (0, 1):
        assert paths["a"][i].read_bytes() == paths["b"][i].read_bytes()
    full = json.loads(paths["a"][1].read_text())
    assert full["train_loss"] == 1.23457 and full["eval_loss"] == 0.3 and full["n"] == 7
    assert full["nested"]["x"] == [2.0, 5e-9]
    assert METRIC_DIGITS == 6
    # a difference above the precision is kept
    write_metrics("sft", {"train_loss": 1.23467}, paths["b"][0], None)
    assert json.loads(paths["b"][0].read_text())["train_loss"] == 1.23467
