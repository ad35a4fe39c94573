"""Plain PPO against LoRA PPO (`ppo.lora`): trainable parameters and peak memory of one PPO update
step (policy + reference + critic), each arm in a fresh process. Figures, not a pass/fail test.

    python bench/lora_bench.py --scale qwen05b --out bench/data/lora_bench_qwen05b.json
    python bench/lora_bench.py --scale world                  # the embedded world's shape
    python bench/lora_bench.py --arms lora-shared --device cuda

Arms (`plain-*`: the policy fully trained, the reference a second copy; `lora-*`: the policy as
adapters (pipeline/ppo/lora.py), the reference the same base with them off):
`<kind>-shared` the critic a value head on the policy's trunk (plain: a frozen copy of its first
`--critic-layers` layers; LoRA: the policy's own base, no copy), `<kind>-full` the critic a model
of its own (plain: fully trained; LoRA: its own adapters). Every model is built as the trainer
builds it (`PPOTrainer.__init__`: lora.wrap_policy, lora.build_critic, critic.build_critic),
from the shape's config with random weights (this measures cost, not quality), float32.

One step: the policy's forward over `--batch` random sequences of `--seq-len` tokens (half prompt,
half response) with gradient, the reference's without, the clipped PPO loss plus the full KL, the
critic's values and loss, one backward and one AdamW step of each optimiser (the trainer's).
Memory, two ways: (1) the tensors, counted (distinct storages, so the shared base once): weights,
gradients and AdamW state after the step; (2) measured: the process's peak resident set (Linux
ru_maxrss, CPU; `peak_rss_over_imports_gb` less the peak before the models were built, torch and
the pipeline's PPO modules imported), or torch.cuda.max_memory_allocated on a GPU.
`plain-full` at 0.5B counts about 18 GB of tensors (three 2 GB models, two trained): more than a
shared 23 GB machine should be asked for; run it where memory allows.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from model_shapes import SCALES, shape_config

ARMS = ("plain-shared", "lora-shared", "lora-full", "plain-full")


def rss_gb() -> float:
    """The peak resident set of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def storages(tensors) -> dict[int, int]:
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}


