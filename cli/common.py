"""Helpers shared by the CLI commands: clean errors instead of tracebacks, user data shown as is.

Rich reads `[...]` in a printed string as markup: a prompt holding `[/INST]` (the Llama-2 chat
format) raises MarkupError, and `[bold red]x` would be shown as a styled `x`. Anything that comes
from the user (values, column names, file names, paths, exception messages) therefore goes to rich
as a `Text` (`plain`), never inside a markup string; `data_table` builds tables that way.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

err_console = Console(stderr=True)


# Control characters other than tab and newline (ESC, NUL, CR, BEL, DEL, C1) are shown as escapes:
# written raw, a value holding "\x1b[31m" or "\x1b]0;..." would restyle or retitle the terminal.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def plain(value: Any, style: str = "") -> Text:
    """`value` as rich text shown verbatim: no markup, no emoji codes, no highlighting, and
    control characters as visible escapes (`\x1b`, `\x00`, `\r`)."""
    text = _CONTROL.sub(lambda m: repr(m.group())[1:-1], str(value))
    return Text(text, style=style)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print `error: message` in red on stderr and exit with `code` (no traceback). The message
    is shown verbatim (it often quotes user input)."""
    err_console.print(Text.assemble(("error:", "bold red"), " ", plain(message)), highlight=False,
                      soft_wrap=True)
    raise typer.Exit(code)


def data_table(title: Any = "", columns: list[Any] = (), **kwargs: Any) -> Table:
    """A rich table whose title and column headers are shown verbatim; give `add_row` Texts
    (`plain`) or use `add_plain_row`."""
    table = Table(title=plain(title) if title else None, **kwargs)
    for col in columns:
        if isinstance(col, tuple):
            name, opts = col
            table.add_column(plain(name), **opts)
        else:
            table.add_column(plain(col))
    return table


def add_plain_row(table: Table, *cells: Any) -> None:
    """Add one row; every cell is shown verbatim (a Text is kept as it is, for styled cells)."""
    table.add_row(*(c if isinstance(c, Text) else plain(c) for c in cells))


# --------------------------------------------------------------------------- stage commands
# What the stage commands (cli/sft.py, preferences.py, reward.py, difficulty.py, demos.py,
# judge.py) share: their input checks and the metric table each prints at its end (what they
# read first of the params file, `stage_setup`, is below with the other params readers).
console = Console()


def need_dir(path: Path | None, what: str) -> None:
    """Fail with one error line unless `path` (the flag `what`) is a folder; None passes."""
    if path is not None and not path.is_dir():
        fail(f"{what} {path} is not a folder")


def need_model(kind: str, path: Path | None, what: str) -> Path | None:
    """The model folder `path` names; one error line naming it unless it is a readable model
    folder of `kind` (policy, scorer, tokenizer, model_config; hub_policy: a policy folder or a
    hub name, whose snapshot folder in the Hugging Face cache it returns:
    model_folders.policy_folder): missing, truncated or the wrong kind."""
    from rlhf.pipeline.models import model_folders as mf

    checks = {"policy": mf.check_policy, "hub_policy": mf.policy_folder,
              "scorer": mf.check_scorer,
              "tokenizer": mf.check_tokenizer, "model_config": mf.check_model_config,
              "pretrained": mf.check_pretrained}
    if path is None:
        return None
    try:
        return checks[kind](path, what)
    except mf.ModelFolderError as exc:
        fail(str(exc))


def reward_or_fail(spec: str, what: str) -> None:
    """Fail with one error line unless `spec` (the flag `what`) is a reward `load_scorer` reads
    (pipeline/models/code_rewards.py): a readable reward model folder (the reward stage's, or a
    plain sequence classifier), a `python:` function that loads, or an `http(s)://` server (asked
    when it scores)."""
    from rlhf.pipeline.models import code_rewards
    from rlhf.pipeline.models import model_folders as mf

    try:
        if code_rewards.kind(spec) == "python":
            code_rewards.load_function(spec)
        elif code_rewards.kind(spec) == "folder":
            mf.check_scorer(Path(spec), what, plain_allowed=True)
    except ValueError as exc:  # RewardError and ModelFolderError: one line naming it
        fail(str(exc))


