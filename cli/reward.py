"""`rlhf reward | reward-figures`: the reward stage's command, the strong RM ensemble and the
light RM (pipeline/reward/), and the RMs' figures `make report` reads.

    rlhf reward --preferences artifacts/store/preferences --sft artifacts/models/sft \
        --pool artifacts/store/pool --out-strong artifacts/models/rm_strong \
        --out-light artifacts/models/rm_light
    rlhf reward-figures --strong artifacts/models/rm_strong --light artifacts/models/rm_light \
        --sft artifacts/models/sft --preferences artifacts/store/preferences   # make report
"""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rlhf.cli.common import (
    JUDGE_MODEL,
    METRICS,
    PARAMS,
    REPORT,
    add_plain_row,
    console,
    data_table,
    fail,
    fmt,
    judge_or_fail,
    load_config,
    need_dir,
    need_model,
    plain,
    pool_or_demos,
    print_table,
    stage_setup,
    tracking_or_fail,
    write_metrics,
)

# what a stage that samples as PPO does reads of the ppo section (generation.Sampling's fields)
SAMPLING_FIELDS = ("temperature", "top_p", "max_new_tokens")


def reward(
    preferences_dir: Path = typer.Option(..., "--preferences", help="`preferences` table folder."),
    sft_dir: Path = typer.Option(..., "--sft", help="SFT policy checkpoint (backbone, rollouts), "
                                 "or a hub name (org/name: its snapshot in the HF cache)."),
    out_strong: Path = typer.Option(..., "--out-strong", help="Strong RM ensemble folder."),
    out_light: Path = typer.Option(..., "--out-light", help="Light RM folder."),
    pool: Path | None = typer.Option(None, "--pool", help="`pool` table (ppo/eval prompts)."),
    demos: Path | None = typer.Option(None, "--demos", help="Without a pool: demonstrations."),
    judge_model: Path | None = JUDGE_MODEL,
    params: Path = PARAMS,
    metrics: Path | None = METRICS,
    report_path: Path | None = REPORT,
) -> None:
    """Train the strong RM ensemble, distil the light RM, report their quality."""
    from rlhf.pipeline.decode import Sampling
    from rlhf.pipeline.reward.stage import run

    cfg, compute = stage_setup(params, "reward")
    # how PPO will sample: the distribution the on-policy figures are measured on
    ppo_sampling = Sampling(**vars(load_config(params, "ppo", SAMPLING_FIELDS)))
    load_config(params, "judge")  # read up front: a bad judge section stops before any training
    tracking = tracking_or_fail(params)
    need_dir(preferences_dir, "--preferences")
    sft_dir = need_model("hub_policy", sft_dir, "--sft")
    if cfg.backbone != "sft" and Path(cfg.backbone).exists():  # a local folder, not a hub name
        need_model("pretrained", Path(cfg.backbone), "reward.backbone")
    pool = pool_or_demos(pool, demos)
    t0 = time.perf_counter()
    try:
        m = run(cfg, preferences_dir, sft_dir, out_strong, out_light, None, pool, demos,
                judge=judge_or_fail(params, judge_model),
                log=lambda msg: console.print(plain(msg, "dim")), ppo_sampling=ppo_sampling,
                tracking=tracking, compute=compute)
    except (OSError, ValueError) as exc:
        fail(f"reward failed: {exc}")
    write_metrics("reward", m, metrics, report_path)
    print_reward_report(m, time.perf_counter() - t0)


def print_reward_report(m: dict, seconds: float) -> None:
    print_table(f"reward  [{seconds:.0f}s]", [
        ("train / held-out pairs", f"{m['n_train_pairs']} / {m['n_heldout_pairs']}"),
        ("held-out pairwise accuracy (ensemble mean, vs annotators)", m["heldout_accuracy_mean"]),
        ("  worst-case (min) aggregation", m["heldout_accuracy_min"]),
        ("  members", ", ".join(fmt(x) for x in m["heldout_accuracy_members"])),
        ("held-out pairwise accuracy vs gold order", m["heldout_accuracy_vs_gold"]),
        ("annotators' own agreement with gold (held-out)",
         m["annotator_heldout_agreement_with_gold"]),
        ("light held-out accuracy vs annotators / gold",
         f"{fmt(m['light_heldout_accuracy'])} / {fmt(m['light_heldout_accuracy_vs_gold'])}"),
        ("confidence temperature", m["temperature"]),
        ("RMs vs gold on fresh and on-policy samples", "make report (rlhf reward-figures)"),
    ])
    t = data_table("held-out pairwise accuracy by confidence (calibrated, report half)",
                   [(c, {"justify": "right"}) for c in
                    ("confidence", "pairs", "share", "accuracy", "accuracy vs gold")])
    for a, g in zip(m["accuracy_by_confidence"], m["accuracy_by_confidence_vs_gold"]):
        # the bins read "[0.6, 0.8)": markup syntax, so they too go in verbatim
        add_plain_row(t, a["bin"], a["n"], fmt(a["share"]), fmt(a["accuracy"]),
                      fmt(g["accuracy"]))
    console.print(t)
    drift = m["annotator_drift"]["drift_per_day"]
    if drift:
        print_table("annotator drift: (label - gold) slope per day",
               [(k, v) for k, v in sorted(drift.items())])
    ext = m["external"]
    if "skipped" in ext:
        console.print(plain(f"external preferences: {ext['skipped']}", "yellow"))
    else:
        print_table("external human preferences (RM trained on the file's train split)", [
            (f"{src}: accuracy on {v['n_test_pairs']} test pairs ({v['n_train_pairs']} train)",
             v["accuracy"]) for src, v in ext.items() if isinstance(v, dict)] + [
            (f"{src}: task RM zero-shot", v["strong_rm_zero_shot_accuracy"])
            for src, v in ext.items() if isinstance(v, dict)])


