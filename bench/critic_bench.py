"""Every critic design against the full critic at equal settings: parameters, training-state
memory and step time (seed 000 §3.2 claims 38 % of the memory and 2.3x the speed). Figures, not
a pass/fail test.

    python bench/critic_bench.py --scale world              # the embedded world's policy, CPU
    python bench/critic_bench.py --scale qwen05b --batch 1  # a Qwen2-0.5B-shaped policy
    python bench/critic_bench.py --policy-config path/to/config.json --device cuda

For each design it builds the model the trainer builds (`critic.build_critic`, random weights:
this measures cost, not quality), then runs `--rounds` interleaved rounds (one step of every
design per round, so load from other processes hits them all alike) of forward + critic loss +
backward + AdamW over `--batch` random sequences of `--seq-len` tokens (half prompt, half
response; light/trunk/shared read only the first 256). Memory is measured, not assumed: weights
(every parameter, frozen ones too), gradients and AdamW state (the tensors the optimiser holds
after a step) and the activations autograd saved for the backward (bytes of distinct storages
seen by a saved-tensor hook in one forward). Activations are linear in the batch at a fixed
length, so `--ppo-batch` (the trainer's mini_batch_size) scales them from `--batch`.
Step time: the median over rounds; on a shared machine read it with care.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from rlhf.pipeline.ppo.critic import build_critic, critic_loss, pack_right, response_values

sys.path.insert(0, str(Path(__file__).parent))
from model_shapes import SCALES, shape_config

DESIGNS = ("full", "light", "trunk", "shared")


def policy_config(args):
    from transformers import AutoConfig

    if args.policy_config:
        return AutoConfig.from_pretrained(args.policy_config)
    return shape_config(args.scale)


def saved_bytes(fn, params) -> tuple[object, int]:
    """fn()'s result and the bytes of the distinct storages autograd saved while it ran, less
    the parameters' own storages (a linear layer saves its weight: that is no activation)."""
    weights = {p.untyped_storage().data_ptr() for p in params}
    seen: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in weights:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen.values())


def tensor_bytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts if torch.is_tensor(t))


class Bench:
    """One design: its model, optimiser and measurements."""

    def __init__(self, kind: str, cfg, args):
        torch.manual_seed(0)
        self.kind, self.args, self.device = kind, args, torch.device(args.device)
        layers = args.light_layers if kind == "light" else args.critic_layers
        self.model = build_critic(kind, cfg.vocab_size, 0, args.light_hidden, layers,
                                  args.light_heads, 256, policy_config=cfg).to(self.device)
        self.model.pad_id = None  # random token ids: pad (0) may be drawn
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-5)
        self.vocab, self.times, self.act = cfg.vocab_size, [], 0
        self.gen = torch.Generator().manual_seed(1)

    def step(self, timed: bool) -> None:
        a, dev = self.args, self.device
        pl, rl = a.seq_len // 2, a.seq_len - a.seq_len // 2
        prompts = torch.randint(1, self.vocab, (a.batch, pl), generator=self.gen).tolist()
        resps = torch.randint(1, self.vocab, (a.batch, rl), generator=self.gen).tolist()
        ids, mask, start = pack_right(prompts, resps, 0, None if self.kind == "full" else 256)
        ids, mask, start = ids.to(dev), mask.to(dev), start.to(dev)
        returns = torch.randn(a.batch, rl, device=dev)
        rmask = torch.ones(a.batch, rl, dtype=torch.bool, device=dev)
        self.model.train()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out, act = saved_bytes(lambda: self.model(ids, mask), self.model.parameters())
        v = response_values(out, mask, start, rl)
        loss, _ = critic_loss(v, v.detach(), returns, rmask, returns[:, -1], 0.2, 1.0, 0.01)
        loss.backward()
        self.grad_bytes = tensor_bytes(p.grad for p in self.model.parameters())
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        if timed:
            self.times.append(time.perf_counter() - t0)
        self.act = act

    def result(self) -> dict:
        a = self.args
        params = list(self.model.parameters())
        n = sum(p.numel() for p in params)
        trainable = sum(p.numel() for p in params if p.requires_grad)
        weights = tensor_bytes(params)
        adam = sum(tensor_bytes(s.values()) for s in self.opt.state.values())
        act_ppo = self.act * a.ppo_batch / a.batch
        state = weights + self.grad_bytes + adam + act_ppo
        return {"critic": self.kind, "params": n, "trainable_params": trainable,
                "weights_gb": weights / 1e9, "grads_gb": self.grad_bytes / 1e9,
                "adam_gb": adam / 1e9, f"activations_gb_at_batch_{a.ppo_batch}": act_ppo / 1e9,
                "train_state_gb": state / 1e9, "step_s_median": statistics.median(self.times),
                "step_s_all": [round(t, 4) for t in self.times]}