def fmt(v: Any) -> str:
    """A figure as a summary table shows it: floats to 4 significant digits, None as `-`."""
    if isinstance(v, float):
        return f"{v:.4g}"
    if v is None:
        return "-"
    return str(v)


def print_table(title: str, rows: list[tuple[str, Any]]) -> None:
    """Print a stage's `metric | value` summary (values through `fmt`)."""
    t = data_table(title, ["metric", ("value", {"justify": "right"})])  # paths shown verbatim
    for k, v in rows:
        add_plain_row(t, k, fmt(v))
    console.print(t)


def pool_or_demos(pool: Path | None, demos: Path | None) -> Path | None:
    """The pool folder to read, or None to fall back on --demos (an error if neither is usable)."""
    if pool is not None and not pool.is_dir():
        if demos is None:
            fail(f"--pool {pool} is not a folder")
        return None
    return pool


# --------------------------------------------------------------------------- params, metrics
# Every value the running command read from its params file, by section (`load_config` records
# them): `write_metrics` puts them in the report as `params`, so a report says what its stage ran
# with, and tests/test_dvc_params.py checks that each stage reads every param dvc.yaml declares.
_READ: dict[str, dict[str, Any]] = {}


def params_read() -> dict[str, dict[str, Any]]:
    """The values this command has read so far, by section (a copy)."""
    import copy

    return copy.deepcopy(_READ)


def forget_params_read() -> None:
    """Start a new command's record (the app's callback; a test running commands in-process)."""
    _READ.clear()


def load_config(params: Path, section: str, fields: tuple[str, ...] | None = None) -> Any:
    """The typed `section` of the params file, every key from the file (pipeline.config
    `load_config`); any problem is one error line, no traceback. The one loader of every
    command: a missing file, section or key is an error, never a silent default. What it
    returns is recorded (`params_read`)."""
    from rlhf.pipeline.config import ConfigError, effective
    from rlhf.pipeline.config import load_config as _load

    try:
        cfg = _load(params, section, fields)
    except ConfigError as exc:
        msg = str(exc)
        fail(msg if msg.startswith(str(params)) else f"{params}: {msg}")
    # a `fields` read is a namespace of those fields only: as effective() gives them (nested
    # sections as mappings, tuples as lists)
    values = effective(cfg) if fields is None else json.loads(json.dumps(
        {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v
         for k, v in vars(cfg).items()}))
    _READ[section] = {**_READ.get(section, {}), **values}
    return cfg


def judge_or_fail(params: Path, judge_model: Path | None = None) -> Any:
    """The judge the params file's `judge:` section names (pipeline/models/judges.py), its RM loaded
    from `judge_model` (a stage's --judge-model) where the kind needs one; a bad section or an
    RM that cannot load is one error line."""
    from rlhf.pipeline.models.judges import load_judge

    cfg = load_config(params, "judge")
    # the world's gold judge runs no model: the compute section is read for an RM judge only
    compute = None if cfg.kind == "world_gold" else compute_or_fail(params, "judge")
    try:
        return load_judge(cfg, judge_model, compute)
    except (ValueError, OSError) as exc:
        fail(str(exc))


def use_text_format(params: Path) -> None:
    """Render every prompt this command encodes in the params file's `text.prompt_format`
    (pipeline/models/text.py: a tokenizer's chat template, or the plain "Human: ... Assistant:")."""
    from rlhf.pipeline.models.text import use_prompt_format

    use_prompt_format(load_config(params, "text").prompt_format)


def tracking_or_fail(params: Path) -> Any:
    """The params file's `tracking:` section (pipeline/tracking.py), every tracker it names
    installed; a tracker that is not is one error line naming its pip package."""
    from rlhf.pipeline.tracking import check_installed

    cfg = load_config(params, "tracking")
    try:
        check_installed(cfg)
    except ValueError as exc:
        fail(str(exc))
    return cfg


def compute_or_fail(params: Path, stage: str) -> Any:
    """What `stage` runs its models on (pipeline/models/compute.py): the params file's `compute:`
    section, the stage's own entry merged, resolved on this machine; a device or dtype this
    machine cannot give is one error line."""
    from rlhf.pipeline.models.compute import ComputeError, resolve

    cfg = load_config(params, "compute")
    try:
        return resolve(cfg, stage)
    except ComputeError as exc:
        fail(f"{params}: {exc}")


