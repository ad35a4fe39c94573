"""Held-out evaluation of the SFT policy and every PPO checkpoint: the gold judge against the
proxy reward models, and the over-optimisation picture (Gao et al. 2022, "Scaling laws for reward
model overoptimization": gold and proxy reward against sqrt(KL) to the reference policy).

    rlhf eval --sft artifacts/models/sft --ppo artifacts/ppo \
        --light-rm artifacts/models/rm_light --strong-rm artifacts/models/rm_strong \
        --prompts artifacts/store --out artifacts/eval --metrics artifacts/metrics/eval.json

Per policy (SFT = step 0, then each `checkpoints/step-NNNNNN/policy.pt` the PPO trainer saved;
a `ppo.lora` run's checkpoints: their adapters merged into the SFT policy),
on the held-out prompts (every member of the eval-split clusters, pipeline/heldout_prompts.py):
the judge's mean (`gold_mean`: the judge params.yaml's `judge:` section names, pipeline/models/judges.py;
the report and the metrics name it), light and strong RM means (each reward an RM folder, a
function or a server, as `rlhf ppo --reward`: a server gets the policy's chat-templated texts;
a row a function or server declines is left out), win rate against SFT by the judge
(ties count one half), KL(policy || SFT reference) per response, response length, repetition rate.

Sampling, not greedy: the policies are trained and used as samplers (PPO's temperature/top_p,
read from the `ppo` section), and the sequence KL is an expectation under the policy, so summing
the exact per-token KL along the policy's own samples is an unbiased estimate of it; along greedy
paths it is not, and greedy decoding also hides the repetition the KL penalty is there to stop.
Every policy samples with the same seeds (batch b reseeds with (seed, b)), so the comparison with
SFT is paired.

Outputs under --out: curves.csv (one row per policy: the DVC plot), gold_proxy_vs_kl.png,
metrics_sft_vs_ppo.png, samples.jsonl (every response with its scores), report.md.
"""

from __future__ import annotations

import csv
import json
import math
import random
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

CURVE_COLUMNS = ("step", "sqrt_kl", "kl_mean", "gold_mean", "light_rm_mean", "strong_rm_mean",
                 "win_rate", "response_tokens_mean", "repetition_rate")


@dataclass(frozen=True)
class EvalConfig:
    """The `eval` section of params.yaml."""

    seed: int = 0                 # sampling seed, the same for every policy (paired comparison)
    max_new_tokens: int = 48      # as ppo.max_new_tokens: the lengths PPO was trained on
    max_prompt_tokens: int = 64   # as ppo.max_prompt_tokens
    n_prompts: int = 256          # cap on held-out prompts (seeded subset); 0 = all of them
    checkpoints: tuple[int, ...] = ()  # PPO steps to evaluate; () = every saved checkpoint
    batch_size: int = 64
    repetition_ngram: int = 4     # seq-rep-4 of Welleck et al. 2019 (neural text degeneration)
    # the rollout engine that samples (pipeline/decode get_generator): "native" (a stopped row
    # leaves the batch; the same distribution as "hf"), "hf" (model.generate) or "auto" (per device,
    # the fastest exact engine measured on that device kind: native on a CPU, hf on CUDA until the
    # static step's GPU figures exist, ppo.engine says why; recorded as resolved)
    engine: Literal["auto", "hf", "native"] = "native"

    def __post_init__(self) -> None:
        from rlhf.pipeline import ranges

        ranges.check_fields("eval", self)


# --------------------------------------------------------------------------- pure metrics
def repetition_rate(text: str, n: int = 4) -> float:
    """Share of the word n-grams of `text` that repeat an earlier n-gram of the same text
    (1 - distinct / total; Welleck et al. 2019 seq-rep-n). 0 for a text shorter than n words."""
    words = text.split()
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def win_rate(scores: list[float], baseline: list[float], tol: float = 1e-9) -> float:
    """Paired win rate of `scores` over `baseline`: 1 per win, 1/2 per tie (|diff| <= tol)."""
    if len(scores) != len(baseline):
        raise ValueError(f"win_rate needs paired scores ({len(scores)} vs {len(baseline)})")
    if not scores:
        return float("nan")
    total = sum(1.0 if s > b + tol else 0.5 if abs(s - b) <= tol else 0.0
                for s, b in zip(scores, baseline))
    return total / len(scores)


