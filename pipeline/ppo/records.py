"""What a PPO run leaves behind, step by step: metrics.jsonl (every metric but the wall-clock
ones, which go to timings.jsonl: wallclock.py), metrics.csv (the six seed 000 §4.4 metrics every
`csv_every` steps), TensorBoard and the other trackers params.yaml `tracking` names
(pipeline/tracking.py), events.jsonl, and the store rows (`rollouts`, `rm_scores`,
`train_metrics`, `checkpoints`) through store/rollouts.py's writer.

Only the main process writes; rows of every process are gathered first. A resumed run trims what
a killed run wrote after its last checkpoint (`truncate`), so no step is ever recorded twice.

    python -c "from rlhf.pipeline.ppo.records import CSV_COLUMNS; print(CSV_COLUMNS)"
"""

from __future__ import annotations

import csv
import json
import math
import shutil
from dataclasses import asdict
from pathlib import Path

from rlhf.pipeline.models.scoring import scorer_identity
from rlhf.pipeline.ppo import wallclock
from rlhf.pipeline.ppo.diagnostics import SUGGESTION_TEXT
from rlhf.store.hashing import content_hash, response_key
from rlhf.store.io import remove_partials, write_shard
from rlhf.store.rollouts import StepShardWriter, run_folder

# The six metrics of seed 000 §4.4, the one definition: metrics.csv column -> `train_metrics`
# column (store/schemas.py; the table keeps the seed's short names). The CSV, the store rows, the
# ppo stage's report and dvc.yaml's plot (tests/test_dvc_params.py checks it) all follow it.
SIX_METRICS = {"rollout_success_rate": "rollout_success", "reward_mean": "rew_mean",
               "reward_std": "rew_std", "kl_div_mean": "kl_div", "clip_ratio": "clip_ratio",
               "critic_loss": "critic_loss", "entropy_mean": "entropy"}
CSV_COLUMNS = ("step", *SIX_METRICS)
COST_COLUMNS = ("tokens_generated", "tokens_trained", "rollouts_started", "rollouts_trained",
                "light_rm_calls", "strong_rm_calls")  # train_metrics keeps their running sums


def draft_counts(r, key: str) -> list[int]:
    """Per row of `r`, its `extras[key]` ("drafted" / "accepted": generate.py) as an int; 0
    where a row has none (a Rollout assembled without the generation phase drafted nothing)."""
    values = r.extras.get(key) or [0] * len(r)
    return [int(v or 0) for v in values]