def reward_figures(
    strong: Path = typer.Option(..., "--strong", help="Strong RM ensemble folder."),
    light: Path = typer.Option(..., "--light", help="Light RM folder."),
    sft_dir: Path = typer.Option(..., "--sft", help="SFT policy checkpoint (the samples), or a "
                                 "hub name (org/name: its snapshot in the HF cache)."),
    preferences_dir: Path = typer.Option(..., "--preferences",
                                         help="`preferences` table (the RMs' training prompts)."),
    pool: Path | None = typer.Option(None, "--pool", help="`pool` table (ppo/eval prompts)."),
    demos: Path | None = typer.Option(None, "--demos", help="Demonstrations (eval candidates)."),
    judge_model: Path | None = JUDGE_MODEL,
    params: Path = PARAMS,
    metrics: Path | None = METRICS,
    report_path: Path | None = REPORT,
) -> None:
    """The RMs' figures no later stage reads (`make report`): each RM vs gold on fresh and on
    PPO's own samples, light vs strong, the speed ratio, the hacked-twin probe."""
    from rlhf.pipeline.decode import Sampling
    from rlhf.pipeline.reward.figures import run

    cfg = load_config(params, "reward")
    ppo_sampling = Sampling(**vars(load_config(params, "ppo", SAMPLING_FIELDS)))
    need_model("scorer", strong, "--strong")
    need_model("scorer", light, "--light")
    sft_dir = need_model("hub_policy", sft_dir, "--sft")
    need_dir(preferences_dir, "--preferences")
    pool = pool_or_demos(pool, demos)
    t0 = time.perf_counter()
    try:
        m = run(cfg, strong, light, sft_dir, preferences_dir, pool, demos,
                judge=judge_or_fail(params, judge_model),
                log=lambda msg: console.print(plain(msg, "dim")), ppo_sampling=ppo_sampling)
    except (OSError, ValueError) as exc:
        fail(f"reward-figures failed: {exc}")
    write_metrics("reward_figures", m, metrics, report_path)
    print_table(f"reward figures  [{time.perf_counter() - t0:.0f}s]", [
        (f"Spearman strong RM vs gold, {m['n_fresh_samples']} samples of unseen prompts (>= 0.7)",
         m["spearman_strong_vs_gold"]),
        (f"  policy samples only ({m['n_fresh_policy_samples']}, gold mean "
         f"{fmt(m['gold_mean_fresh_policy'])})", m["spearman_strong_vs_gold_policy_only"]),
        ("  min aggregation", m["spearman_strong_min_vs_gold"]),
        ("Spearman light vs strong (>= 0.9)", m["spearman_light_vs_strong"]),
        *([(f"on PPO's distribution ({m['onpolicy']['n_prompts']} ppo prompts x "
            f"{m['onpolicy']['k']}): Spearman vs gold, strong overall / within a prompt",
            f"{fmt(m['spearman_strong_vs_gold_onpolicy'])} / "
            f"{fmt(m['spearman_strong_vs_gold_onpolicy_within_prompt'])}"),
           ("  light overall / within a prompt",
            f"{fmt(m['spearman_light_vs_gold_onpolicy'])} / "
            f"{fmt(m['spearman_light_vs_gold_onpolicy_within_prompt'])}")]
          if "onpolicy" in m else []),
        ("Spearman light vs gold", m["spearman_light_vs_gold"]),
        ("parameters strong (all members) / light",
         f"{m['strong_params']:,} / {m['light_params']:,}"),
        ("speed ratio light vs strong (>= 3)", m["speed_ratio"]),
        ("share of fresh samples passing the 0.6 gate", m["gate_pass_share"]),
        ("overfit flag (Spearman < 0.7)", m["overfit_flag"]),
    ])
