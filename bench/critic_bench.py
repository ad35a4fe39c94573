"""Light vs full critic at equal settings: training-state memory and step time (seed 000 §3.2
claims 2.1 GB -> 0.8 GB and 2.3x faster for a 13B actor). Figures, not a pass/fail test.

    python bench/critic_bench.py                                  # a small Llama policy, CPU
    python bench/critic_bench.py --policy-config artifacts/world/model_config/config.json
    python bench/critic_bench.py --policy-hidden 2048 --policy-layers 16 --device cuda

For each critic it builds the model the trainer builds (`critic.build_critic`), then runs
`--steps` timed steps of forward + critic loss + backward + AdamW on random batches of
`--batch` sequences of `--seq-len` tokens (the light critic reads only its first 256). It
prints parameters, the fp32 training state (weights + grads + 2 AdamW moments = 16 bytes per
parameter), peak CUDA memory when on a GPU, and the median step time.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from rlhf.pipeline.ppo.critic import build_critic, critic_loss, pack_right, response_values


def policy_config(args):
    from transformers import AutoConfig, LlamaConfig

    if args.policy_config:
        return AutoConfig.from_pretrained(args.policy_config)
    return LlamaConfig(vocab_size=args.vocab, hidden_size=args.policy_hidden,
                       intermediate_size=int(args.policy_hidden * 2.75),
                       num_hidden_layers=args.policy_layers,
                       num_attention_heads=max(1, args.policy_hidden // 64),
                       num_key_value_heads=max(1, args.policy_hidden // 64),
                       max_position_embeddings=max(2048, args.seq_len), pad_token_id=0)


def bench(kind: str, cfg, args) -> dict:
    torch.manual_seed(0)
    device = torch.device(args.device)
    critic = build_critic(kind, cfg.vocab_size, 0, args.critic_hidden, 3, args.critic_heads, 256,
                          policy_config=cfg).to(device)
    if kind == "full":
        critic.pad_id = None
    opt = torch.optim.AdamW(critic.parameters(), lr=1e-5)
    n_params = sum(p.numel() for p in critic.parameters())
    g = torch.Generator().manual_seed(1)
    prompt_len, resp_len = args.seq_len // 2, args.seq_len - args.seq_len // 2
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(args.warmup + args.steps):
        prompts = torch.randint(1, cfg.vocab_size, (args.batch, prompt_len), generator=g).tolist()
        resps = torch.randint(1, cfg.vocab_size, (args.batch, resp_len), generator=g).tolist()
        window = 256 if kind == "light" else None
        ids, mask, start = pack_right(prompts, resps, 0, window)
        ids, mask, start = ids.to(device), mask.to(device), start.to(device)
        returns = torch.randn(args.batch, resp_len, device=device)
        rmask = torch.ones(args.batch, resp_len, dtype=torch.bool, device=device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        v = response_values(critic(ids, mask), mask, start, resp_len)
        loss, _ = critic_loss(v, v.detach(), returns, rmask, returns[:, -1], 0.2, 1.0, 0.01)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    out = {"critic": kind, "params": n_params, "train_state_gb": 16 * n_params / 1e9,
           "step_s_median": statistics.median(times)}
    if device.type == "cuda":
        out["peak_cuda_gb"] = torch.cuda.max_memory_allocated() / 1e9
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy-config", default=None)
    ap.add_argument("--policy-hidden", type=int, default=1024)
    ap.add_argument("--policy-layers", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--critic-hidden", type=int, default=1024)
    ap.add_argument("--critic-heads", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=384)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    cfg = policy_config(args)
    rows = [bench("light", cfg, args), bench("full", cfg, args)]
    light, full = rows
    print(json.dumps({"machine": platform.processor() or platform.machine(),
                      "device": args.device, "torch_threads": torch.get_num_threads(),
                      "settings": vars(args), "results": rows,
                      "memory_ratio_full_over_light": full["train_state_gb"] / light["train_state_gb"],
                      "speedup_light_over_full": full["step_s_median"] / light["step_s_median"]},
                     indent=1))


if __name__ == "__main__":
    main()
