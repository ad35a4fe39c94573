"""Rollout engine benchmark: hf (model.generate), native (stopped rows leave the batch; its
decode step pipeline/decode/llama_step.py), native-model-calls (the same loop calling the model each
step: what the decode step saves) and native + each drafter of `--drafts`, on one policy;
counted compute per 1,000 generated tokens first, then seconds (variants interleaved,
`--repeats` rounds, median and min-max), without and with the PPO trainer's old-log-prob pass
(run after hf only: an engine that returns the sampled distribution skips it, as the trainer
does), and each variant's ratio to hf's generation + old-log-prob seconds per round, also per
generated token (the variants draw other samples, of other lengths).

    RLHF_TORCH_THREADS=1 OMP_NUM_THREADS=1 .venv/bin/python bench/engine.py --batches 16 64 \
        --repeats 5 --max-new-tokens 48                       # a tiny random Llama built here
    RLHF_TORCH_THREADS=1 OMP_NUM_THREADS=1 .venv/bin/python bench/engine.py \
        --policy artifacts/models/sft --prompts artifacts/store \
        --json bench/data/engine_sft.json                     # make run's SFT policy, held-out prompts

`--prompts` (a store root): the batches are the first held-out prompts of its pool (as the ppo
and eval stages render them); without it, a saved policy gets synthetic prompts. `--json`: the
figures as JSON, which `python docs/generate.py` renders as docs/generated/engine-bench.md.
`--device cuda --dtype bfloat16`: the policy and the batches on a GPU, in bf16
(bench/gpu_device.sh); the seconds then wait for the GPU (synchronized), and the JSON also holds
the device, the dtype and each batch's peak GPU memory. The defaults (cpu, the dtype the policy
was built or saved in) keep the CPU runs as they were.

Counts: `forwards` = sequential policy forwards; `row_fwd` = rows summed over those forwards
(what a finished row still costs under hf); `tok_fwd` = token positions pushed through the
policy (prefill, decode, verification); all per 1,000 generated tokens. `accept` = accepted /
drafted tokens. `draft_fwd` = the draft model's token positions (`--drafts model`: the policy's
first `--draft-layers` layers) weighted by its share of the policy's layers, so tok_fwd +
draft_fwd is the policy-equivalent compute of a variant. `lp_fwd` = the token positions of the
old-log-prob pass (0 where the engine's sampled distribution replaces it). `reuse` drafts the
prompt's previous native response with its stored log-probs (SPEC-RL's rule: not exact, an
arm).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import types
from pathlib import Path

import torch
from engine_variants import VARIANTS, count_syncs, run_variant, step_figures
from rlhf.pipeline.decode import (
    LookupDrafter,
    ModelDrafter,
    ReuseDrafter,
    Sampling,
    cut_at_eos,
    drafted_generate,
    encode_prompts,
    get_generator,
    native_generate,
    pad_responses,
    response_logits,
    token_entropy,
    token_logprobs,
)

DRAFTS = ("lookup", "reuse", "model")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def tiny_policy(vocab: int = 256, eos: int = 2, stop_bias: float = 2.5, seed: int = 0):
    """A random 2-layer Llama whose eos logit is raised so responses end at varied lengths."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                      pad_token_id=0, bos_token_id=1, eos_token_id=eos, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        probe = torch.randint(3, vocab, (32, 16))
        h = model(probe, output_hidden_states=True).hidden_states[-1].mean((0, 1))
        model.lm_head.weight[eos] += stop_bias * h / h.norm() ** 2
    tok = types.SimpleNamespace(pad_token_id=0, eos_token_id=eos)
    return model, tok


def prompts_of(tok, batch: int, vocab: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, 17, (batch,), generator=g)
    P = int(lengths.max())
    ids = torch.zeros(batch, P, dtype=torch.long)
    mask = torch.zeros(batch, P, dtype=torch.long)
    for i, n in enumerate(lengths.tolist()):  # left padded
        ids[i, P - n:] = torch.randint(3, vocab, (n,), generator=g)
        mask[i, P - n:] = 1
    return {"input_ids": ids, "attention_mask": mask}


def run(variant, model, tok, enc, sampling, k, old, draft_layers=0):
    if variant in VARIANTS:  # bench/engine_variants.py
        return run_variant(variant, model, tok, enc, sampling)
    if variant in ("hf", "native"):
        return get_generator(variant).generate(model, tok, enc, sampling)
    if variant == "native-model-calls":  # native with the model called every step
        return native_generate(model, tok, enc, sampling, fast=False)
    if variant == "native+lookup":
        return drafted_generate(model, tok, enc, sampling, LookupDrafter(), k)
    if variant == "native+model":
        return drafted_generate(model, tok, enc, sampling, ModelDrafter(draft_layers), k)
    reuse = ReuseDrafter()
    reuse.prepare(*old)
    return drafted_generate(model, tok, enc, sampling, reuse, k)