def build(arm: str, args):
    """(policy, reference, critic, PPOConfig) as PPOTrainer builds them for `arm`."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlhf.pipeline.config import build as build_config
    from rlhf.pipeline.ppo import lora
    from rlhf.pipeline.ppo.config import PPOConfig
    from rlhf.pipeline.ppo.critic import build_critic

    mcfg = shape_config(args.scale)
    kind, critic_kind = arm.split("-")
    cfg = build_config(PPOConfig, {"critic": critic_kind, "critic_layers": args.critic_layers,
                                   "lora": {"enabled": kind == "lora", "r": args.r,
                                            "alpha": 2 * args.r}}, "ppo")
    torch.manual_seed(0)
    policy = AutoModelForCausalLM.from_config(mcfg).to(args.device)
    if kind == "lora":
        policy, ref = lora.wrap_policy(policy, cfg.lora)
        critic = lora.build_critic(cfg, mcfg.vocab_size, 0, policy, None)
    else:
        ref = AutoModelForCausalLM.from_config(mcfg).to(args.device).eval().requires_grad_(False)
        critic = build_critic(critic_kind, mcfg.vocab_size, 0, cfg.critic_hidden_size,
                              cfg.critic_layers, cfg.critic_heads, cfg.critic_max_tokens,
                              policy_config=mcfg)
    if hasattr(critic, "copy_from_policy"):  # engines.build does this for the trunk critics
        critic.copy_from_policy(policy)
    critic.pad_id = None  # random ids: pad (0) may be drawn
    return policy, ref, critic.to(args.device), cfg


def one_arm(arm: str, args) -> dict:
    import torch

    from rlhf.pipeline.decode import full_kl, response_logits, token_logprobs
    from rlhf.pipeline.ppo import core
    from rlhf.pipeline.ppo.critic import critic_loss, pack_right, response_values

    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    base_rss = rss_gb()
    policy, ref, critic, cfg = build(arm, args)
    opt_p = torch.optim.AdamW(policy.parameters(), lr=1e-5)  # as engines.build: every parameter
    opt_c = torch.optim.AdamW(critic.parameters(), lr=1e-5)
    gen = torch.Generator().manual_seed(1)
    pl, rl = args.seq_len // 2, args.seq_len - args.seq_len // 2
    vocab = policy.config.vocab_size
    q = torch.randint(1, vocab, (args.batch, pl), generator=gen).to(dev)
    resp = torch.randint(1, vocab, (args.batch, rl), generator=gen).to(dev)
    qm, rm = torch.ones_like(q), torch.ones_like(resp, dtype=torch.bool)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    policy.train()
    logits = response_logits(policy, q, qm, resp, rm, 1.0)
    with torch.no_grad():
        ref_logits = response_logits(ref, q, qm, resp, rm, 1.0)
    logp = token_logprobs(logits, resp)
    adv = torch.randn(logp.shape, generator=gen).to(dev)
    p_loss, _, _ = core.policy_loss(logp, logp.detach(), adv, rm, 0.2)
    p_loss = p_loss + 0.05 * core.masked_mean(full_kl(logits, ref_logits), rm)
    ids, mask, start = pack_right(q.tolist(), resp.tolist(), 0,
                                  None if critic.max_tokens is None else critic.max_tokens)
    ids, mask, start = ids.to(dev), mask.to(dev), start.to(dev)
    v = response_values(critic(ids, mask), mask, start, rl)
    returns = torch.randn(v.shape, generator=gen).to(dev)
    c_loss, _ = critic_loss(v, v.detach(), returns, rm, returns[:, -1], 0.2, 1.0, 0.01)
    (p_loss + c_loss).backward()
    opt_p.step()
    opt_c.step()
    seconds = time.perf_counter() - t0
    models = {"policy": policy, "critic": critic}
    params = [p for m in models.values() for p in m.parameters()]
    if arm.startswith("plain"):
        params += list(ref.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    adam = [t for o in (opt_p, opt_c) for s in o.state.values() for t in s.values()
            if torch.is_tensor(t) and t.dim() > 0]
    out = {"arm": arm, "ppo": {"critic": cfg.critic, "critic_layers": cfg.critic_layers,
                               "lora": vars(cfg.lora) if cfg.lora.enabled else None},
           **{f"{n}_params": sum(p.numel() for p in m.parameters()) for n, m in models.items()},
           **{f"{n}_trainable_params": sum(p.numel() for p in m.parameters() if p.requires_grad)
              for n, m in models.items()},
           "reference_params": (0 if arm.startswith("lora")
                                else sum(p.numel() for p in ref.parameters())),
           "weights_gb": sum(storages(params).values()) / 1e9,
           "grads_gb": sum(storages(grads).values()) / 1e9,
           "adam_gb": sum(storages(adam).values()) / 1e9, "step_s": round(seconds, 2)}
    out["trainable_params"] = out["policy_trainable_params"] + out["critic_trainable_params"]
    out["tensors_gb"] = out["weights_gb"] + out["grads_gb"] + out["adam_gb"]
    if dev.type == "cuda":
        out["peak_gpu_gb"] = torch.cuda.max_memory_allocated() / 1e9
    out.update({"rss_after_imports_gb": base_rss, "peak_rss_gb": rss_gb(),
                "peak_rss_over_imports_gb": rss_gb() - base_rss})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", choices=list(SCALES), default="world")
    ap.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    ap.add_argument("--critic-layers", type=int, default=0, help="shared: 0 = a quarter")
    ap.add_argument("--r", type=int, default=8, help="LoRA rank (alpha = 2r), all-linear")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=None, help="write the JSON here too")
    ap.add_argument("--arm", default=None, help=argparse.SUPPRESS)  # the child process
    args = ap.parse_args()
    if args.arm:
        print(json.dumps(one_arm(args.arm, args)))
        return
    results = []
    for arm in args.arms:  # each in a fresh process: a peak resident set is per process
        cmd = [sys.executable, __file__, *sys.argv[1:], "--arm", arm]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{arm}: {done.stderr.strip().splitlines()[-1]}")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), file=sys.stderr)
    report = {"command": "python bench/lora_bench.py " + " ".join(sys.argv[1:]),
              "machine": platform.processor() or platform.machine(), "device": args.device,
              "memory": "tensors counted (weights, grads, AdamW state after one step) and the "
                        "peak resident set (ru_maxrss) less the peak before the models were "
                        "built; "
                        "peak_gpu_gb: torch.cuda.max_memory_allocated",
              "settings": {k: v for k, v in vars(args).items() if k not in ("arm", "out")},
              "results": results}
    text = json.dumps(report, indent=1)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
