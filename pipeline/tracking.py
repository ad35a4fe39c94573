"""Experiment trackers of the training stages (sft, reward, ppo): params.yaml `tracking` names
them once for all three (`report_to`, as TRL's and transformers' `report_to`); each is
accelerate's tracker class (accelerate.tracking), started with the stage's params and the git
commit of the code, then given the stage's metrics step by step.

Each stage writes what a tracker keeps on disk (TensorBoard's events, wandb's run files) into
its `logs_dir`: a `tensorboard/` folder, which .dvcignore keeps out of every output's hash (the
PPO run folder's own `tensorboard/`, or `tensorboard/<stage>` beside a model folder).

    python -c "from rlhf.pipeline.tracking import PACKAGES; print(PACKAGES)"
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# tracker name -> the pip package that brings it (accelerate's tracker classes import it)
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow",
            "trackio": "trackio"}


@dataclass(frozen=True)
class TrackingConfig:
    """params.yaml `tracking`: where sft, reward and ppo report their metrics."""

    report_to: tuple[str, ...] = ("tensorboard",)  # tensorboard, wandb, mlflow, trackio; [none]: none
    project: str = "rlhf-pipeline"  # the wandb / trackio project, the MLflow experiment

    def __post_init__(self):
        unknown = [t for t in self.report_to if t not in PACKAGES and t != "none"]
        if unknown:
            raise ValueError(f"report_to: unknown tracker(s) {', '.join(unknown)}; "
                             f"choose from {', '.join(PACKAGES)} or none")
        if "none" in self.report_to and len(self.report_to) > 1:
            raise ValueError("report_to: `none` cannot be combined with a tracker")
        if not self.project:
            raise ValueError("project must not be empty")

    @property
    def trackers(self) -> tuple[str, ...]:
        return tuple(t for t in self.report_to if t != "none")


def check_installed(cfg: TrackingConfig) -> None:
    """A ValueError naming the pip package of the first tracker `cfg` names that is not
    installed (before any training, so a run never trains for nothing)."""
    module = {"tensorboard": "torch.utils.tensorboard"}
    for name in cfg.trackers:
        try:
            found = importlib.util.find_spec(module.get(name, name)) is not None
        except ImportError:  # torch.utils.tensorboard without the tensorboard package
            found = False
        if not found:
            raise ValueError(f"tracking.report_to names {name}, which is not installed: "
                             f"pip install {PACKAGES[name]}")


def logs_dir(model_folder: str | Path, stage: str) -> Path:
    """Where a stage that writes a model folder keeps its trackers' files:
    artifacts/models/sft -> artifacts/models/tensorboard/sft (the folder itself is swapped in
    whole when saved, and .dvcignore ignores `tensorboard/`)."""
    return Path(model_folder).parent / "tensorboard" / stage


def git_commit() -> dict[str, Any]:
    """The commit of the code that runs (`git_commit`, null outside a git checkout) and whether
    its work tree differs from it (`git_dirty`)."""
    where = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], check=True,
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(where), "status", "--porcelain",
                                "--untracked-files=no"], check=True, capture_output=True,
                               text=True, timeout=30).stdout.strip() != ""
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": None, "git_dirty": None}
    return {"git_commit": head, "git_dirty": dirty}


def flat_params(params: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested params as `section.key` scalars (what TensorBoard's hparams and MLflow's params
    take): lists and None as their JSON text."""
    out: dict[str, Any] = {}
    for k, v in params.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat_params(v, key + "."))
        else:
            out[key] = v if isinstance(v, (bool, int, float, str)) else json.dumps(v)
    return out


class Trackers:
    """The started trackers of one stage: `log(values, step)` to each, `finish()` at the end.
    Only the main process logs (a PPO run's other processes get an empty one)."""

    def __init__(self, trackers: list):
        self.trackers = trackers
        self.last_step = 0  # the step of the last values logged

    def log(self, values: dict[str, float], step: int) -> None:
        """The finite numbers of `values` at `step` (NaN: a figure the run did not compute;
        a report's lists and mappings are left to the report)."""
        self.last_step = step
        values = {k: v for k, v in values.items() if isinstance(v, (int, float))
                  and not isinstance(v, bool) and math.isfinite(v)}
        if not values:
            return
        for t in self.trackers:
            t.log(values, step=step)

    def log_history(self, prefix: str, history: list[dict], first_step: int = 1) -> None:
        """A training loop's log lines (each with its `step`, else numbered from `first_step`)
        as `prefix/<key>` series."""
        for i, line in enumerate(history):
            step = int(line.get("step", first_step + i))
            self.log({f"{prefix}/{k}": v for k, v in line.items() if k != "step"}, step)

    def finish(self) -> None:
        for t in self.trackers:
            t.finish()
        self.trackers = []


def start(cfg: TrackingConfig, stage: str, folder: str | Path, params: dict[str, Any],
          main: bool = True, **tensorboard_kwargs) -> Trackers:
    """The trackers `cfg` names, started for `stage` with `params` (by section) and the git
    commit as the run's configuration; `folder`: where they keep files (TensorBoard's events,
    wandb's `wandb/`, MLflow's artifacts unless MLFLOW_TRACKING_URI says otherwise);
    `tensorboard_kwargs` go to TensorBoard's SummaryWriter (PPO's `purge_step` on resume)."""
    if not main or not cfg.trackers:
        return Trackers([])
    check_installed(cfg)
    from accelerate.tracking import MLflowTracker, TensorBoardTracker, TrackioTracker, WandBTracker

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    make = {
        "tensorboard": lambda: TensorBoardTracker("", folder, **tensorboard_kwargs),
        "wandb": lambda: WandBTracker(cfg.project, name=stage, dir=str(folder),
                                      job_type=stage),
        "mlflow": lambda: MLflowTracker(cfg.project, str(folder), run_name=stage),
        "trackio": lambda: TrackioTracker(cfg.project, name=stage),
    }
    if set(cfg.trackers) - {"tensorboard"}:
        # accelerate's other trackers log through its logger, which refuses to run before an
        # accelerate state exists: `rlhf sft` starts them before TRL makes its Accelerator
        from accelerate import PartialState

        PartialState()
    config = {**flat_params(params), **git_commit(), "stage": stage}
    trackers = []
    for name in cfg.trackers:
        t = make[name]()
        t.start()
        t.store_init_configuration(config)
        trackers.append(t)
    return Trackers(trackers)
