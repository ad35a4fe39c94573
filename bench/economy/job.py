"""One job: an arm x seed trained (our trainer, or a TRL peer), its checkpoints scored by the
judge on the held-out prompts, the result saved; or the SFT policy's gold (the point at 0 tokens).

    .venv/bin/python -m bench.economy --arms plain --seeds 0   # one job besides SFT's
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from .arms import ARMS, Arm, arm_config, reads
from .prepare import WORLD_JUDGE
from .results import REPO, base_of, save_result, spec_of

_JUDGES: dict = {}


def judge_of(setup: dict):
    """The setup's judge (loaded once per job process)."""
    from rlhf.pipeline.models.judges import load_judge

    j = setup.get("judge") or {}
    if "config" not in j or j["spec"] == WORLD_JUDGE:
        return None  # the world's gold judge (gold_eval's default)
    key = json.dumps(j["spec"], sort_keys=True)
    if key not in _JUDGES:
        _JUDGES[key] = load_judge(judge_config(setup), j.get("model"))
    return _JUDGES[key]


def judge_config(setup: dict):
    """The setup's `judge:` section as a JudgeConfig again (setup.json holds it as plain data)."""
    from rlhf.pipeline.models.judges import JudgeConfig
    from rlhf.pipeline.reward.train import RmTrainConfig

    cfg = dict(setup["judge"]["config"])
    return JudgeConfig(**{**cfg, "train": RmTrainConfig(**cfg["train"])})


def gold_of(policy_folder: Path, setup: dict) -> dict:
    """Held-out gold; with the setup's difficulty buckets also `by_bucket` (gold mean and count
    per bucket of the held-out prompts: is the hard tail learning too?)."""
    from rlhf.pipeline.decode import Sampling
    from rlhf.pipeline.ppo.heldout_gold import gold_eval

    e = setup["eval"]
    sampling = Sampling(e["temperature"], e["top_p"], e["max_new_tokens"])
    held = [tuple(p) for p in setup["held_out"]]
    g = gold_eval(policy_folder, held, sampling, e["seed"], judge=judge_of(setup),
                  per_prompt=True)
    scores = g.pop("scores")
    buckets = setup.get("held_out_buckets") or {}
    if buckets:
        by: dict[str, list[float]] = {}
        for (pid, _), x in zip(held, scores):
            if pid in buckets:
                by.setdefault(buckets[pid], []).append(x)
        g["by_bucket"] = {b: {"n": len(v), "gold_mean": round(sum(v) / len(v), 4)}
                          for b, v in sorted(by.items())}
    return g


