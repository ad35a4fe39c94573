"""BENCHMARKS.md and its figure from the benchmark's saved results (never written by hand).

    .venv/bin/python -m bench.economy --report-only     # rewrites BENCHMARKS.md from the results

Reads <out>/setup.json and <out>/results/**.json; results whose spec (budget, inputs, eval) differs
from the current setup are left out and listed. The PPO-update comparison against TRL 1.12
(bench/ppo_update_vs_trl112.py) is added when its JSON is in <out>.
"""

from __future__ import annotations

import json
import math
import os
import platform
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from . import sample
from . import stats as st
from .figures import cost_figure, gold_figure

FIGURE = "economy_gold_vs_tokens.png"
COST_FIGURE = "economy_gold_vs_compute.png"
# the compute columns: (StepCost counter, column); every one counted, never timed
COMPUTE = (("tokens_generated", "generated tokens"), ("rollouts_started", "rollouts"),
           ("rollouts_replayed", "rollouts replayed"),
           ("tokens_trained", "tokens trained"), ("gen_forwards", "policy forwards (gen)"),
           ("gen_token_forwards", "policy token-fwd (gen)"),
           ("drafted_tokens", "drafted tokens"), ("accepted_tokens", "accepted drafts"),
           ("logprob_token_forwards", "policy token-fwd (old log-probs)"),
           ("update_token_forwards", "policy token-fwd (update)"),
           ("ref_token_forwards", "reference token-fwd"),
           ("critic_token_forwards", "critic token-fwd"),
           ("light_rm_calls", "light-RM calls"), ("light_rm_tokens", "light-RM tokens"),
           ("strong_rm_calls", "strong-RM calls"), ("strong_rm_tokens", "strong-RM tokens"),
           ("human_rm_calls", "human labels"),
           ("groups_dropped", "zero-variance groups dropped"),
           ("gen_batches_extra", "refill generations"))
TIMING = {"serial": "one job at a time on otherwise idle cores",
          "pairs": "arms interleaved in pairs on the same cores"}
UPDATE_JSON = "ppo_update_vs_trl112.json"


def machine() -> str:
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch
    import transformers
    import trl

    return (f"{os.cpu_count()} cores ({cpu}), torch {torch.__version__}, transformers "
            f"{transformers.__version__}, trl {trl.__version__}, Python "
            f"{platform.python_version()}, RLHF_TORCH_THREADS="
            f"{os.environ.get('RLHF_TORCH_THREADS', '1')} per job")


def collect(setup: dict, out: Path, arm_names: list[str], spec_of, spec_matches,
            seeds: list[int] | None = None, check_code: bool = False) -> tuple[dict, list[str]]:
    """{arm: [result per seed]} of the results matching the setup, and the stale ones (with
    why). `seeds`: only those seeds' files. `check_code`: a result must also have been made by
    a clean tree and by the code this commit has (`code_verdict`)."""
    runs: dict[str, list[dict]] = {}
    stale = []
    for arm in arm_names:
        paths = (sorted((out / "results" / arm).glob("seed*.json")) if seeds is None else
                 [out / "results" / arm / f"seed{k}.json" for k in seeds])
        for path in paths:
            if not path.exists():
                stale.append(f"{path.relative_to(out)} (missing)")
                continue
            res = json.loads(path.read_text())
            why = None if spec_matches(res.get("spec"), spec_of(setup, arm)) else \
                "budget or inputs differ from this setup"
            if why is None and check_code:
                why = code_verdict(res, setup, arm)
            if why is None:
                runs.setdefault(arm, []).append(res)
            else:
                stale.append(f"{path.relative_to(out)} ({why})")
    return runs, stale


def code_verdict(res: dict, setup: dict, arm: str) -> str | None:
    """None when `res` was made by a clean tree running the very files this commit has for
    `arm` (its commit may be an older one: DVC's cache keeps a result whose deps did not
    change); else why it is refused."""
    from .results import committed_ids, job_code

    prov = res.get("provenance")
    if not prov:
        return "no provenance: made before results recorded their code"
    if prov["dirty"]:
        return (f"made from a dirty tree at {prov['commit'][:7]}: "
                + ", ".join(prov["dirty"][:3]) + (" ..." if len(prov["dirty"]) > 3 else ""))
    # a folder an arm runs (pipeline/decode/) as the files under it, as provenance records it
    code = committed_files(job_code(setup, arm))
    if sorted(prov["deps"]) != code:
        return f"made at {prov['commit'][:7]} by a different set of files"
    head = committed_ids(code)
    changed = [p for p in code if head.get(p) != prov["deps"][p]]
    if changed:
        return (f"made at {prov['commit'][:7]}; changed since: " + ", ".join(changed[:3])
                + (" ..." if len(changed) > 3 else ""))
    return None


