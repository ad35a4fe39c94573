"""`rlhf sft | preferences | reward | reward-figures | difficulty`: the policy, preference and
reward-model stages.

    rlhf sft --demos artifacts/world/demonstrations.jsonl --tokenizer artifacts/world/tokenizer \
        --model-config artifacts/world/model_config --out artifacts/models/sft
    rlhf preferences --pool artifacts/store/pool --policy artifacts/models/sft \
        --out artifacts/store/preferences
    rlhf reward --preferences artifacts/store/preferences --sft artifacts/models/sft \
        --pool artifacts/store/pool --out-strong artifacts/models/rm_strong \
        --out-light artifacts/models/rm_light
    rlhf reward-figures --strong artifacts/models/rm_strong --light artifacts/models/rm_light \
        --sft artifacts/models/sft --preferences artifacts/store/preferences   # make report
    rlhf difficulty --pool artifacts/store/pool --policy artifacts/models/sft \
        --reward-model artifacts/models/rm_strong --out artifacts/store/difficulty
    rlhf demos --store artifacts/store --out artifacts/demos          # realdata profile
    rlhf judge --preferences artifacts/store/preferences --out artifacts/models/judge
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rlhf.cli.common import (METRICS, PARAMS, REPORT, add_plain_row, compute_or_fail,
                              data_table, fail, judge_or_fail, load_config, plain,
                              tracking_or_fail, use_text_format,
                              write_metrics)

console = Console()
# what a stage that samples as PPO does reads of the ppo section (generation.Sampling's fields)
SAMPLING_FIELDS = ("temperature", "top_p", "max_new_tokens")


def _need_dir(path: Path | None, what: str) -> None:
    if path is not None and not path.is_dir():
        fail(f"{what} {path} is not a folder")


def _need_model(kind: str, path: Path | None, what: str) -> None:
    """Fail with one error line naming `path` unless it is a readable model folder of `kind`
    (policy, scorer, tokenizer, model_config): missing, truncated or the wrong kind."""
    from rlhf.pipeline.models import model_folders as mf

    checks = {"policy": mf.check_policy, "scorer": mf.check_scorer,
              "tokenizer": mf.check_tokenizer, "model_config": mf.check_model_config,
              "pretrained": mf.check_pretrained}
    if path is None:
        return
    try:
        checks[kind](path, what)
    except mf.ModelFolderError as exc:
        fail(str(exc))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if v is None:
        return "-"
    return str(v)


def _table(title: str, rows: list[tuple[str, Any]]) -> None:
    t = data_table(title, ["metric", ("value", {"justify": "right"})])  # paths shown verbatim
    for k, v in rows:
        add_plain_row(t, k, _fmt(v))
    console.print(t)




def sft(
    demos: Path = typer.Option(..., "--demos", help="demonstrations.jsonl (prompt, response)."),
    out: Path = typer.Option(..., "--out", "-o", help="Checkpoint folder (save_pretrained)."),
    tokenizer: Path | None = typer.Option(None, "--tokenizer",
                                          help="Tokenizer folder (embedded default)."),
    model_config: Path | None = typer.Option(None, "--model-config",
                                             help="model_config folder (embedded default)."),
    judge_model: Path | None = typer.Option(
        None, "--judge-model", help="The judge's RM folder (judge.kind heldout_rm)."),
    params: Path = PARAMS,
    metrics: Path | None = METRICS,
    report_path: Path | None = REPORT,
) -> None:
    """Supervised fine-tuning of the starting policy (TRL SFTTrainer)."""
    from rlhf.pipeline.sft import run

    cfg = load_config(params, "sft")
    use_text_format(params)
    load_config(params, "judge")  # read up front: a bad judge section stops before any training
    tracking = tracking_or_fail(params)
    compute = compute_or_fail(params, "sft")
    if not demos.is_file():
        fail(f"--demos {demos} is not a file")
    if not cfg.base_model:
        if tokenizer is None or model_config is None:
            fail("the embedded default (sft.base_model empty) needs --tokenizer and --model-config")
        _need_model("tokenizer", tokenizer, "--tokenizer")
        _need_model("model_config", model_config, "--model-config")
    elif Path(cfg.base_model).exists():  # a local folder (else a hub name, offline: an OSError)
        _need_model("policy", Path(cfg.base_model), "sft.base_model")
    t0 = time.perf_counter()
    try:
        m = run(cfg, demos, out, tokenizer, model_config, judge_or_fail(params, judge_model),
                tracking, compute)
    except (OSError, ValueError) as exc:
        fail(f"sft failed: {exc}")
    write_metrics("sft", m, metrics, report_path)
    _table(f"sft -> {out}  [{time.perf_counter() - t0:.0f}s]", [
        ("parameters", f"{m['n_params']:,}"), ("train demonstrations", m["n_train"]),
        ("held-out demonstrations", m["n_heldout"]), ("train loss", m["train_loss"]),
        ("held-out loss", m["eval_loss"]), ("held-out perplexity", m["eval_perplexity"]),
        (f"judge ({m['judge']}) mean of SFT samples", m["gold_mean"]),
        ("judge mean of the demonstrations", m["gold_mean_demonstrations"]),
    ])


def preferences(
    policy: Path | None = typer.Option(None, "--policy",
                                       help="SFT policy checkpoint (labels: annotators)."),
    out: Path = typer.Option(..., "--out", "-o", help="`preferences` table folder."),
    labels_from: Path | None = typer.Option(
        None, "--labels-from", help="labels: human: the store root (prompts, external_pairs, "
                                    "pool, similar) the human labels are read from."),
    queue: list[Path] = typer.Option(
        [], "--queue", help="labels: human: annotation-queue JSONL file(s) (format: docs/realdata.md)"
                            "; absent files are skipped with a note."),
    rejected_out: Path | None = typer.Option(
        None, "--rejected-out", help="labels: human: the `rejected_labels` table folder."),
    pool: Path | None = typer.Option(None, "--pool", help="`pool` table folder (reward split)."),
    demos: Path | None = typer.Option(None, "--demos",
                                      help="Without a pool: use the demonstrations' prompts."),
    realdata: Path | None = typer.Option(None, "--realdata",
                                         help="Real-data folder (hh-rlhf, OpenAssistant); an "
                                              "error when absent (omit it: none read)."),
    params: Path = PARAMS,
    metrics: Path | None = METRICS,
    report_path: Path | None = REPORT,
) -> None:
    """Sample k responses per reward-split prompt; the annotator pool ranks them (or, with
    preferences.labels: human, read the human labels and the annotation queue)."""
    from rlhf.pipeline.preferences import run

    cfg = load_config(params, "preferences")
    use_text_format(params)
    if cfg.labels == "human":
        return _human_preferences(cfg, labels_from, queue, out, rejected_out, metrics,
                                  report_path)
    compute = compute_or_fail(params, "preferences")  # human labels: no model runs
    if policy is None:
        fail("--policy is needed (preferences.labels: annotators)")
    _need_model("policy", policy, "--policy")
    if pool is None and demos is None:
        fail("give --pool or --demos")
    if pool is not None and not pool.is_dir() and demos is None:
        fail(f"--pool {pool} is not a folder (give --demos to use the demonstrations' prompts)")
    if realdata is not None:  # declared in dvc.yaml: absent is an error, not other bytes
        from rlhf.pipeline.preferences.external import missing_files

        if missing := missing_files(realdata, cfg):
            fail(f"--realdata {realdata}: {missing[0].name} not found there (the hh-rlhf and "
                 "OpenAssistant rankings this stage reads: docs/stages.md); omit --realdata to "
                 "build the table without them")
    t0 = time.perf_counter()
    try:
        m = run(cfg, policy, out, pool, demos, realdata, compute=compute)
    except (OSError, ValueError) as exc:
        fail(f"preferences failed: {exc}")
    write_metrics("preferences", m, metrics, report_path)
    _table(f"preferences -> {out}  [{time.perf_counter() - t0:.0f}s]", [
        ("prompts (" + m["prompt_source"] + ")", m["n_prompts"]),
        ("policy responses + demonstrations per prompt", f"{m['k']} + {m['demo_candidates']}"),
        ("gold mean: policy / demonstration responses",
         f"{_fmt(m['mean_gold_policy'])} / {_fmt(m['mean_gold_demonstration'])}"),
        ("distinct response share", m["distinct_response_share"]),
        ("rankings", m["n_rankings"]), ("pairs", m["n_pairs"]),
        ("held-out pairs", m["n_pairs_heldout"]), ("annotators", m["n_annotators"]),
        ("annotator order = gold order", m["annotator_gold_agreement"]),
        *[(f"external: {k}", v) for k, v in sorted(m["external"].items())],
        ("external pairs", m["n_external_pairs"]),
    ])


def _human_preferences(cfg, labels_from: Path | None, queue: list[Path], out: Path,
                       rejected_out: Path | None, metrics: Path | None,
                       report_path: Path | None) -> None:
    from rlhf.pipeline.preferences import run_human

    if labels_from is None or rejected_out is None:
        fail("preferences.labels: human needs --labels-from (the store root) and --rejected-out")
    _need_dir(labels_from, "--labels-from")
    present = []
    for q in queue:
        if q.is_file():
            present.append(q)
        else:
            console.print(plain(f"annotation queue {q} absent: skipped", "yellow"))
    t0 = time.perf_counter()
    try:
        m = run_human(cfg, labels_from, out, rejected_out, present)
    except (OSError, ValueError) as exc:
        fail(f"preferences failed: {exc}")
    write_metrics("preferences", m, metrics, report_path)
    _table(f"preferences (human labels) -> {out}  [{time.perf_counter() - t0:.0f}s]", [
        ("labelled prompts", m["n_prompts"]), ("rankings", m["n_rankings"]),
        ("pairs train / heldout / gold",
         f"{m['n_pairs_train']} / {m['n_pairs_heldout']} / {m['n_pairs_gold']}"),
        *[(f"{src}: input = kept + rejected", f"{c['input']} = {c['kept']} + {c['rejected']}")
          for src, c in m["labels_by_source"].items()],
        *[(f"rejected: {code}", n) for code, n in m["rejected_by_reason"].items()],
    ])


def _pool_or_demos(pool: Path | None, demos: Path | None) -> Path | None:
    """The pool folder to read, or None to fall back on --demos (an error if neither is usable)."""
    if pool is not None and not pool.is_dir():
        if demos is None:
            fail(f"--pool {pool} is not a folder")
        return None
    return pool


def reward(
    preferences_dir: Path = typer.Option(..., "--preferences", help="`preferences` table folder."),
    sft_dir: Path = typer.Option(..., "--sft", help="SFT policy checkpoint (backbone, rollouts)."),
    out_strong: Path = typer.Option(..., "--out-strong", help="Strong RM ensemble folder."),
    out_light: Path = typer.Option(..., "--out-light", help="Light RM folder."),
    pool: Path | None = typer.Option(None, "--pool", help="`pool` table (ppo/eval prompts)."),
    demos: Path | None = typer.Option(None, "--demos", help="Without a pool: demonstrations."),
    judge_model: Path | None = typer.Option(
        None, "--judge-model", help="The judge's RM folder for the vs-gold figures (judge.kind "
                                    "heldout_rm: what `rlhf judge` wrote)."),
    params: Path = PARAMS,
    metrics: Path | None = METRICS,
    report_path: Path | None = REPORT,
) -> None:
    """Train the strong RM ensemble, distil the light RM, report their quality."""
    from rlhf.pipeline.reward.stage import run

    from rlhf.pipeline.decode import Sampling

    cfg = load_config(params, "reward")
    use_text_format(params)
    # how PPO will sample: the distribution the on-policy figures are measured on
    ppo_sampling = Sampling(**vars(load_config(params, "ppo", SAMPLING_FIELDS)))
    load_config(params, "judge")  # read up front: a bad judge section stops before any training
    tracking = tracking_or_fail(params)
    compute = compute_or_fail(params, "reward")
    _need_dir(preferences_dir, "--preferences")
    _need_model("policy", sft_dir, "--sft")
    if cfg.backbone != "sft" and Path(cfg.backbone).exists():  # a local folder, not a hub name
        _need_model("pretrained", Path(cfg.backbone), "reward.backbone")
    pool = _pool_or_demos(pool, demos)
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
    _table(f"reward  [{seconds:.0f}s]", [
        ("train / held-out pairs", f"{m['n_train_pairs']} / {m['n_heldout_pairs']}"),
        ("held-out pairwise accuracy (ensemble mean, vs annotators)", m["heldout_accuracy_mean"]),
        ("  worst-case (min) aggregation", m["heldout_accuracy_min"]),
        ("  members", ", ".join(_fmt(x) for x in m["heldout_accuracy_members"])),
        ("held-out pairwise accuracy vs gold order", m["heldout_accuracy_vs_gold"]),
        ("annotators' own agreement with gold (held-out)",
         m["annotator_heldout_agreement_with_gold"]),
        ("light held-out accuracy vs annotators / gold",
         f"{_fmt(m['light_heldout_accuracy'])} / {_fmt(m['light_heldout_accuracy_vs_gold'])}"),
        ("confidence temperature", m["temperature"]),
        ("RMs vs gold on fresh and on-policy samples", "make report (rlhf reward-figures)"),
    ])
    t = data_table("held-out pairwise accuracy by confidence (calibrated, report half)",
                   [(c, {"justify": "right"}) for c in
                    ("confidence", "pairs", "share", "accuracy", "accuracy vs gold")])
    for a, g in zip(m["accuracy_by_confidence"], m["accuracy_by_confidence_vs_gold"]):
        # the bins read "[0.6, 0.8)": markup syntax, so they too go in verbatim
        add_plain_row(t, a["bin"], a["n"], _fmt(a["share"]), _fmt(a["accuracy"]),
                      _fmt(g["accuracy"]))
    console.print(t)
    drift = m["annotator_drift"]["drift_per_day"]
    if drift:
        _table("annotator drift: (label - gold) slope per day",
               [(k, v) for k, v in sorted(drift.items())])
    ext = m["external"]
    if "skipped" in ext:
        console.print(plain(f"external preferences: {ext['skipped']}", "yellow"))
    else:
        _table("external human preferences (RM trained on the file's train split)", [
            (f"{src}: accuracy on {v['n_test_pairs']} test pairs ({v['n_train_pairs']} train)",
             v["accuracy"]) for src, v in ext.items() if isinstance(v, dict)] + [
            (f"{src}: task RM zero-shot", v["strong_rm_zero_shot_accuracy"])
            for src, v in ext.items() if isinstance(v, dict)])


def reward_figures(
    strong: Path = typer.Option(..., "--strong", help="Strong RM ensemble folder."),
    light: Path = typer.Option(..., "--light", help="Light RM folder."),
    sft_dir: Path = typer.Option(..., "--sft", help="SFT policy checkpoint (the samples)."),
    preferences_dir: Path = typer.Option(..., "--preferences",
                                         help="`preferences` table (the RMs' training prompts)."),
    pool: Path | None = typer.Option(None, "--pool", help="`pool` table (ppo/eval prompts)."),
    demos: Path | None = typer.Option(None, "--demos", help="Demonstrations (eval candidates)."),
    judge_model: Path | None = typer.Option(
        None, "--judge-model", help="The judge's RM folder (judge.kind heldout_rm)."),
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
    _need_model("scorer", strong, "--strong")
    _need_model("scorer", light, "--light")
    _need_model("policy", sft_dir, "--sft")
    _need_dir(preferences_dir, "--preferences")
    pool = _pool_or_demos(pool, demos)
    t0 = time.perf_counter()
    try:
        m = run(cfg, strong, light, sft_dir, preferences_dir, pool, demos,
                judge=judge_or_fail(params, judge_model),
                log=lambda msg: console.print(plain(msg, "dim")), ppo_sampling=ppo_sampling)
    except (OSError, ValueError) as exc:
        fail(f"reward-figures failed: {exc}")
    write_metrics("reward_figures", m, metrics, report_path)
    _table(f"reward figures  [{time.perf_counter() - t0:.0f}s]", [
        (f"Spearman strong RM vs gold, {m['n_fresh_samples']} samples of unseen prompts (>= 0.7)",
         m["spearman_strong_vs_gold"]),
        (f"  policy samples only ({m['n_fresh_policy_samples']}, gold mean "
         f"{_fmt(m['gold_mean_fresh_policy'])})", m["spearman_strong_vs_gold_policy_only"]),
        ("  min aggregation", m["spearman_strong_min_vs_gold"]),
        ("Spearman light vs strong (>= 0.9)", m["spearman_light_vs_strong"]),
        *([(f"on PPO's distribution ({m['onpolicy']['n_prompts']} ppo prompts x "
            f"{m['onpolicy']['k']}): Spearman vs gold, strong overall / within a prompt",
            f"{_fmt(m['spearman_strong_vs_gold_onpolicy'])} / "
            f"{_fmt(m['spearman_strong_vs_gold_onpolicy_within_prompt'])}"),
           ("  light overall / within a prompt",
            f"{_fmt(m['spearman_light_vs_gold_onpolicy'])} / "
            f"{_fmt(m['spearman_light_vs_gold_onpolicy_within_prompt'])}")]
          if "onpolicy" in m else []),
        ("Spearman light vs gold", m["spearman_light_vs_gold"]),
        ("parameters strong (all members) / light",
         f"{m['strong_params']:,} / {m['light_params']:,}"),
        ("speed ratio light vs strong (>= 3)", m["speed_ratio"]),
        ("share of fresh samples passing the 0.6 gate", m["gate_pass_share"]),
        ("overfit flag (Spearman < 0.7)", m["overfit_flag"]),
    ])


def difficulty(
    policy: Path = typer.Option(..., "--policy", help="Baseline (SFT) policy checkpoint."),
    reward_model: Path = typer.Option(..., "--reward-model", help="RM scorer folder."),
    out: Path = typer.Option(..., "--out", "-o", help="`difficulty` table folder."),
    pool: Path | None = typer.Option(None, "--pool", help="`pool` table folder."),
    demos: Path | None = typer.Option(None, "--demos", help="Without a pool: demonstrations."),
    params: Path = PARAMS,
    metrics: Path | None = METRICS,
    report_path: Path | None = REPORT,
) -> None:
    """Difficulty 0-10 and bucket per pool prompt; checks the stratified sampler's coverage."""
    from rlhf.pipeline.difficulty import run

    cfg = load_config(params, "difficulty")
    use_text_format(params)
    compute = compute_or_fail(params, "difficulty")
    _need_model("policy", policy, "--policy")
    _need_model("scorer", reward_model, "--reward-model")
    pool = _pool_or_demos(pool, demos)
    if pool is None and demos is None:
        fail("give --pool or --demos")
    t0 = time.perf_counter()
    try:
        m = run(cfg, policy, reward_model, out, pool, demos, compute=compute)
    except (OSError, ValueError) as exc:
        fail(f"difficulty failed: {exc}")
    write_metrics("difficulty", m, metrics, report_path)
    _table(f"difficulty -> {out}  [{time.perf_counter() - t0:.0f}s]", [
        ("prompts (" + m["prompt_source"] + ")", m["n_prompts"]),
        *[(f"bucket {b}", n) for b, n in m["bucket_counts"].items()],
        ("topic clusters", m["n_topic_clusters"]), ("mean score", m["mean_score"]),
        ("corr(score, length)", m["corr_score_length"]),
        ("corr(score, logprob std)", m["corr_score_logprob_std"]),
        ("corr(score, RM score)", m["corr_score_rm"]),
        (f"batches of {m['sampler_batch_size']} covering every bucket and cluster",
         m["sampler_full_coverage_share"]),
    ])