def gold_of_weights(weights: Path, setup: dict, scratch: Path) -> dict:
    """Gold of the SFT architecture with a saved state_dict loaded into it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sft = setup["paths"]["sft"]
    model = AutoModelForCausalLM.from_pretrained(sft, dtype=torch.float32)
    model.load_state_dict(torch.load(weights, map_location="cpu"))
    shutil.rmtree(scratch, ignore_errors=True)
    model.save_pretrained(scratch)
    AutoTokenizer.from_pretrained(sft).save_pretrained(scratch)
    try:
        return gold_of(scratch, setup)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run_job(setup: dict, out: Path, arm_name: str, seed: int | None) -> dict:
    """Train one arm x seed (or evaluate SFT), evaluate its checkpoints, save the result."""
    from rlhf.pipeline.ppo.config import features_on

    if arm_name == "sft":
        t = time.perf_counter()
        g = gold_of(Path(setup["paths"]["sft"]), setup)
        res = {"arm": "sft", "gold": g, "seconds_eval": round(time.perf_counter() - t, 2),
               "spec": spec_of(setup, "sft")}
        return save_result(out, "sft", None, res, setup)
    arm = ARMS[arm_name]
    cfg = arm_config(base_of(setup, arm), arm, seed, setup["steps"], setup["points"], setup["token_budget"])
    work = out / "work" / arm_name / f"seed{seed}"
    shutil.rmtree(work, ignore_errors=True)
    paths = setup["paths"]
    stratified = bool(arm.stratified and paths.get("difficulty"))
    t = time.perf_counter()
    sample_economy = None
    if arm.trainer == "ppo":
        from rlhf.pipeline.ppo.trainer import run

        scheduled = getattr(cfg, "schedule_on", False)
        probe = None
        if cfg.prune_on or cfg.resample_on:  # the measurements (economy_sample.py)
            from .sample import Probe

            probe = Probe(work / "probe.jsonl")
        tiered = {}
        if any(reads(arm, k) for k in ("rm_strong", "routes")) or cfg.human_labels_per_step:
            tiered = tier_run_args(cfg, arm, paths, work, setup)
        inputs = {"strong_reward": setup["strong_reward"] if reads(arm, "rm_strong") else None,
                  **({"embeddings": paths["pool_embeddings"]} if scheduled else {}),
                  **tiered.pop("inputs", {})}
        run(cfg, paths["sft"], paths["rm_light"], paths["pool"], work, work / "rollouts",
            run_id=f"{arm_name}-seed{seed}", progress=False,
            difficulty=paths["difficulty"] if stratified else None, probe=probe, inputs=inputs,
            tables={**({"schedule": work / "schedule"} if scheduled else {}),
                    **tiered.pop("tables", {})}, **tiered)
        seconds_train = time.perf_counter() - t
        cum = {}
        for line in (work / "metrics.jsonl").read_text().splitlines():
            m = json.loads(line)
            cum[m["step"]] = m
        summary = json.loads((work / "summary.json").read_text())
        cost = {k[:-4]: v for k, v in summary["cost"].items() if k.endswith("_cum")}
        ckpts = [(int(d.name.split("-")[1]), d / "policy.pt")
                 for d in sorted((work / "checkpoints").glob("step-*"))]
        marks = [(step, cum[step]["tokens_generated_cum"], pt,
                  {k[:-4]: v for k, v in cum[step].items() if k.endswith("_cum")})
                 for step, pt in ckpts]
        if probe is not None:
            from .sample import summarize

            sample_economy = summarize(probe.path, cost)
    else:
        from rlhf.pipeline.samplers import load_prompts

        from .peers import train_peer

        peer = train_peer(arm.trainer, cfg, Path(paths["sft"]), Path(paths["rm_light"]),
                          load_prompts(Path(paths["pool"])), work, setup["token_budget"],
                          setup["peer_group"], **arm.peer)
        seconds_train = time.perf_counter() - t
        cost = peer["cost"]
        marks = [(c["step"], c["tokens_generated"], Path(c["folder"]) / "policy.pt",
                  c.get("cost", {})) for c in peer["checkpoints"]]
    t = time.perf_counter()
    points = []
    for step, tokens, pt, counts in marks:  # counts: the cumulative cost at that checkpoint
        g = gold_of_weights(pt, setup, work / "eval-policy")
        points.append({"step": step, "tokens": tokens, **g, "cost": counts})
    extra = {}
    if arm.trainer == "ppo" and getattr(cfg, "schedule_on", False):
        from .schedule import job_figures  # trigger rate, staleness, SFT by bucket

        extra["schedule"] = job_figures(work, f"{arm_name}-seed{seed}", cfg, setup, gold_of,
                                        judge_of(setup))
    if arm.trainer == "ppo" and (work / "rm_scores").is_dir():
        from .tiers import job_figures as tier_figures

        extra["tiers"] = tier_figures(work, f"{arm_name}-seed{seed}", setup, judge_of(setup))
    res = {"arm": arm_name, "seed": seed, "trainer": arm.trainer, **extra,
           "features_on": features_on(cfg) if arm.trainer == "ppo" else {},
           "stratified": stratified,
           "points": points, "cost": cost, "seconds_train": round(seconds_train, 2),
           **({"sample_economy": sample_economy} if sample_economy else {}),
           "seconds_eval": round(time.perf_counter() - t, 2), "spec": spec_of(setup, arm_name)}
    save_result(out, arm_name, seed, res, setup)
    if not os.environ.get("ECONOMY_KEEP_WORK"):
        shutil.rmtree(work, ignore_errors=True)
        for empty in (work.parent, work.parent.parent):  # what another job is using stays
            try:
                empty.rmdir()
            except OSError:
                break
    return res


def tier_run_args(cfg, arm: Arm, paths: dict, work: Path, setup: dict) -> dict:
    """`trainer.run` arguments of the arms: the routes, the human queue's pool (params'
    preferences section) and table, the `rm_scores` table the tier figures read, and the score
    map from the inputs (the strong RM folder itself is read in place, 263 MB)."""
    from rlhf.pipeline.config import load_config
    from rlhf.pipeline.ppo.features.inputs import annotator_pool

    out = {"rm_scores": work / "rm_scores", "inputs": {"score_map": paths.get("score_map")}}
    if reads(arm, "routes"):
        out["inputs"]["routes"] = paths["routes"]
    if cfg.human_labels_per_step or (cfg.rm_evolve_on and cfg.rm_label_source == "annotators"):
        params = Path(setup.get("params", REPO / "params.yaml"))
        out["inputs"]["annotators"] = annotator_pool(load_config(
            params, "preferences", ("annotators", "seed", "labels")))
        out["tables"] = {"human_labels": work / "human_labels"}
    return out