def committed_files(paths: list[str]) -> list[str]:
    """The files HEAD has under `paths`, sorted: a file as itself, a folder as its files."""
    import subprocess

    from . import results

    proc = subprocess.run(["git", "ls-tree", "-r", "--name-only", "HEAD", "--", *paths],
                          cwd=results.REPO, capture_output=True, text=True, check=False)
    return sorted(proc.stdout.splitlines())


def stamp(setup: dict, arm_names: list[str]) -> tuple[str, list[str]]:
    """The commit this report is made at and the files (of the report's code and every arm's)
    that differ from it on disk: a report from a dirty tree says so in its first lines."""
    from .dvc_stages import REPORT_CODE
    from .results import job_code, provenance

    files = set(REPORT_CODE) | {"bench/economy/dvc_stages.py", "bench/params.yaml",
                                "bench/dvc.yaml"}
    for a in ["sft", *arm_names]:
        files |= set(job_code(setup, a))
    prov = provenance(sorted(files))
    return prov["commit"], prov["dirty"]


def _fmt(x: float, digits: int = 3, sign: bool = False) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def _ratio(r: dict) -> str:
    if not math.isfinite(r["tokens_arm"]):
        return "not reached"
    if not math.isfinite(r["ratio"]):
        return "n/a (target ≤ SFT)"
    hi = "∞" if not math.isfinite(r["ci_high"]) else f"{r['ci_high']:.2f}"
    return f"{r['ratio']:.2f} [{r['ci_low']:.2f}, {hi}]"


def header(setup: dict, arm_names: list[str], command: str, dvc: bool) -> list[str]:
    """The report's first lines: the command, machine, date, commit (the DVC stages), the budget,
    the judge and the inputs' hashes."""
    lines = ["# Benchmarks", "",
             ("<!-- generated by bench/economy from its saved results: rerun it, never edit "
             "by hand -->"), "",
             "## Rollout economy: held-out gold against generated tokens", "",
             f"- command (this report): `{command}`",
             f"- machine: {machine()}",
             f"- date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}"
             + (" (--quick: tiny untrained world, harness check only)" if setup["quick"] else ""),
             ]
    if dvc:
        commit, dirty = stamp(setup, arm_names)
        lines.insert(6, f"- commit: `{commit}`, " + (
            "clean tree (every file the report and its arms run is as committed)" if not dirty
            else "**DIRTY TREE** (these files differ from the commit: "
            + ", ".join(f"`{d}`" for d in dirty) + ")") + "; every result below ran this "
            "commit's code for its arm (others are listed at the end as stale, never merged)")
    base = setup.get("budget_config") or setup["base_config"]  # before budget_config: the whole
    e = setup["eval"]
    group = setup.get("peer_group", 4)
    lines.append(
        f"- budget per run: {setup['steps']} steps x {base['batch_size']} rollouts (max "
        f"{base['max_new_tokens']} new tokens, temperature {base['temperature']}, top-p "
        f"{base['top_p']}), at most {setup['token_budget']:,} generated tokens; gold "
        f"checkpoints every {max(1, setup['steps'] // setup['points'])} steps (peers: "
        f"generation batches of {base['batch_size']} = {base['batch_size'] // group} prompts "
        f"x {group})")
    judge = setup.get("judge", {}).get("spec", {}).get("name", "world_gold")
    who = "the world's gold judge" if judge == "world_gold" else f"the judge `{judge}`"
    lines.append(f"- held-out gold: {who} on {e['n_prompts']} eval-split "
                 f"prompts, one sample each, sampled as PPO samples (max {e['max_new_tokens']} new "
                 f"tokens, temperature {e['temperature']}, top-p {e['top_p']}, seed {e['seed']}, "
                 "the same for every policy)")
    lines.append("- inputs: " + ", ".join(f"{k} `{v}`" for k, v in setup["hashes"].items()))
    return lines