def _mean(xs) -> float:
    """The mean of the values that are there (None: a row a reward declined to score)."""
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else float("nan")


# --------------------------------------------------------------------------- inputs
def load_eval_prompts(path: str | Path, cap: int = 0, seed: int = 0) -> list[tuple[str, str]]:
    """(prompt_id, text) held-out prompts: a store root (pipeline/heldout_prompts.held_out_prompts)
    or a JSONL file of {"prompt_id", "text"}; a seeded subset of `cap` when cap > 0."""
    path = Path(path)
    if path.is_dir():
        from rlhf.pipeline.heldout_prompts import held_out_prompts

        prompts = held_out_prompts(path)
    else:
        prompts = []
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
            if line.strip():
                row = json.loads(line)
                prompts.append((str(row.get("prompt_id", f"line{i + 1}")), row["text"]))
    if not prompts:
        raise ValueError(f"no held-out prompts in {path}")
    if 0 < cap < len(prompts):
        prompts = sorted(random.Random(seed).sample(prompts, cap))
    return prompts


def checkpoint_steps(ppo_dir: str | Path, wanted: tuple[int, ...] = ()) -> list[tuple[int, Path]]:
    """(step, folder) of the PPO checkpoints under ppo_dir/checkpoints, sorted by step."""
    root = Path(ppo_dir) / "checkpoints"
    found = {}
    for p in root.glob("step-*") if root.is_dir() else ():
        if (p / "policy.pt").is_file() or (p / "config.json").is_file():
            found[int(p.name.split("-")[1])] = p
    missing = sorted(set(wanted) - set(found))
    if missing:
        raise ValueError(f"eval.checkpoints asks for step(s) {missing} but {root} has "
                         f"{sorted(found) or 'none'}")
    steps = sorted(wanted) if wanted else sorted(found)
    return [(s, found[s]) for s in steps]