def stage_setup(params: Path, stage: str,
                runs_models: Callable[[Any], bool] = lambda cfg: True) -> tuple[Any, Any]:
    """(cfg, compute): what every command that runs a model reads first, each problem one error
    line: its typed `stage` section, the prompt format every prompt it encodes is rendered in
    (`use_text_format`) and what it runs its models on (`compute_or_fail`). `runs_models(cfg)`
    False (a configuration that runs no model): compute is None and the `compute:` section is
    not read, so the report does not list it."""
    cfg = load_config(params, stage)
    use_text_format(params)
    return cfg, compute_or_fail(params, stage) if runs_models(cfg) else None


# What each stage's metrics file (artifacts/metrics/<stage>.json, `dvc metrics show`) holds: the
# few figures a user compares between experiments, as dotted paths into the stage's report.
# Everything else goes to the report file (artifacts/reports/<stage>.json). A figure a run did
# not compute (ppo.heldout without heldout_eval, the on-policy figures without onpolicy_k) is
# left out.
HEADLINES: dict[str, tuple[str, ...]] = {
    "world": ("sources.lines", "sources.clean_rows", "sources.defect_rows",
              "sources.unique_questions", "demonstrations.n", "demonstrations.gold_mean"),
    "ingest": ("input_rows", "kept", "rejected", "invariant_holds", "external_pairs"),
    "dedup": ("input_prompts", "kept", "similar", "clusters", "dedup_ratio", "invariant_holds"),
    "sft": ("train_loss", "eval_loss", "eval_perplexity", "gold_mean"),
    "preferences": ("n_prompts", "n_pairs", "n_pairs_heldout", "annotator_gold_agreement",
                    "mean_gold_policy", "mean_gold_demonstration",
                    "n_pairs_train", "n_pairs_gold", "invariant_holds"),  # the last 3: human labels
    "reward": ("heldout_accuracy_mean", "heldout_accuracy_vs_gold", "light_heldout_accuracy"),
    # `make report` (reports/dvc.yaml): the RMs' figures no later stage reads
    "reward_figures": tuple(f"spearman_{rm}_vs_gold_onpolicy{w}" for rm in ("light", "strong")
                            for w in ("", "_within_prompt"))
    + ("hack_agreement_light", "hack_agreement_strong", "spearman_strong_vs_gold",
       "spearman_light_vs_strong"),
    "difficulty": ("n_prompts", "mean_score", "bucket_counts", "corr_score_rm",
                   "sampler_full_coverage_share"),
    "route": ("n_held_out", "complexity.held_out_accuracy", "high_risk.held_out_accuracy",
              "high_risk.held_out.recall"),
    "ppo": ("ppo.step", "ppo.reward_mean", "ppo.kl_div_mean", "rollouts", "escalated_rollouts",
            "heldout.sft.gold_mean", "heldout.ppo.gold_mean", "heldout.gold_gain"),
    "demos": ("n_demonstrations", "tokenizer_vocab"),
    "judge": ("judge", "n_gold_pairs", "n_gold_prompts", "heldout_pair_accuracy"),
    "eval": ("eval.n_prompts", "eval.sft.gold_mean", "eval.final.step", "eval.final.gold_mean",
             "eval.final.win_rate", "eval.final.sqrt_kl", "eval.gold_gain"),
    "rollups": ("rollout_rows", "rows"),
}


# What one run of a stage took rather than what it made, as dotted paths into its report: the
# wall-clock figures, and for dedup how many texts it embedded against found in the embedding
# cache (a rerun in a checkout with a warm cache finds them all). None is a function of the
# stage's inputs. They stay in the dict the command prints, and write_metrics moves them out of
# the metrics and the report into <report>.timings.json (ignored by git, declared by no stage),
# so a rerun on unchanged inputs writes byte-identical versioned files and dvc.lock and
# `git status` stay clean. Speed figures live in bench/ (bench/light_rm.py).
TIMINGS: dict[str, tuple[str, ...]] = {
    "sft": ("train_seconds",),
    "reward": ("seconds", "phase_seconds", "light_train_seconds", "strong_train_seconds",
               "external.train_seconds"),
    "reward_figures": ("seconds", "phase_seconds", "light_seconds", "strong_seconds",
                       "speed_ratio"),
    "route": ("us_per_prompt", "us_per_single_prompt_call"),
    "dedup": ("embedded_new", "embedded_cached"),
    "rollups": ("seconds",),
}