def efficiency_table(runs: dict, curves: dict, grid, at: tuple[int, int], sft_gold: float,
                     baseline: str) -> list[str]:
    """The sample-efficiency table: each arm's gold at equal tokens (grid index `at[0]`) and at
    half of them (`at[1]`), its gain over SFT and its tokens to `baseline`'s gold."""
    lines = ["### Sample efficiency", "",
             ("| arm | trainer | seeds | gold at equal tokens | gain over SFT ± SE | "
              "gain per seed | learns | gain at ½ tokens | tokens to target: ratio [95 % CI] "
              "| to 95 % of target | last checkpoint: gold (Δ on the one before) |"),
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    i_eq, i_half = at
    base_c = curves[baseline]
    for a, rs in runs.items():
        c = curves[a]
        gains = [float(x - sft_gold) for x in c[:, i_eq]]
        g = st.gain_stats(gains)
        half = float(np.nanmean(c[:, i_half]) - sft_gold)
        r100 = st.ratio_with_interval(grid, base_c, c, i_eq, 1.0)
        r95 = st.ratio_with_interval(grid, base_c, c, i_eq, 0.95)
        ratio = ("1 (baseline)" if a == baseline else _ratio(r100))
        ratio95 = ("1 (baseline)" if a == baseline else _ratio(r95))
        if a == baseline:
            ratio += f"; {_fmt(r100['tokens_base'], 0)} tokens"
            ratio95 += f"; {_fmt(r95['tokens_base'], 0)} tokens"
        lines.append(
            f"| {a} | {rs[0]['trainer']} | {len(rs)} | {np.nanmean(c[:, i_eq]):.4f} | "
            f"{_fmt(g['mean'], 3, True)} ± {_fmt(g['se'])} | "
            f"{', '.join(_fmt(x, 3, True) for x in g['gains'])} | {g['learns']} | "
            f"{_fmt(half, 3, True)} | {ratio} | {ratio95} | {last_point(rs)} |")
    return lines


def write_report(setup: dict, out: Path, report: Path, arm_names: list[str], baseline: str,
                 command: str, arms: dict, seeds: list[int] | None = None,
                 figures: Path | None = None, timing: str = "none") -> None:
    """The report. With `seeds` (the DVC report stages) it stamps one commit: a result is
    merged only when made by a clean tree with this commit's code for its arm (else listed as
    stale); seconds are compared only under a `timing` protocol (serial | pairs)."""
    from .results import spec_matches, spec_of

    sft_path = out / "results" / "sft.json"
    sft = json.loads(sft_path.read_text()) if sft_path.exists() else None
    dvc = seeds is not None
    if dvc and sft is not None and code_verdict(sft, setup, "sft") is not None:
        sft = None
    runs, stale = collect(setup, out, arm_names, spec_of, spec_matches, seeds, check_code=dvc)
    # the repo's BENCHMARKS.md keeps its figure in bench/figures/; anywhere else, beside it
    if figures is not None:
        figure = figures / FIGURE
    else:
        figure = report.parent / (FIGURE if report.resolve().parent != Path(
            __file__).resolve().parents[2] else f"bench/figures/{FIGURE}")
    lines = header(setup, arm_names, command, dvc)
    if sft is None or not runs.get(baseline):
        lines += ["", f"No results yet for SFT and the `{baseline}` arm: run the arms first.", ""]
        _write(report, lines, stale)
        return
    sft_gold = sft["gold"]["gold_mean"]
    ran = sorted({r.get("command") for rs in runs.values() for r in rs} - {None, "", command})
    if ran:
        lines.append("- the runs themselves came from: " + "; ".join(f"`{c}`" for c in ran))
    commits = sorted({r.get("code", "?") for rs in runs.values() for r in rs})
    if dvc:
        made = sorted({(r.get("provenance") or {}).get("commit", "?")[:7]
                       for rs in runs.values() for r in rs})
        lines.append(f"- results made at: {', '.join(f'`{c}`' for c in made)} (DVC's cache "
                     "keeps a result while the files its arm runs are unchanged)")
    else:
        lines.append(f"- code: {', '.join(f'`{c}`' for c in commits)} (git commit of each run)")
    lines.append(f"- SFT gold (0 tokens): {sft_gold:.4f} (std {sft['gold']['gold_std']:.3f})")

    def points(res):
        return [(0, sft_gold)] + [(p["tokens"], p["gold_mean"]) for p in res["points"]]

    finals = {a: [r["points"][-1]["tokens"] for r in rs] for a, rs in runs.items()}
    t_eq = min(min(min(v) for v in finals.values()), setup["token_budget"])
    t_max = max(max(v) for v in finals.values())
    grid = np.unique(np.concatenate([np.linspace(0, t_max, 401), [t_eq, t_eq / 2]]))
    i_eq, i_half = int(np.searchsorted(grid, t_eq)), int(np.searchsorted(grid, t_eq / 2))
    curves = {a: np.array([st.curve(points(r), grid) for r in rs]) for a, rs in runs.items()}
    base_c = curves[baseline]
    lines.append(f"- compared at equal tokens: {t_eq:,.0f} (the fewest any run generated, at most the "
                 "budget); "
                 f"target = `{baseline}`'s mean gold there: "
                 f"{st.mean_curve(base_c)[i_eq]:.4f}")
    link = os.path.relpath(figure, report.parent)
    lines += ["", f"![held-out gold against generated tokens]({link})", ""]
    lines += efficiency_table(runs, curves, grid, (i_eq, i_half), sft_gold, baseline)
    lines += cost_section(runs, arms, timing)
    lines += ["", ("How to read it: gold is interpolated linearly between a run's checkpoints "
              "(SFT at 0 tokens) on cumulative generated tokens, every token the policy sampled "
              "counted; *tokens to target* is the first token count at which an arm's mean curve "
              f"reaches `{baseline}`'s mean gold at equal tokens (and 95 % of it), over what "
              f"`{baseline}` itself needs; the interval resamples the seeds of both arms "
              "(2,000 bootstrap draws). *learns*: the mean gain over SFT at equal "
              f"tokens is at least {st.LEARNS_SE:g} standard errors above 0 and every seed's "
              "gain is positive. *gain at ½ tokens* shows whether the curve still rises (with the "
              "default `--steps`, twice `ppo.total_steps`, ½ is about the `make run` "
              "budget). *last checkpoint*: mean gold at each run's last checkpoint and its "
              "change on the checkpoint before (± SE over seeds; *rising* when the change is "
              "more than 2 SE above 0)."), ""]
    lines += sample.section(runs, sft_gold, baseline)  # pruning / resampling
    gold_figure(figure, grid, curves, sft_gold, float(st.mean_curve(base_c)[i_eq]), t_eq, baseline)
    axes = cost_figure(figure.with_name(COST_FIGURE), runs, sft_gold, baseline)
    if axes:
        lines += [(f"![held-out gold against each cost axis]"
                   f"({os.path.relpath(figure.with_name(COST_FIGURE), report.parent)})"), "",
                  "Gold against each cost axis (" + ", ".join(axes) + "): the mean curve over "
                  "seeds, interpolated between checkpoints as above.", ""]
    lines += verdict_section(runs, curves, i_eq, baseline)
    lines += family_section(runs, curves, i_eq, sft_gold)
    from .schedule import report_section as schedule_section

    lines += schedule_section(runs, baseline)
    from .tiers import report_section as tiers_section

    lines += tiers_section(runs, baseline)
    lines += _update_section(out)
    _write(report, lines, stale)


def last_point(rs: list[dict]) -> str:
    """The runs' last checkpoint: mean gold, and its change on the checkpoint before (mean ±
    SE over seeds): is the arm still rising at the budget?"""
    last = [r["points"][-1]["gold_mean"] for r in rs]
    deltas = [r["points"][-1]["gold_mean"] - r["points"][-2]["gold_mean"]
              for r in rs if len(r["points"]) > 1]
    if not deltas:
        return f"{np.mean(last):.4f}"
    g = st.gain_stats(deltas)
    word = ("rising" if g["n"] > 1 and g["mean"] > 2 * g["se"] else
            "flat or noisy" if g["n"] > 1 else "")
    return (f"{np.mean(last):.4f} ({_fmt(g['mean'], 3, True)}"
            + (f" ± {_fmt(g['se'])}" if g["n"] > 1 else "") + (f"; {word}" if word else "") + ")")


def _mean(rs: list[dict], key: str) -> str:
    vals = [r["cost"].get(key) for r in rs if r["cost"].get(key) is not None]
    return f"{sum(vals) / len(vals):,.0f}" if vals else "–"


def cost_section(runs: dict, arms: dict, timing: str) -> list[str]:
    """What each arm paid, in counts (StepCost's counters; the same for any machine load), and
    seconds only under a timing protocol, labelled with it."""
    cols = [(k, c) for k, c in COMPUTE if any(r["cost"].get(k) for rs in runs.values()
                                               for r in rs) or k == "tokens_generated"]
    lines = ["", "### Cost per run (mean over seeds): compute, counted", "",
             "| arm | switches on (vs plain PPO) | " + " | ".join(c for _, c in cols) + " |",
             "|---|---|" + "---|" * len(cols)]
    for a, rs in runs.items():
        feats = rs[0].get("features_on") or {}
        extra = arms[a].overrides if a in arms else {}
        peer = arms[a].peer if a in arms and getattr(arms[a], "peer", None) else {}
        on = ", ".join(f"{k}={v}" for k, v in {**feats, **extra, **peer}.items()) or "none"
        if rs[0].get("stratified"):
            on += "; stratified batches (difficulty table)"
        lines.append(f"| {a} | {on} | " + " | ".join(_mean(rs, k) for k, _ in cols) + " |")
    lines += ["", ("A token-forward is one token position through a model, padding included; "
              "a forward is one sequential call. Our trainer counts them where it spends them "
              "(StepCost); the TRL peers' are counted from the shapes TRL pads a generation "
              "batch to (bench/economy/peers.py). A column no arm spends on is left out."), ""]
    if timing in TIMING:
        lines += [f"### Wall seconds under the timing protocol `{timing}` ({TIMING[timing]})",
                  "", "| arm | train s: median [min, max] over seeds | eval s: median |",
                  "|---|---|---|"]
        for a, rs in runs.items():
            t = [r["seconds_train"] for r in rs]
            e = [r["seconds_eval"] for r in rs]
            lines.append(f"| {a} | {np.median(t):.0f} [{min(t):.0f}, {max(t):.0f}] | "
                         f"{np.median(e):.0f} |")
        lines.append("")
    else:
        lines += [("No seconds comparison: these runs made no timing protocol (bench/params.yaml "
                  "`economy.timing: none`), so their seconds measure the machine's load as much "
                  "as the arm; each result keeps its own seconds."), ""]
    return lines


GEN_COMPUTE = ("gen_token_forwards", "logprob_token_forwards")


def generation_compute(rs: list[dict]) -> float | None:
    """Mean policy token-forwards in generation plus the old-log-prob pass, per run."""
    vals = [sum(r["cost"].get(k) or 0 for k in GEN_COMPUTE) for r in rs
            if r["cost"].get(GEN_COMPUTE[0])]
    return sum(vals) / len(vals) if vals else None


def engine_of(rs: list[dict]) -> str:
    """The rollout engine an arm's runs sampled with: hf unless its switches say otherwise; the
    TRL peers sample with TRL's own generation."""
    if not rs or "features_on" not in rs[0]:
        return "–"
    if rs[0].get("trainer", "ppo") != "ppo":
        return "trl"
    return str((rs[0]["features_on"] or {}).get("engine", "hf"))


SAME_ENGINE = "engine_native"  # plain PPO on the native engine: the switch arms' reference


def _against(runs: dict, curves: dict, i_eq: int, arm: str, ref: str) -> list[str]:
    """`arm` against `ref`: [gold at equal tokens minus ref's [95 % CI], generation compute /
    ref's, verdict (stats.verdict)]."""
    d, lo, hi = st.difference_interval([float(x) for x in curves[ref][:, i_eq]],
                                       [float(x) for x in curves[arm][:, i_eq]])
    mine, theirs = generation_compute(runs[arm]), generation_compute(runs[ref])
    ratio = mine / theirs if mine is not None and theirs else None
    return [f"{_fmt(d, 3, True)} [{_fmt(lo, 3, True)}, {_fmt(hi, 3, True)}]",
            "–" if ratio is None else f"{ratio:.2f}", st.verdict(lo, hi, ratio)]


def verdict_section(runs: dict, curves: dict, i_eq: int, baseline: str) -> list[str]:
    """Each arm's verdict, from the figures above (stats.verdict): pages quote this
    table instead of typing a verdict. A switch arm on the native engine is judged against
    `engine_native` (the same engine), so its verdict is the switch's and not the engine's;
    `engine_native` itself and arms on another engine (the TRL peers) against `baseline`. Every
    arm also gets the headline columns against `baseline` (plain PPO on hf): what the product,
    engine and switch together, gives."""
    same = SAME_ENGINE if SAME_ENGINE in runs else None
    rows = []
    for a, rs in runs.items():
        if a == baseline:
            continue
        ref = same if same and a != same and engine_of(rs) == "native" else baseline
        # the headline against the baseline; ″ where the verdict's reference is the baseline
        head = (["″", "″"] if ref == baseline
                else _against(runs, curves, i_eq, a, baseline)[:2])
        cells = [a, engine_of(rs), f"`{ref}`", *_against(runs, curves, i_eq, a, ref), *head]
        rows.append("| " + " | ".join(cells) + " |")
    return ["### Verdicts (generated from the tables above)", "",
            ("| arm | engine | verdict against | gold at equal tokens minus the reference's "
             "[95 % CI] | generation compute / the reference's | verdict | headline: gold minus "
             f"`{baseline}`'s (hf) [95 % CI] | headline: generation compute / `{baseline}`'s |"),
            "|---|---|---|---|---|---|---|---|", *rows, "",
            ("Which comparison each column is: the first three figures and the verdict compare "
             f"the arm with the arm named under *verdict against*: `{SAME_ENGINE}` (plain PPO on "
             "the native engine) for an arm that samples with the native engine, so the "
             "verdict is what its switch buys on the same engine and the engine's own saving "
             f"is not counted as the switch's; `{baseline}` (plain PPO on hf) for "
             f"`{SAME_ENGINE}` itself (the engine's verdict) and for arms on another engine "
             "(the TRL peers sample with TRL's own generation). The two *headline* columns "
             f"compare every arm with `{baseline}` on hf: what the product, engine and switch "
             "together, gives over plain PPO (″: the same as the verdict's columns). "
             "Generation compute: policy token-forwards in generation plus the old-log-prob "
             f"pass, mean per run. *Saves compute*: gold within the reference's interval for at "
             f"most {st.SAVES:g}x its generation compute. The TRL peers count theirs from the "
             "shapes TRL pads a batch to. *Engine*: the rollout engine the arm sampled with "
             f"(`{baseline}` runs on hf)."), ""]


def family_section(runs: dict, curves: dict, i_eq: int, sft_gold: float) -> list[str]:
    """The best arm of each rollout-economy family here (mean gold at equal tokens): what
    `make bench`'s headline (bench/params.yaml) should run of each."""
    from .arms import FAMILIES

    rows = []
    for fam, members in FAMILIES.items():
        have = [(float(np.nanmean(curves[a][:, i_eq])), a) for a in members if a in curves]
        if have:
            g, a = max(have)
            rows.append(f"| {fam} | {a} | {g:.4f} | {_fmt(g - sft_gold, 3, True)} | "
                        f"{', '.join(m for m in members if m in curves)} |")
    if not rows:
        return []
    return ["### Best arm of each family (gold at equal tokens)", "",
            "| family | best arm | gold | gain over SFT | arms in this report |",
            "|---|---|---|---|---|", *rows, ""]


def _update_section(out: Path) -> list[str]:
    path = out / UPDATE_JSON
    if not path.exists():
        return []
    d = json.loads(path.read_text())
    lines = ["## PPO update time: ours (economy off) against TRL 1.12's PPOTrainer", "",
             f"- command: `{d['command']}`", f"- setting: {d['setting']}", "",
             "| trainer | median update s | median step s | steps timed |", "|---|---|---|---|"]
    for row in d["rows"]:
        lines.append(f"| {row['trainer']} | {row['update_s']:.3f} | {row['step_s']:.3f} | "
                     f"{row['steps']} |")
    return lines + ["", d.get("note", ""), ""]


def _write(report: Path, lines: list[str], stale: list[str]) -> None:
    if stale:
        lines += ["", "### Stale: left out, never merged", "",
                  *(f"- `{s}`" for s in stale), ""]
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text("\n".join(lines).rstrip() + "\n")