def load_checkpoint_policy(sft_path: str | Path, folder: Path, compute=None):
    """A PPO checkpoint as a model: a save_pretrained folder, the trainer's policy.pt state dict
    loaded into the SFT architecture, or a `ppo.lora` run's checkpoint (its policy.pt holds only
    the adapters): the SFT policy, the base that run trained, with the checkpoint's `adapter/`
    merged in (pipeline/export.with_adapter, as `rlhf export --merge`); in `compute`'s device
    and dtype (pipeline/models/compute.py; None: float32 on the CPU)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlhf.pipeline.models.compute import load_pretrained

    if (folder / "config.json").is_file():
        return load_pretrained(AutoModelForCausalLM, folder, compute, "checkpoint").eval()
    model = load_pretrained(AutoModelForCausalLM, sft_path, compute, "policy")
    if (folder / "adapter" / "adapter_config.json").is_file():
        from rlhf.pipeline.export import with_adapter

        return with_adapter(model, folder / "adapter", merge=True).eval()
    # load_state_dict copies into the parameters: they keep `compute`'s dtype and device
    model.load_state_dict(torch.load(folder / "policy.pt", map_location="cpu"))
    return model.eval()


# --------------------------------------------------------------------------- sampling + KL
def sample_with_kl(model, ref, tok, prompts: list[str], cfg: EvalConfig, temperature: float,
                   top_p: float, progress=None) -> list[dict]:
    """One sampled response per prompt, with its token count and the exact KL(policy || ref)
    summed over its tokens (full tempered distributions, as the PPO trainer's penalty: full_kl).
    """
    import torch

    from rlhf.pipeline.decode import (Sampling, cut_at_eos, encode_prompts, full_kl,
                                      get_generator, pad_responses, resolve_engine,
                                      response_logits)
    from rlhf.pipeline.models.text import response_of

    eos, pad = tok.eos_token_id, tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    settings = Sampling(temperature, top_p, cfg.max_new_tokens)
    engine = get_generator(resolve_engine(cfg.engine, next(model.parameters()).device))
    out: list[dict] = []
    for b, start in enumerate(range(0, len(prompts), cfg.batch_size)):
        chunk = prompts[start:start + cfg.batch_size]
        enc = encode_prompts(tok, chunk, cfg.max_prompt_tokens)
        if model.device.type != "cpu":  # params.yaml `compute`: the models' GPU
            enc = {k: v.to(model.device) for k, v in enc.items()}
        torch.manual_seed(cfg.seed * 1_000_003 + b)
        with torch.no_grad():
            seq = engine.generate(model, tok, enc, settings).sequences
            rows = [cut_at_eos(r, eos, pad) for r in seq[:, enc["input_ids"].shape[1]:].tolist()]
            resp, resp_mask = pad_responses(rows, pad)                 # [B, T]
            if model.device.type != "cpu":
                resp, resp_mask = resp.to(model.device), resp_mask.to(model.device)
            q, qm = enc["input_ids"], enc["attention_mask"]
            kl = full_kl(response_logits(model, q, qm, resp, resp_mask, temperature),
                         response_logits(ref, q, qm, resp, resp_mask, temperature))
            kl = kl * resp_mask  # [B, T]
        for i, r in enumerate(rows):
            text = response_of(tok.decode(r, skip_special_tokens=True))
            out.append({"response": text, "n_tokens": len(r), "kl": max(float(kl[i].sum()), 0.0)})
        if progress is not None:
            progress(len(chunk))
    return out


def _score(scorer, prompts: list[str], responses: list[str],
           batch_size: int) -> list[float | None]:
    """The scorer's score a row; None where a reward function or server declined the row (its
    optional validity, pipeline/models/code_rewards.py): the means leave it out."""
    import torch

    call = scorer.score if hasattr(scorer, "score") else scorer
    out: list[float | None] = []
    for s in range(0, len(prompts), batch_size):
        rewards, _, *valid = call(prompts[s:s + batch_size], responses[s:s + batch_size])
        rows = torch.as_tensor(rewards, dtype=torch.float32).flatten().tolist()
        if valid:
            rows = [r if ok else None for r, ok in zip(rows, torch.as_tensor(valid[0]).tolist())]
        out += rows
    return out


# --------------------------------------------------------------------------- the stage
def evaluate(cfg: EvalConfig, sft_path: str | Path, ppo_dir: str | Path, light_rm: str | Path,
             strong_rm: str | Path, prompts: list[tuple[str, str]], temperature: float,
             top_p: float, progress: bool = True, judge=None,
             compute=None) -> tuple[list[dict], list[dict]]:
    """(curve rows, sample rows): every policy sampled on every prompt and scored; `judge` a
    pipeline/models/judges.Judge (None: the world's gold judge); `compute` the models' device and dtype
    (pipeline/models/compute.py; None: the CPU, as before). Where cores allow
    (pipeline/workers.py: `make run`, one process per core), this process and spawned workers
    share the policies: a batch's seed is (seed, batch) whichever policy and process samples it,
    so the rows are the inline run's (tests/test_eval.py)."""
    from rlhf.pipeline.progress import bar
    from rlhf.pipeline.workers import worker_count, worker_pool

    policies = [(0, None)] + checkpoint_steps(ppo_dir, cfg.checkpoints)
    ids, texts = [p[0] for p in prompts], [p[1] for p in prompts]
    args = (light_rm, strong_rm, texts, temperature, top_p)
    n = worker_count(len(policies))  # processes, this one included: each takes every n-th policy
    shares = [policies[i::n] for i in range(n)]
    with (bar(f"eval: sampling {len(policies)} policies", len(policies) * len(texts), "prompts")
          if progress else nullcontext(lambda k: None)) as advance, \
            worker_pool(len(policies), beside_stage=True) as workers:
        jobs = [workers.submit(score_policies, cfg, sft_path, share, *args, None, judge, compute)
                for share in shares[1:]] if workers is not None else []
        scored = [score_policies(cfg, sft_path, shares[0], *args, advance, judge, compute)]
        for job, share in zip(jobs, shares[1:]):
            scored.append(job.result())
            advance(len(share) * len(texts))
    # back in policy order: share i holds policies i, i + n, i + 2n, ...
    in_order = [scored[k % n][k // n] for k in range(len(policies))]
    return _rows(policies, ids, texts, in_order)


def score_policies(cfg: EvalConfig, sft_path: str | Path, policies: list[tuple[int, Path | None]],
                   light_rm: str | Path, strong_rm: str | Path, texts: list[str],
                   temperature: float, top_p: float, advance=None, judge=None,
                   compute=None) -> list[tuple]:
    """Each of `policies` ((step, checkpoint folder; None: the SFT policy)) sampled on `texts`
    and scored: (sample_with_kl's outputs, judge scores, {light_rm, strong_rm: scores},
    repetition rates) per policy. The inline loop, or a worker's job of one policy."""
    import torch
    from rlhf.pipeline.models.judges import WorldGoldJudge, score_all
    from rlhf.pipeline.models.policy import load_policy
    from rlhf.pipeline.models.scoring import load_scorer

    judge = judge if judge is not None else WorldGoldJudge()

    ref, tok = load_policy(sft_path, compute)
    ref.requires_grad_(False)
    # a reward server gets the texts in the policy's chat template, as PPO's does
    scorers = {k: load_scorer(path, compute=compute, policy_tokenizer=tok)
               for k, path in (("light_rm", light_rm), ("strong_rm", strong_rm))}
    scored = []
    for _, folder in policies:
        model = ref if folder is None else load_checkpoint_policy(sft_path, folder, compute)
        outs = sample_with_kl(model, ref, tok, texts, cfg, temperature, top_p, advance)
        responses = [o["response"] for o in outs]
        gold = score_all(judge, texts, responses)
        rm = {k: _score(s, texts, responses, cfg.batch_size) for k, s in scorers.items()}
        rep = [repetition_rate(r, cfg.repetition_ngram) for r in responses]
        scored.append((outs, gold, rm, rep))
        if folder is not None:
            del model
        torch.manual_seed(cfg.seed)
    return scored


def _rows(policies: list[tuple[int, Path | None]], ids: list[str], texts: list[str],
          scored: list[tuple]) -> tuple[list[dict], list[dict]]:
    """(curve rows, sample rows) of `score_policies`' results, policy by policy; the win rate
    is against the first policy's (SFT's) judge scores."""
    curves, samples, sft_gold = [], [], scored[0][1]
    for (step, _), (outs, gold, rm, rep) in zip(policies, scored, strict=True):
        kl_mean = _mean(o["kl"] for o in outs)
        curves.append({
            "step": step, "sqrt_kl": math.sqrt(kl_mean), "kl_mean": kl_mean,
            "gold_mean": _mean(gold), "light_rm_mean": _mean(rm["light_rm"]),
            "strong_rm_mean": _mean(rm["strong_rm"]), "win_rate": win_rate(gold, sft_gold),
            "response_tokens_mean": _mean(o["n_tokens"] for o in outs),
            "repetition_rate": _mean(rep)})
        samples += [{"step": step, "prompt_id": pid, "prompt": p, "response": o["response"],
                     "n_tokens": o["n_tokens"], "kl": round(o["kl"], 6),
                     "gold": round(g, 6), "light_rm": _round(lr),
                     "strong_rm": _round(sr), "repetition": round(rr, 6)}
                    for pid, p, o, g, lr, sr, rr in zip(ids, texts, outs, gold,
                                                        rm["light_rm"], rm["strong_rm"], rep)]
    return curves, samples


def _round(score: float | None) -> float | None:
    return None if score is None else round(score, 6)


# --------------------------------------------------------------------------- the critic
VALUE_KEYS = ("value_explained_variance", "value_rmse")


def value_windows(rows: list[dict], steps: list[int]) -> list[dict]:
    """Per evaluated checkpoint step: the mean of each VALUE_KEYS over the run's steps since the
    previous checkpoint (finite values only; None where a window has none) and how many steps
    that window averaged. Pure: `rows` are metrics.jsonl lines."""
    out, prev = [], 0
    for s in sorted(steps):
        window = [r for r in rows if prev < r.get("step", 0) <= s]
        row: dict = {"step": s, "steps": len(window)}
        for k in VALUE_KEYS:
            xs = [float(r[k]) for r in window
                  if isinstance(r.get(k), (int, float)) and math.isfinite(r[k])]
            row[k] = sum(xs) / len(xs) if xs else None
        out.append(row)
        prev = s
    return out


def value_quality(ppo_dir: str | Path, steps: list[int]) -> dict:
    """The critic's value quality at each evaluated checkpoint (seed 000 §3.2 states its light
    critic's cost as value RMSE): explained variance of V against the GAE returns and the RMSE,
    as the trainer logged them per step (metrics.jsonl), averaged since the checkpoint before;
    the critic the run trained (its last checkpoint's config). Empty when the run left no
    metrics.jsonl."""
    ppo_dir = Path(ppo_dir)
    path = ppo_dir / "metrics.jsonl"
    if not path.exists() or not steps:
        return {}
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    critic = None
    folders = [f for s, f in checkpoint_steps(ppo_dir) if s == max(steps)]
    state = folders[0] / "trainer_state.json" if folders else None
    if state is not None and state.exists():
        cfg = json.loads(state.read_text()).get("config", {})
        critic = cfg.get("critic")
        if critic in ("trunk", "shared"):
            critic += f" (critic_layers {cfg.get('critic_layers')})"
    return {"critic": critic, "by_checkpoint": value_windows(rows, steps)}


# --------------------------------------------------------------------------- outputs
def write_curves(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CURVE_COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: (r[k] if k == "step" else f"{r[k]:.6g}") for k in CURVE_COLUMNS})


def plot_overoptimisation(rows: list[dict], path: Path, judge_name: str = "world_gold") -> None:
    """Gold (left axis) and the two proxy RMs (right axis) against sqrt(KL), one point per
    checkpoint, labelled with its step: the Gao et al. 2022 picture."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["sqrt_kl"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(x, [r["gold_mean"] for r in rows], "o-", color="black", label=f"judge: {judge_name}")
    for r in rows:
        ax.annotate(f"{r['step']}", (r["sqrt_kl"], r["gold_mean"]), textcoords="offset points",
                    xytext=(3, 5), fontsize=7)
    ax.set_xlabel("sqrt(KL(policy || SFT))  [sqrt(nats)]")
    ax.set_ylabel("judge mean")
    ax2 = ax.twinx()
    ax2.plot(x, [r["light_rm_mean"] for r in rows], "s--", color="tab:orange", label="light RM")
    ax2.plot(x, [r["strong_rm_mean"] for r in rows], "^--", color="tab:blue", label="strong RM")
    ax2.set_ylabel("proxy RM mean")
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], loc="best", fontsize=8)
    ax.set_title("Gold vs proxy reward over PPO checkpoints (labels: step)")
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


def plot_bars(sft: dict, ppo: dict, path: Path) -> None:
    """SFT vs the last PPO checkpoint, one small panel per metric (their scales differ)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = ("gold_mean", "light_rm_mean", "strong_rm_mean", "win_rate", "kl_mean",
            "response_tokens_mean", "repetition_rate")
    fig, axes = plt.subplots(1, len(keys), figsize=(2.1 * len(keys), 3.2))
    for ax, k in zip(axes, keys):
        ax.bar(["SFT", f"PPO {ppo['step']}"], [sft[k], ppo[k]], color=["grey", "tab:green"])
        ax.set_title(k, fontsize=8)
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


def _fmt(v) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def _critic_lines(value: dict) -> list[str]:
    """report.md's critic section (value_quality), or nothing when the run logged none."""
    if not value.get("by_checkpoint"):
        return []
    f = lambda v: "–" if v is None else f"{v:.3f}"  # noqa: E731
    return [
        "## Critic", "",
        (f"Critic: `{value.get('critic') or 'unknown'}`. Value quality as the trainer logged it "
         "each step (metrics.jsonl): explained variance of V against the GAE returns (1: "
         "perfect, 0: no better than the mean) and RMSE, each the mean over the steps since "
         "the checkpoint before."), "",
        "| step | steps averaged | value explained variance | value RMSE |", "|---|---|---|---|",
        *(f"| {r['step']} | {r['steps']} | {f(r['value_explained_variance'])} | "
          f"{f(r['value_rmse'])} |" for r in value["by_checkpoint"]), ""]


def write_report(rows: list[dict], n_prompts: int, sampling: dict, path: Path,
                 judge_name: str = "world_gold", value: dict | None = None) -> None:
    sft, last = rows[0], rows[-1]
    peak = max(rows, key=lambda r: r["gold_mean"])
    lines = [
        "# Evaluation: SFT vs PPO checkpoints on held-out prompts", "",
        (f"Judge: `{judge_name}` (params.yaml `judge:`, pipeline/models/judges.py); `gold_mean` and the "
         "win rate are its verdict."), "",
        (f"{n_prompts} held-out prompts (eval-split clusters), one sampled response per prompt "
        f"and policy (temperature {sampling['temperature']}, top-p {sampling['top_p']}, "
        f"max {sampling['max_new_tokens']} new tokens, seed {sampling['seed']}, the same seeds "
        "for every policy). KL is the exact KL(policy || SFT) over the full vocabulary, summed "
        "over each response's tokens, averaged over responses. Win rate: the judge, paired "
        "with SFT's response to the same prompt, ties count 1/2. Step 0 is the SFT policy."), "",
        "| " + " | ".join(CURVE_COLUMNS) + " |",
        "|" + "---|" * len(CURVE_COLUMNS),
        *("| " + " | ".join(_fmt(r[k]) for k in CURVE_COLUMNS) + " |" for r in rows), "",
        "## Reading", "",
        (f"- Judge ({judge_name}): SFT {sft['gold_mean']:.3f} -> last checkpoint (step {last['step']}) "
        f"{last['gold_mean']:.3f} ({last['gold_mean'] - sft['gold_mean']:+.3f}); win rate "
        f"against SFT {last['win_rate']:.3f}."),
        (f"- Light RM (the PPO reward): {sft['light_rm_mean']:.3f} -> {last['light_rm_mean']:.3f};"
        f" strong RM: {sft['strong_rm_mean']:.3f} -> {last['strong_rm_mean']:.3f}."),
        f"- Gold peaks at step {peak['step']} (sqrt KL {peak['sqrt_kl']:.3f})"
        + (" and falls after it while the proxy keeps its gain: over-optimisation (Gao et al. "
           "2022)." if peak is not last and last["light_rm_mean"] >= peak["light_rm_mean"]
           else "."),
        (f"- Response length {sft['response_tokens_mean']:.1f} -> "
        f"{last['response_tokens_mean']:.1f} tokens; repetition rate "
        f"{sft['repetition_rate']:.3f} -> {last['repetition_rate']:.3f}."), "",
        *_critic_lines(value or {}),
        "## Figures", "",
        "![gold and proxy reward against sqrt(KL)](gold_proxy_vs_kl.png)", "",
        "![metrics, SFT vs the last PPO checkpoint](metrics_sft_vs_ppo.png)", "",
        ("Data: `curves.csv` (one row per policy), `samples.jsonl` (every response and its "
        "scores). `dvc plots show` renders the curves."), ""]
    path.write_text("\n".join(lines), encoding="utf-8")


def run(cfg: EvalConfig, sft_path: str | Path, ppo_dir: str | Path, light_rm: str | Path,
        strong_rm: str | Path, prompts_path: str | Path, out: str | Path,
        temperature: float, top_p: float, progress: bool = True, judge=None,
        compute=None) -> dict:
    """Evaluate, write every output under `out`, return the metrics (for artifacts/metrics);
    `judge`: a pipeline/models/judges.Judge (None: the world's gold judge); `compute`: the models'
    device and dtype (pipeline/models/compute.py)."""
    from rlhf.pipeline.models.judges import WorldGoldJudge
    from rlhf.pipeline.models.policy import quiet_hf
    from rlhf.store.io import staged_folders

    judge = judge if judge is not None else WorldGoldJudge()

    quiet_hf()  # torch threads (policy.set_threads), no library progress bars
    out = Path(out)
    prompts = load_eval_prompts(prompts_path, cfg.n_prompts, cfg.seed)
    curves, samples = evaluate(cfg, sft_path, ppo_dir, light_rm, strong_rm, prompts,
                               temperature, top_p, progress, judge, compute)
    sampling = {"temperature": temperature, "top_p": top_p,
                "max_new_tokens": cfg.max_new_tokens, "seed": cfg.seed}
    value = value_quality(ppo_dir, [c["step"] for c in curves if c["step"] > 0])
    # the whole folder is written into a hidden staging sibling and swapped in at the end: a
    # kill leaves the previous evaluation (or none), never a report beside another run's curves
    with staged_folders([out]) as staging:
        tmp = staging[out]
        tmp.mkdir(parents=True, exist_ok=True)
        write_curves(curves, tmp / "curves.csv")
        with open(tmp / "samples.jsonl", "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(s, ensure_ascii=False) + "\n" for s in samples)
        plot_overoptimisation(curves, tmp / "gold_proxy_vs_kl.png", judge.name)
        plot_bars(curves[0], curves[-1], tmp / "metrics_sft_vs_ppo.png")
        write_report(curves, len(prompts), sampling, tmp / "report.md", judge.name, value)
    rnd = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in curves[-1].items()}
    return {"judge": judge.name, "n_prompts": len(prompts), "n_policies": len(curves),
            "sft": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in curves[0].items()},
            "final": rnd, "gold_gain": round(curves[-1]["gold_mean"] - curves[0]["gold_mean"], 4),
            "sampling": sampling, **({"critic": value} if value else {})}