class Recorder:
    def __init__(self, cfg, paths, dist, scorer, strong_scorer=None, tracking=None):
        from rlhf.pipeline.tracking import TrackingConfig

        self.cfg, self.paths, self.dist = cfg, paths, dist
        self.tracking = tracking or TrackingConfig()  # params.yaml `tracking`
        self.main = dist.acc.is_main_process
        self.names = (scorer_identity(scorer),
                      scorer_identity(strong_scorer) if strong_scorer is not None else None)
        self.trackers = None  # TensorBoard and the other trackers `tracking` names
        self.tables: dict[str, StepShardWriter] = {}
        self.current_step = 0
        self._last_suggestions: set[str] = set()

    # ----------------------------------------------------------------- lifecycle
    def open(self, start: int, resume: bool) -> None:
        if not self.main:
            return
        from rlhf.pipeline import tracking
        from rlhf.pipeline.config import effective

        # purge_step: TensorBoard drops what a killed run logged after the checkpoint
        self.trackers = tracking.start(self.tracking, "ppo", self.paths.out / "tensorboard",
                                       {"ppo": effective(self.cfg)}, purge_step=start)
        # resume_after: drop the steps a killed run stored after its last checkpoint (they are
        # redone now), so no step is ever stored twice (store/rollouts.py)
        self.tables = {table: StepShardWriter(table, folder, self.paths.run_id,
                                              resume_after=start - 1 if resume else None)
                       for table, folder in self.paths.step_tables.items()}

    def flush(self) -> None:
        for w in self.tables.values():
            w.flush()

    def close(self) -> None:
        if self.main:
            for w in self.tables.values():
                w.close()
            if self.trackers is not None:
                self.trackers.finish()

    def reset(self) -> None:
        """A fresh start: nothing of an earlier run under this run id survives."""
        if not self.main:
            return
        for name in ("metrics.jsonl", "timings.jsonl", "metrics.csv", "events.jsonl",
                     "summary.json"):
            (self.paths.out / name).unlink(missing_ok=True)
        shutil.rmtree(self.paths.out / "tensorboard", ignore_errors=True)
        shutil.rmtree(self.paths.checkpoints, ignore_errors=True)
        for folder in self.paths.step_tables.values():
            shutil.rmtree(run_folder(folder, self.paths.run_id), ignore_errors=True)
        self.trim_checkpoint_rows(-1)
        self.paths.out.mkdir(parents=True, exist_ok=True)

    def truncate(self, step: int) -> None:
        """Remove the log lines a killed run wrote after checkpoint `step` (they are redone);
        its store rows are trimmed by the writers (resume_after) and partial shards removed."""
        for name, keep in (("metrics.jsonl", lambda m: m["step"] <= step),
                           ("timings.jsonl", lambda m: m["step"] <= step),
                           ("events.jsonl", lambda m: m.get("step", 0) <= step)):
            path = self.paths.out / name
            if path.exists():
                lines = [ln for ln in path.read_text().splitlines()
                         if ln.strip() and keep(json.loads(ln))]
                path.write_text("".join(ln + "\n" for ln in lines))
        path = self.paths.out / "metrics.csv"
        if path.exists():
            rows = path.read_text().splitlines()
            kept = rows[:1] + [r for r in rows[1:] if int(r.split(",")[0]) <= step]
            path.write_text("".join(r + "\n" for r in kept))
        self.trim_checkpoint_rows(step)
        for folder in self.paths.step_tables.values():
            for bucket in run_folder(folder, self.paths.run_id).glob("step_bucket=*"):
                remove_partials(bucket)  # a shard the kill interrupted (never visible)

    # ----------------------------------------------------------------- metrics (§4.4)
    def event(self, kind: str, **data) -> None:
        if self.main:
            data.setdefault("step", self.current_step)
            with open(self.paths.out / "events.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"event": kind, **data}, sort_keys=True) + "\n")

    def metrics(self, step: int, r, sched: dict, stats: dict, cost: dict) -> dict:
        """The step's metrics over every process; logged everywhere they go."""
        dist = self.dist
        valid = dist.gather(r.valid.float())
        all_valid = valid.bool()
        scores = dist.gather(r.scores)[all_valid]
        kl_seq = dist.gather(r.kl.sum(1))[all_valid]
        m = {
            "step": step,
            "rollout_success_rate": float(valid.mean()),
            "reward_mean": float(scores.mean()) if scores.numel() else float("nan"),
            "reward_std": float(scores.std()) if scores.numel() > 1 else 0.0,
            "kl_div_mean": float(kl_seq.mean()) if kl_seq.numel() else float("nan"),
            "clip_ratio": stats["clip_ratio"],
            "critic_loss": stats["critic_loss"],
            "entropy_mean": dist.global_mean(r.entropy, r.loss_mask),
            "policy_loss": stats["policy_loss"], "approx_kl": stats["approx_kl"],
            "grad_norm": stats["grad_norm"], "critic_kl_reg": stats["critic_kl_reg"],
            "nan_skipped": stats["nan_skipped"],
            "value_explained_variance": stats.get("value_explained_variance", math.nan),
            "value_rmse": stats.get("value_rmse", math.nan),
            "kl_coef": sched["kl_coef"], "clip_range": sched["clip_range"],
            "gae_lambda": sched["gae_lambda"], "batch_kl": sched["batch_kl"],
            "rm_refresh": sched["rm_refresh"],
            "response_len_mean": float(dist.gather(r.response_lengths.float()).mean()),
            **cost,
        }
        self._diagnosis(step, m, stats.get("grad_diagnosis"))
        if self.main:
            self.trackers.log({f"ppo/{k}": v for k, v in m.items()
                               if k != "step" and isinstance(v, float) and math.isfinite(v)},
                              step)
            kept, timings = wallclock.split(m)
            for name, line in (("metrics.jsonl", kept), ("timings.jsonl", timings)):
                with open(self.paths.out / name, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(line, sort_keys=True) + "\n")
            if step % self.cfg.csv_every == 0:
                self._csv_line(m)
                if "train_metrics" in self.tables:
                    self.tables["train_metrics"].write([self.train_metrics_row(m)])
        return m

    def _diagnosis(self, step: int, m: dict, diag: dict | None) -> None:
        if diag and diag["peak_log10"] is not None:
            m["grad_norm_peak_log10"] = diag["peak_log10"]
            m["grad_norm_bimodal"] = float(diag["bimodal"])
            for s in diag["suggestions"]:
                text = SUGGESTION_TEXT[s].format(shift=self.cfg.gradnorm_shift_decades)
                self.event("grad_norm_diagnosis", step=step, suggestion=s, message=text)
                # print when a suggestion appears, not on every step it persists (it is logged)
                if self.main and s not in self._last_suggestions:
                    import warnings

                    from rlhf.pipeline.ppo.diagnostics import GradNormDiagnosis

                    warnings.warn(f"step {step}: {text}", GradNormDiagnosis, stacklevel=3)
        self._last_suggestions = set(diag["suggestions"]) if diag else set()

    def train_metrics_row(self, m: dict) -> dict:
        """The CSV line's six metrics (seed 000 §4.4) and the run's cost so far as a
        `train_metrics` row; NaN (no update this step) is stored as null."""
        def value(key: str) -> float | None:
            v = m[key]
            return float(v) if v is not None and math.isfinite(v) else None

        return {"run_id": self.paths.run_id, "step": m["step"],
                **{col: value(key) for key, col in SIX_METRICS.items()},
                **{f"{k}_cum": m[f"{k}_cum"] for k in COST_COLUMNS},
                "seconds_cum": wallclock.measured(m["seconds_cum"]),
                "logged_at": wallclock.stamp(m["step"])}

    def _csv_line(self, m: dict) -> None:
        path = self.paths.out / "metrics.csv"
        new = not path.exists()
        with open(path, "a", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            if new:
                w.writerow(CSV_COLUMNS)
            w.writerow([m["step"]] + [f"{m[c]:.6g}" for c in CSV_COLUMNS[1:]])

    # ----------------------------------------------------------------- store rows
    def write_rows(self, step: int, tables: dict[str, list[dict]]) -> None:
        """A hook's rows of `step` for per-step tables this run records (others are dropped):
        computed alike on every process (the gates' decisions), so only the main one writes."""
        if not self.main:
            return
        for table, rows in tables.items():
            if table in self.tables and rows:
                self.tables[table].write([{"run_id": self.paths.run_id, **r} for r in rows])

    def rows(self, step: int, r) -> list[dict]:
        """This step's rollout (and RM-score) rows of every process, appended by the main
        process's writers; returns every process's rollout rows (what observers see).

        One writer per table and run, not per process: the store's shards hold whole steps (what
        lets a resumed run trim exactly the steps it redoes). The rows are small (hashes and
        scalars), so gathering them costs little next to the step itself."""
        rows = {"rollouts": self.rollout_rows(step, r)}
        if self.paths.rm_scores is not None:
            rows["rm_scores"] = self.rm_score_rows(step, r)
        gathered = self.dist.gather_objects(rows)
        rows = {t: [row for part in gathered for row in part[t]] for t in rows}
        if self.main:
            for table, table_rows in rows.items():
                self.tables[table].write(table_rows)
        return rows["rollouts"]

    def rollout_rows(self, step: int, r) -> list[dict]:
        now = wallclock.stamp(step)
        kl_seq = r.kl.sum(1).tolist()
        debug = self.cfg.debug_rollouts
        light, strong = self.names[0][0], self.names[1][0] if self.names[1] else None
        light_version = r.extras.get("rm_version", self.names[0][1])
        strong_version = self.names[1][1] if self.names[1] else None
        versions = r.extras.get("policy_version") or [None] * len(r)
        drafted, accepted = draft_counts(r, "drafted"), draft_counts(r, "accepted")
        return [{
            "run_id": self.paths.run_id, "step": step, "prompt_id": r.prompt_ids[i],
            "prompt_hash": content_hash(r.prompts[i]),
            "response_key": response_key(r.responses[i]),
            # a fallback or a dropped pruned sample earned no score: null, never a stub's
            "reward": float(r.scores[i]) if bool(r.valid[i]) else None,
            "scorer": ("gated" if "gated" in r.flags[i]
                       else "pruned" if not bool(r.valid[i]) and "pruned" in r.flags[i]
                       else "unscored" if "unscored" in r.flags[i]  # the reward declined it
                       else "fallback" if not bool(r.valid[i])
                       else "failure" if "pruned" in r.flags[i]
                       and self.cfg.prune_treatment == "failure"
                       else strong if bool(r.escalated[i]) else light),
            "tier": 2 if bool(r.escalated[i]) else 1, "prompt_tokens": int(r.query_mask[i].sum()),
            "response_tokens": int(r.response_mask[i].sum()),
            "generated_tokens": int(r.extras["generated_tokens"][i]), "kl": float(kl_seq[i]),
            # drafted tokens of the row's generation and how many were accepted (each step's
            # rows sum to its StepCost drafted_tokens / accepted_tokens; a replayed row: 0)
            "drafted": drafted[i], "accepted": accepted[i],
            "flags": r.flags[i], "created_at": now,
            # the policy that generated the row (a replayed row: an earlier one)
            "checkpoint_id": versions[i] or r.policy_version,
            # the RM (and its version: RM evolution swaps it; a reward function's or server's
            # spec) whose score this row's reward is, or that declined to score it
            "rm_version": (strong_version if bool(r.escalated[i])
                           else light_version if bool(r.valid[i]) or "gated" in r.flags[i]
                           or "unscored" in r.flags[i] else None),
            "prompt_text": r.prompts[i] if debug else None,
            "response_text": r.responses[i] if debug else None,
        } for i in range(len(r))]

    def rm_score_rows(self, step: int, r) -> list[dict]:
        """One row per RM score PPO uses: the light RM's for every valid rollout (a fallback has
        none) and, for an escalated one, also the strong RM's. `escalated` marks both rows of an
        escalated rollout; `queued`: the score's confidence is below its RM's gate, so the sample
        belongs in that RM's fine-tune queue (seed 000 §3.4)."""
        now = wallclock.stamp(step)
        light, strong = self.names
        rows = []
        if "rm_version" in r.extras:  # RM evolution: the version that scored this batch
            light = (light[0], r.extras["rm_version"], light[2])
        for i in range(len(r)):
            if not bool(r.valid[i]) and "gated" not in r.flags[i] or "replayed" in r.flags[i]:
                continue  # no score, or a replayed row's (written when it was scored)
            escalated = bool(r.escalated[i])
            scored = [(light, float(r.level1_scores[i]), float(r.level1_confidence[i]))]
            if escalated:
                scored.append((strong, float(r.scores[i]), float(r.confidence[i])))
            for (name, version, gate), score, conf in scored:
                rows.append({"run_id": self.paths.run_id, "step": step,
                             "prompt_id": r.prompt_ids[i],
                             "response_hash": content_hash(r.responses[i]), "rm_name": name,
                             "rm_version": version, "score": score, "confidence": conf,
                             "escalated": escalated, "queued": conf < gate, "scored_at": now})
        return rows

    # ----------------------------------------------------------------- the checkpoints table
    def record_checkpoint(self, step: int, folder: Path, parent: str | None, data_version: str,
                          only_if_missing: bool = False) -> None:
        """One row in the `checkpoints` table (run_id=<id>/step-NNNNNNNNN.parquet, atomic)."""
        table = self.paths.checkpoint_table
        if table is None or not self.main:
            return
        path = run_folder(table, self.paths.run_id) / f"step-{step:09d}.parquet"
        if only_if_missing and path.exists():
            return
        row = {"checkpoint_id": self.paths.checkpoint_id(step), "run_id": self.paths.run_id,
               "step": step, "parent_id": parent, "data_version": data_version,
               "params_hash": content_hash(json.dumps(asdict(self.cfg), sort_keys=True)),
               "path": str(folder), "created_at": wallclock.stamp(step)}
        write_shard("checkpoints", [row], path)

    def trim_checkpoint_rows(self, step: int) -> None:
        """Drop rows of checkpoints after `step` (a killed run may have recorded one whose
        `latest` pointer never moved) and of every step on a fresh start."""
        if self.paths.checkpoint_table is None:
            return
        folder = run_folder(self.paths.checkpoint_table, self.paths.run_id)
        for path in folder.glob("step-*.parquet"):
            if int(path.stem.split("-")[1]) > step:
                path.unlink()
        remove_partials(folder)
