"""Our PPO update with the economy off (plain(params.yaml ppo)) against TRL 1.12's experimental
PPOTrainer, the last TRL PPO (removed in huggingface/trl PR 7020), side by side in one run.

Same tiny model (the embedded default's SFT architecture, freshly initialised so that neither
trainer's responses stop before the response length; the critic / value model is a copy of it
with a value head, as plain PPO's full critic), the same RM (a freshly initialised
sequence-classification copy), the same formatted prompts, batch, minibatch, epochs, response
length, temperature, learning rate. TRL 1.12 needs its own virtual environment (it pins nothing
we can share), made once with pip and a pinned torch:

    python3 -m venv /work/trl112venv
    /work/trl112venv/bin/pip install torch==2.13.0 trl==1.12.0
    .venv/bin/python bench/ppo_update_vs_trl112.py --trl-python /work/trl112venv/bin/python

Timed per step: ours, the trainer's own `seconds_update` (advantages + PPO epochs) and the
step's phase seconds; TRL's, the seconds inside its `accelerator.accumulate` blocks (forward,
backward and optimiser step of each minibatch; its advantages are computed with the rollout)
and the whole step. The first `--warmup` steps are left out, medians reported. The JSON lands in
<out>/ppo_update_vs_trl112.json and the economy benchmark's report (bench/economy/report.py) shows it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RLHF_TORCH_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
N_PROMPTS = 64


def build_world(root: Path, sft: Path | None) -> dict:
    """Policy, RM and formatted prompts under `root`; the architecture of `sft` when given."""
    import torch
    from rlhf.pipeline.models.text import format_prompt
    from transformers import (
        AutoConfig,
        AutoTokenizer,
        LlamaForCausalLM,
        LlamaForSequenceClassification,
    )

    if sft is not None and (sft / "config.json").is_file():
        tok = AutoTokenizer.from_pretrained(str(sft))
        config = AutoConfig.from_pretrained(str(sft))
        from rlhf.pipeline.heldout_prompts import held_out_prompts

        texts = [t for _, t in held_out_prompts(sft.parent.parent / "store")][:N_PROMPTS]
    else:
        sys.path.insert(0, str(REPO))  # a script: bench.economy from the repository root
        from bench.economy import world as economy_world

        w = economy_world.build(root / "quick")
        tok = AutoTokenizer.from_pretrained(str(w["sft"]))
        config = AutoConfig.from_pretrained(str(w["sft"]))
        texts = (economy_world.TRAIN * 8)[:N_PROMPTS]
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(root / "policy")
    tok.save_pretrained(root / "policy")
    torch.manual_seed(1)
    config.num_labels = 1
    LlamaForSequenceClassification(config).save_pretrained(root / "rm")
    tok.save_pretrained(root / "rm")
    (root / "prompts.jsonl").write_text("".join(
        json.dumps({"prompt_id": f"p{i:03d}", "text": t}) + "\n" for i, t in enumerate(texts)))
    (root / "formatted.json").write_text(json.dumps([format_prompt(t) for t in texts]))
    return {"policy": root / "policy", "rm": root / "rm", "prompts": root / "prompts.jsonl"}


def ours(cfg, world: dict, out: Path) -> list[dict]:
    from rlhf.pipeline.ppo.trainer import run

    run(cfg, world["policy"], world["rm"], world["prompts"], out, out / "rollouts",
        progress=False)
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    # the wall-clock figures are in timings.jsonl (pipeline/ppo/wallclock.py), step by step
    seconds = {t["step"]: t for t in map(json.loads,
                                         (out / "timings.jsonl").read_text().splitlines())}
    return [{"update_s": seconds[m["step"]]["seconds_update"],
             "step_s": sum(v for k, v in seconds[m["step"]].items()
                           if k.startswith("seconds_") and k != "seconds_cum"),
             "response_len": m["response_len_mean"]} for m in rows]


def trl_side(spec: dict) -> None:
    """Runs in the TRL 1.12 environment (no rlhf imports): prints one JSON list of steps."""
    import contextlib

    import torch
    from datasets import Dataset
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        AutoTokenizer,
        TrainerCallback,
    )
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    torch.set_num_threads(int(os.environ.get("RLHF_TORCH_THREADS", "1")) or
                          torch.get_num_threads())
    root = Path(spec["world"])
    tok = AutoTokenizer.from_pretrained(str(root / "policy"), padding_side="left")
    prompts = json.loads((root / "formatted.json").read_text())
    data = Dataset.from_list([{"input_ids": tok(p)["input_ids"][-spec["max_prompt_tokens"]:]}
                              for p in prompts])
    c = spec["cfg"]
    args = PPOConfig(
        output_dir=str(Path(spec["out"]) / "trl112"), report_to="none", seed=c["seed"],
        per_device_train_batch_size=c["batch_size"], gradient_accumulation_steps=1,
        num_mini_batches=c["batch_size"] // c["mini_batch_size"],
        num_ppo_epochs=c["ppo_epochs"], response_length=c["max_new_tokens"],
        temperature=c["temperature"], learning_rate=c["learning_rate"],
        kl_coef=c["kl_coef"], cliprange=c["clip_range"], cliprange_value=c["clip_range_value"],
        gamma=c["gamma"], lam=c["gae_lambda"], total_episodes=c["batch_size"] * spec["steps"],
        num_sample_generations=0, stop_token="eos", save_strategy="no", logging_steps=10**6,
        bf16=False, gradient_checkpointing=False, use_cpu=not torch.cuda.is_available(),
        local_rollout_forward_batch_size=c["batch_size"], disable_tqdm=True)
    policy = AutoModelForCausalLM.from_pretrained(str(root / "policy"))
    ref = AutoModelForCausalLM.from_pretrained(str(root / "policy"))
    value = AutoModelForSequenceClassification.from_pretrained(str(root / "policy"),
                                                               num_labels=1)
    rm = AutoModelForSequenceClassification.from_pretrained(str(root / "rm"), num_labels=1)
    steps: list[dict] = []
    clock = {"update": 0.0, "start": time.perf_counter()}

    class StepTimer(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            now = time.perf_counter()
            steps.append({"update_s": clock["update"], "step_s": now - clock["start"]})
            clock.update(update=0.0, start=now)

    trainer = PPOTrainer(args=args, processing_class=tok, model=policy, ref_model=ref,
                         reward_model=rm, train_dataset=data, value_model=value,
                         callbacks=[StepTimer()])
    accumulate = trainer.accelerator.accumulate

    @contextlib.contextmanager
    def timed(*a, **kw):
        t = time.perf_counter()
        with accumulate(*a, **kw):
            yield
        clock["update"] += time.perf_counter() - t

    trainer.accelerator.accumulate = timed
    clock["start"] = time.perf_counter()
    trainer.train()
    print("STEPS " + json.dumps(steps))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trl-python", default="/work/trl112venv/bin/python")
    ap.add_argument("--artifacts", type=Path, default=Path("artifacts"))
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--out", type=Path, default=None, help="default artifacts/bench/economy")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--trl-side", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.trl_side:
        trl_side(json.loads(args.trl_side.read_text()))
        return 0
    from dataclasses import asdict, replace

    import torch
    import transformers
    import trl
    from rlhf.pipeline.config import load_config
    from rlhf.pipeline.ppo.config import plain

    out = args.out or args.artifacts / "bench" / "economy"
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="ppo-vs-trl112-"))
    sft = args.artifacts / "models" / "sft"
    world = build_world(scratch, sft if sft.is_dir() else None)
    cfg = replace(plain(load_config(args.params, "ppo")), total_steps=args.steps,
                  checkpoint_every=args.steps, seed=0)
    t = time.perf_counter()
    our_steps = ours(cfg, world, scratch / "ours")
    our_wall = time.perf_counter() - t
    spec = {"world": str(scratch), "out": str(scratch), "steps": args.steps,
            "max_prompt_tokens": cfg.max_prompt_tokens, "cfg": asdict(cfg)}
    (scratch / "spec.json").write_text(json.dumps(spec))
    t = time.perf_counter()
    proc = subprocess.run([args.trl_python, str(Path(__file__).resolve()), "--trl-side",
                           str(scratch / "spec.json")], capture_output=True, text=True,
                          check=False, env={**os.environ, "PYTHONPATH": ""})
    trl_wall = time.perf_counter() - t
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("STEPS ")), None)
    if proc.returncode or line is None:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        return 1
    trl_steps = json.loads(line[len("STEPS "):])
    trl_version = subprocess.run([args.trl_python, "-c", "import trl; print(trl.__version__)"],
                                 capture_output=True, text=True, check=False).stdout.strip()

    def row(name, steps, wall):
        kept = steps[args.warmup:] or steps
        return {"trainer": name, "update_s": statistics.median(s["update_s"] for s in kept),
                "step_s": statistics.median(s["step_s"] for s in kept), "steps": len(kept),
                "wall_s": round(wall, 1)}

    n_params = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_pretrained(
        str(world["policy"])).parameters())
    result = {
        "command": "python bench/ppo_update_vs_trl112.py " + " ".join(sys.argv[1:]),
        "setting": (f"policy {n_params / 1e6:.2f}M parameters (random init), batch "
                    f"{cfg.batch_size}, minibatch {cfg.mini_batch_size}, {cfg.ppo_epochs} "
                    f"epochs, response length {cfg.max_new_tokens} (mean ours: "
                    f"{statistics.mean(s['response_len'] for s in our_steps):.1f}), "
                    f"temperature {cfg.temperature}, full critic, {args.steps} steps, "
                    f"{os.environ['RLHF_TORCH_THREADS']} torch thread, torch {torch.__version__}"
                    f", TRL {trl_version} (side venv); ours on trl {trl.__version__}"),
        "rows": [row("ours (plain PPO)", our_steps, our_wall),
                 row(f"TRL {trl_version} PPOTrainer", trl_steps, trl_wall)],
        "note": ("Update = ours: advantages + PPO epochs (`seconds_update`); TRL: its minibatch "
                 "forward/backward/step blocks. TRL 1.12 always trains on the full response "
                 "length (padding masked) and samples with top-p 1.0; ours cuts at EOS and "
                 "samples at ppo.top_p."),
    }
    (out / "ppo_update_vs_trl112.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    import shutil

    shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