def markdown(results: list[dict], ppo_batch: int) -> str:
    """The results as the table docs/critic.md shows."""
    lines = ["| critic | params | trainable | weights GB | grads GB | Adam GB | activations GB "
             "| train state GB | memory vs full | step s (median) | speed vs full |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(
            f"| {r['critic']} | {r['params']:,} | {r['trainable_params']:,} "
            f"| {r['weights_gb']:.4f} | {r['grads_gb']:.4f} | {r['adam_gb']:.4f} "
            f"| {r[f'activations_gb_at_batch_{ppo_batch}']:.4f} | {r['train_state_gb']:.4f} "
            f"| {r.get('memory_vs_full', float('nan')):.2f} | {r['step_s_median']:.3f} "
            f"| {r.get('speedup_vs_full', float('nan')):.1f}x |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", choices=list(SCALES), default="world")
    ap.add_argument("--policy-config", default=None, help="a config.json instead of --scale")
    ap.add_argument("--designs", nargs="+", choices=DESIGNS, default=list(DESIGNS))
    ap.add_argument("--critic-layers", type=int, default=0,
                    help="trunk/shared: the policy's layers kept (0 = a quarter)")
    ap.add_argument("--light-hidden", type=int, default=256)
    ap.add_argument("--light-layers", type=int, default=3)
    ap.add_argument("--light-heads", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8, help="sequences per timed step")
    ap.add_argument("--ppo-batch", type=int, default=8, help="the minibatch activations scale to")
    ap.add_argument("--seq-len", type=int, default=112, help="prompt + response tokens")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--one-at-a-time", action="store_true",
                    help="build, run and free one design at a time (large shapes): rounds are "
                         "then consecutive, not interleaved")
    ap.add_argument("--markdown", action="store_true", help="print a table, not JSON")
    args = ap.parse_args()
    cfg = policy_config(args)
    results = {}
    if args.one_at_a_time:
        for kind in args.designs:
            b = Bench(kind, cfg, args)
            for i in range(args.warmup + args.rounds):
                b.step(timed=i >= args.warmup)
            results[kind] = b.result()
            del b
            gc.collect()
    else:
        benches = [Bench(k, cfg, args) for k in args.designs]
        for i in range(args.warmup + args.rounds):
            for b in benches:
                b.step(timed=i >= args.warmup)
        results = {b.kind: b.result() for b in benches}
    full = results.get("full")
    for r in results.values():
        if full:
            r["memory_vs_full"] = r["train_state_gb"] / full["train_state_gb"]
            r["speedup_vs_full"] = full["step_s_median"] / r["step_s_median"]
    if args.markdown:
        print(markdown(list(results.values()), args.ppo_batch))
        return
    print(json.dumps({"machine": platform.processor() or platform.machine(),
                      "device": args.device, "torch_threads": torch.get_num_threads(),
                      "policy_layers": cfg.num_hidden_layers, "settings": vars(args),
                      "results": list(results.values())}, indent=1))


if __name__ == "__main__":
    main()