def old_logprob_pass(model, tok, enc, made, temperature: float) -> int:
    """The PPO trainer's old-log-prob forward over the responses of `made`, as
    pipeline/ppo/generate.py runs it when the engine returned no sampled distribution (hf);
    the token positions it pushed. An engine that returns it (native) skips it, as the trainer
    does, and costs 0."""
    if made.logprobs is not None:
        return 0
    eos, pad = tok.eos_token_id, tok.pad_token_id
    rows = [cut_at_eos(g, eos, pad) or [eos] for g in made.tokens.tolist()]
    resp, mask = pad_responses(rows, pad)
    dev = enc["input_ids"].device
    resp, mask = resp.to(dev), mask.to(dev)
    with torch.no_grad():
        logits = response_logits(model, enc["input_ids"], enc["attention_mask"], resp, mask,
                                 temperature)
        token_logprobs(logits, resp), token_entropy(logits)
    return resp.shape[0] * (enc["input_ids"].shape[1] + resp.shape[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default=None, help="a saved policy folder (default: tiny)")
    ap.add_argument("--batches", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--draft-k", type=int, default=4)
    ap.add_argument("--drafts", nargs="*", default=list(DRAFTS), choices=DRAFTS,
                    help="the drafters run on native besides hf and native (default: all)")
    ap.add_argument("--draft-layers", type=int, default=0,
                    help="--drafts model: the policy's first layers it drafts with (0: a quarter)")
    ap.add_argument("--prompts", default=None,
                    help="a store root: batches of its held-out prompts (needs --policy)")
    ap.add_argument("--json", default=None, help="also write the figures here as JSON")
    ap.add_argument("--device", default="cpu", help="torch device of the policy and batches")
    ap.add_argument("--dtype", default=None, choices=sorted(DTYPES),
                    help="cast the policy to this dtype (default: as built or saved)")
    ap.add_argument("--note", default=None,
                    help="what else ran on the machine (recorded in the JSON, shown on the page)")
    ap.add_argument("--variants", nargs="+", default=None,
                    choices=["hf", "native", "native-model-calls", *VARIANTS],
                    help="the variants besides the drafters (default: hf native "
                    "native-model-calls); hf always runs first (the ratios' base)")
    args = ap.parse_args()
    if args.prompts and not args.policy:
        ap.error("--prompts needs --policy (the tiny random Llama has no tokenizer)")
    if args.policy:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(args.policy).eval()
        tok = AutoTokenizer.from_pretrained(args.policy)
        if args.prompts:
            from rlhf.pipeline.heldout_prompts import held_out_prompts

            texts = [t for _, t in held_out_prompts(args.prompts)]
            if len(texts) < max(args.batches):
                ap.error(f"{args.prompts} has {len(texts)} held-out prompts, fewer than batch "
                         f"{max(args.batches)}")
        else:
            texts = [f"tell me about item {i}" for i in range(max(args.batches))]
        make = lambda b, s: dict(encode_prompts(tok, texts[:b]))
    else:
        model, tok = tiny_policy()
        make = lambda b, s: prompts_of(tok, b, model.config.vocab_size, s)
    dev = torch.device(args.device)
    on_gpu = dev.type == "cuda"
    if args.dtype:
        model = model.to(DTYPES[args.dtype])
    if dev.type != "cpu":
        model = model.to(dev)
    sampling = Sampling(args.temperature, args.top_p, args.max_new_tokens)
    base = ["hf", *(v for v in args.variants or ("native", "native-model-calls") if v != "hf")]
    variants = (*base, *(f"native+{d}" for d in args.drafts))
    report = {"command": "bench/engine.py " + " ".join(sys.argv[1:]),
              "policy": args.policy or "tiny random Llama (2 layers, hidden 64, vocab 256)",
              "prompts": args.prompts or ("synthetic" if args.policy else "random ids"),
              "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
              "load_1min_at_start": round(os.getloadavg()[0], 2), "machine": _cpu_name(), "torch": torch.__version__, "repeats": args.repeats,
              "sampling": {"temperature": args.temperature, "top_p": args.top_p,
                           "max_new_tokens": args.max_new_tokens}, "draft_k": args.draft_k,
              "draft_layers": args.draft_layers,
              "batches": {}}
    if args.note:
        report["note"] = args.note
    if dev.type != "cpu" or args.dtype:  # CPU runs' JSON stays as it was
        report.update({"device": str(dev), "dtype": str(next(model.parameters()).dtype),
                       "gpu": torch.cuda.get_device_name(dev) if on_gpu else None})
    print(f"threads={torch.get_num_threads()} max_new_tokens={args.max_new_tokens} "
          f"T={args.temperature} top_p={args.top_p} draft_k={args.draft_k} "
          f"policy={args.policy or 'tiny random Llama (2 layers, hidden 64, vocab 256)'}"
          + (f" device={dev} dtype={next(model.parameters()).dtype}"
             if dev.type != "cpu" or args.dtype else ""))
    for B in args.batches:
        enc = make(B, B)
        if dev.type != "cpu":
            enc = {k: v.to(dev) for k, v in enc.items()}
        if on_gpu:
            torch.cuda.reset_peak_memory_stats(dev)
        torch.manual_seed(0)  # the reuse drafter's old responses: one earlier native sample
        prev = get_generator("native").generate(model, tok, enc, sampling)
        old_tokens = [cut_at_eos(g, tok.eos_token_id, tok.pad_token_id)
                      for g in prev.tokens.tolist()]
        old = (old_tokens, prev.sampled_logprobs.tolist())  # the distribution it was drawn from
        syncs, peak_v, failed = {}, {}, {}
        for v in list(variants):  # warm-up, untimed: first calls pay one-off set-up costs
            torch.manual_seed(99)
            if on_gpu:
                torch.cuda.reset_peak_memory_stats(dev)
            try:
                with count_syncs(dev) as box:
                    made = run(v, model, tok, enc, sampling, args.draft_k, old, args.draft_layers)
            except Exception as exc:  # a library path this install lacks: reported, not fatal
                failed[v] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                print(f"variant {v} failed, left out: {failed[v]}")
                continue
            syncs[v] = box["syncs"] and box["syncs"] / max(made.forwards - 1, 1)
            old_logprob_pass(model, tok, enc, made, args.temperature)
            if on_gpu:
                peak_v[v] = torch.cuda.max_memory_allocated(dev) / 2**30
        variants = tuple(v for v in variants if v not in failed)
        counts = {v: [] for v in variants}
        steps = {v: [] for v in variants}  # per-run step figures
        secs = {v: [] for v in variants}
        secs_lp = {v: [] for v in variants}  # generation + the old-log-prob pass where it runs
        for rep in range(args.repeats):
            for v in variants:  # interleaved: the machine's load falls on every variant alike
                torch.manual_seed(100 + rep)
                t = time.perf_counter()
                made = run(v, model, tok, enc, sampling, args.draft_k, old, args.draft_layers)
                if on_gpu:
                    torch.cuda.synchronize(dev)  # the GPU's queued work counts in the seconds
                secs[v].append(time.perf_counter() - t)
                gen_n = sum(len(cut_at_eos(g, tok.eos_token_id, tok.pad_token_id))
                            for g in made.tokens.tolist())
                steps[v].append(step_figures(v, made, secs[v][-1], gen_n, syncs.get(v)))
                lp_positions = old_logprob_pass(model, tok, enc, made, args.temperature)
                if on_gpu:
                    torch.cuda.synchronize(dev)
                secs_lp[v].append(time.perf_counter() - t)
                gen = sum(len(cut_at_eos(g, tok.eos_token_id, tok.pad_token_id))
                          for g in made.tokens.tolist())
                counts[v].append((gen, made.forwards, sum(made.batch_sizes),
                                  made.token_forwards, made.drafted, made.accepted,
                                  made.draft_forwards,
                                  made.draft_token_forwards * made.draft_share, lp_positions))
        print(f"\nbatch {B}: counts per 1,000 generated tokens (summed over {args.repeats} runs)")
        print(f"{'variant':15s} {'tokens':>7s} {'forwards':>9s} {'row_fwd':>8s} {'tok_fwd':>8s} "
              f"{'draft_fwd':>9s} {'lp_fwd':>7s} {'accept':>7s}   seconds median [min, max]; "
              "with the old-log-prob pass")
        rows_out = report["batches"][str(B)] = {}
        if on_gpu:
            peak = torch.cuda.max_memory_allocated(dev) / 2**30
            report.setdefault("gpu_peak_gib", {})[str(B)] = round(peak, 3)
            print(f"(peak GPU memory over the batch's runs: {peak:.3f} GiB)")
        for v in variants:
            gen, fw, rows, tf, dr, ac, dfw, dtf, lpf = (sum(c[i] for c in counts[v])
                                                        for i in range(9))
            per = 1000 / max(gen, 1)
            acc = f"{ac / dr:.3f}" if dr else "-"
            s, s_lp = secs[v], secs_lp[v]
            print(f"{v:18s} {gen / args.repeats:7.0f} {fw * per:9.1f} {rows * per:8.1f} "
                  f"{tf * per:8.1f} {dtf * per:9.1f} {lpf * per:7.1f} {acc:>7s}   "
                  f"{statistics.median(s):.3f} [{min(s):.3f}, {max(s):.3f}]; "
                  f"{statistics.median(s_lp):.3f} [{min(s_lp):.3f}, {max(s_lp):.3f}]")
            rows_out[v] = {"tokens_per_run": round(gen / args.repeats, 1),
                           "forwards_per_1k": round(fw * per, 1),
                           "row_forwards_per_1k": round(rows * per, 1),
                           "token_forwards_per_1k": round(tf * per, 1),
                           "draft_forwards_per_1k": round(dfw * per, 1) if dfw else None,
                           "draft_token_forwards_per_1k": round(dtf * per, 1) if dfw else None,
                           "drafted": dr, "accepted": ac,
                           "acceptance": round(ac / dr, 4) if dr else None,
                           "seconds_median": round(statistics.median(s), 4),
                           "seconds_min": round(min(s), 4), "seconds_max": round(max(s), 4),
                           "oldlp_token_forwards_per_1k": round(lpf * per, 1),
                           "seconds_with_oldlp_median": round(statistics.median(s_lp), 4),
                           "seconds_with_oldlp_min": round(min(s_lp), 4),
                           "seconds_with_oldlp_max": round(max(s_lp), 4)}
        print(f"{'variant':18s} {'ms/step':>8s} {'tok/s':>8s} {'syncs/step':>10s} {'shapes':>6s} "
              f"{'captures':>8s} {'peak GiB':>8s} {'tok/s vs hf':>11s}")
        for v in variants:
            med = {k: statistics.median(f[k] for f in steps[v]) if steps[v][0].get(k) is not None
                   else None for k in steps[v][0]}
            med["syncs_per_step"] = syncs.get(v) if syncs.get(v) is not None \
                else med["syncs_per_step"]
            med["peak_gib"] = round(peak_v[v], 3) if v in peak_v else None
            med["tokens_per_s_vs_hf"] = [round(a["tokens_per_s"] / b["tokens_per_s"], 3)
                                         for a, b in zip(steps[v], steps["hf"])]
            rows_out[v]["step"] = {k: (round(x, 4) if isinstance(x, float) else x)
                                   for k, x in med.items()}
            show = lambda x, f: f"{'-':>{f[:-1].split('.')[0]}s}" if x is None else format(x, f)
            print(f"{v:18s} {show(med['ms_per_step'], '8.2f')} {show(med['tokens_per_s'], '8.0f')} "
                  f"{show(med['syncs_per_step'], '10.2f')} {show(med['shapes'], '6.0f')} "
                  f"{show(med['captures'], '8.0f')} {show(med['peak_gib'], '8.3f')} "
                  f"{statistics.median(med['tokens_per_s_vs_hf']):11.2f}")
        if failed:
            rows_out["failed"] = failed
        hf_lp = statistics.median(secs_lp["hf"])
        for v in variants[1:]:  # the goal's ratio: generation + old-log-prob pass, against hf
            ratios = [a / b for a, b in zip(secs_lp[v], secs_lp["hf"])]  # per interleaved round
            # the same per generated token: each variant draws other samples, of other lengths
            per_tok = [(a / max(ca[0], 1)) / (b / max(cb[0], 1)) for a, b, ca, cb in
                       zip(secs_lp[v], secs_lp["hf"], counts[v], counts["hf"])]
            rows_out[v]["ratio_vs_hf_with_oldlp_median"] = round(statistics.median(ratios), 3)
            rows_out[v]["ratio_vs_hf_with_oldlp_per_token_median"] = round(
                statistics.median(per_tok), 3)
            print(f"  {v}: {statistics.median(secs_lp[v]) / hf_lp:.2f}x hf's seconds with the "
                  f"old-log-prob pass (per-round ratios: median {statistics.median(ratios):.2f}, "
                  f"[{min(ratios):.2f}, {max(ratios):.2f}]; per generated token: median "
                  f"{statistics.median(per_tok):.2f}, [{min(per_tok):.2f}, {max(per_tok):.2f}])")
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=1) + "\n")
        tmp.replace(path)  # atomic: a killed run leaves the previous file
        print(f"\nwrote {path}")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()



if __name__ == "__main__":
    main()