def split_timings(stage: str, report: dict) -> tuple[dict, dict]:
    """(`report` without its `TIMINGS[stage]` figures, those figures nested as in the report);
    `report` itself is left as it is."""
    import copy

    rest, timings = copy.deepcopy(report), {}
    for key in TIMINGS.get(stage, ()):
        *parents, leaf = key.split(".")
        src, dst = rest, timings
        for p in parents:
            src = src.get(p) if isinstance(src, dict) else None
            dst = dst.setdefault(p, {})
        if isinstance(src, dict) and leaf in src:
            dst[leaf] = src.pop(leaf)
    return rest, _prune(timings)


def timings_path(report_path: Path | None) -> Path | None:
    """Where a stage's wall-clock figures go: beside its report, artifacts/reports/sft.json ->
    artifacts/reports/sft.timings.json (a file no DVC stage declares); none without a report."""
    return None if report_path is None else report_path.with_name(
        f"{report_path.stem}.timings.json")


def headline(stage: str, report: dict) -> dict:
    """The `HEADLINES[stage]` figures of `report`, nested as in the report."""
    out: dict = {}
    for key in HEADLINES[stage]:
        *parents, leaf = key.split(".")
        src, dst = report, out
        for p in parents:
            src = src.get(p) if isinstance(src, dict) else None
            dst = dst.setdefault(p, {})
        if isinstance(src, dict) and leaf in src:
            dst[leaf] = src[leaf]
    return _prune(out)


def _prune(d: dict) -> dict:
    return {k: (_prune(v) if isinstance(v, dict) else v) for k, v in d.items()
            if not (isinstance(v, dict) and not _prune(v))}


# Significant digits of every float a metrics or report file holds: float noise below them
# (summation order, a BLAS build) leaves the bytes, and so dvc.lock and `git status`, unchanged.
METRIC_DIGITS = 6


def _jsonable(x: Any) -> Any:
    """NaN / inf as null (JSON has neither), floats at `METRIC_DIGITS` significant digits,
    tuples as lists, numpy scalars as Python numbers, dates as ISO strings."""
    import datetime as dt
    import math

    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "item") and callable(x.item) and getattr(x, "shape", None) == ():
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, float):
        return float(f"{x:.{METRIC_DIGITS}g}")
    if isinstance(x, (dt.date, dt.datetime)):
        return x.isoformat()
    return x


def write_metrics(stage: str, report: dict, metrics: Path | None, report_path: Path | None) -> None:
    """The one writer of every command's outputs for DVC: the headline figures to `metrics`
    (`dvc metrics show`), the whole report to `report_path` with `params`, every value the
    command read from its params file (by section); each atomically, either optional.
    The report's wall-clock figures (`TIMINGS[stage]`) go to neither: they go to
    `timings_path(...)`, which no one versions. An unwritable path is one error line."""
    from rlhf.store.io import write_text_atomic

    read = {"params": params_read()} if _READ else {}
    full, timings = split_timings(stage, _jsonable({**report, **read}))
    outputs = [(metrics, headline(stage, full)), (report_path, full)]
    if timings and (where := timings_path(report_path)) is not None:
        outputs.append((where, timings))
    for path, data in outputs:
        if path is None:
            continue
        try:
            write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True,
                                               allow_nan=False) + "\n")
        except OSError as exc:
            fail(f"cannot write {path}: {exc}")


# The options every stage command shares (one help text each).
PARAMS = typer.Option(Path("params.yaml"), "--params", "-p",
                      help="Params file: the stage reads its section(s) from it, every key.")
METRICS = typer.Option(None, "--metrics", help="Write the headline figures here as JSON "
                       "(DVC metrics: artifacts/metrics/<stage>.json).")
REPORT = typer.Option(None, "--report", help="Write the whole report here as JSON "
                      "(artifacts/reports/<stage>.json).")
# the judge's RM for the stages that report a judge's figures (judge_or_fail)
JUDGE_MODEL = typer.Option(None, "--judge-model", help="The judge's RM folder (judge.kind "
                           "heldout_rm: what `rlhf judge` wrote; kind rm: overrides judge.model).")