def demos(
    store: Path = typer.Option(..., "--store", help="Store root (prompts, external_pairs, pool)."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder: demonstrations.jsonl, tokenizer/, "
                             "model_config/."),
    params: Path = PARAMS,
    metrics: Path | None = METRICS,
    report_path: Path | None = REPORT,
) -> None:
    """Demonstrations from human labels (+ a tiny tokenizer and model config) for SFT."""
    from rlhf.pipeline.demos import run

    cfg = load_config(params, "demos")
    _need_dir(store, "--store")
    try:
        m = run(cfg, store, out)
    except (OSError, ValueError) as exc:
        fail(f"demos failed: {exc}")
    write_metrics("demos", m, metrics, report_path)
    _table(f"demos -> {out}", [("demonstrations", m["n_demonstrations"]),
                               *[(f"  from {k}", v) for k, v in m["by_source"].items()],
                               ("tokenizer vocabulary", m["tokenizer_vocab"])])


def judge(
    preferences_dir: Path = typer.Option(..., "--preferences", help="`preferences` table folder."),
    out: Path = typer.Option(..., "--out", "-o", help="The held-out gold RM folder."),
    params: Path = PARAMS,
    metrics: Path | None = METRICS,
    report_path: Path | None = REPORT,
) -> None:
    """Train the held-out gold RM (judge.kind heldout_rm) on the `gold` split of the labels."""
    from rlhf.pipeline.models.judges import train_heldout_judge

    cfg = load_config(params, "judge")
    use_text_format(params)
    compute = compute_or_fail(params, "judge")
    _need_dir(preferences_dir, "--preferences")
    t0 = time.perf_counter()
    try:
        m = train_heldout_judge(cfg, preferences_dir, out, compute=compute)
    except (OSError, ValueError) as exc:
        fail(f"judge failed: {exc}")
    write_metrics("judge", m, metrics, report_path)
    _table(f"judge -> {out}  [{time.perf_counter() - t0:.0f}s]", [
        ("backbone", m["backbone"]), ("gold pairs (prompts)",
                                      f"{m['n_gold_pairs']} ({m['n_gold_prompts']})"),
        ("label sources", ", ".join(m["sources"])),
        (f"accuracy on the proxies' {m['n_heldout_pairs']} held-out pairs",
         m.get("heldout_pair_accuracy")),
    ])
