#!/usr/bin/env bash
# Does the scale-out path start on this GPU machine? One prepared check, meant to take under 5
# minutes on one GPU (README "Scale-out"). Run from anywhere, after `make setup` (+ flash-attn
# and a CUDA torch on the GPU machine):
#
#   bash bench/gpu_check.sh          # all checks; needs a GPU; exits non-zero at the first failure
#   bash bench/gpu_check.sh --cpu    # the CPU-safe parts only (4 and 5 on one CPU process)
#
#   1. CUDA   torch sees a GPU: name, compute capability, memory
#   2. bf16   supported, and a bf16 matmul agrees with fp32
#   3. attn   flash-attention 2 imports and runs the tiny policy's forward; else SDPA does
#   4. ZeRO-3 `rlhf ppo` with ppo.sharding zero3 under torchrun starts its engines (policy and
#             critic: DeepSpeed ZeRO-3, optimizer offloaded to the CPU, fp16 communication; the
#             reference: an inference engine), bf16 on the GPU
#   5. PPO    3 steps on the tiny world of tests/ppo_tiny.py; prints seconds and peak GPU memory
#             per phase (generate, score, logprobs, critic, update, records) for every step
#
# The first ZeRO-3 start on a machine JIT-compiles DeepSpeed's CPU Adam (ninja + a C++ compiler;
# minutes on few cores, cached in ~/.cache/torch_extensions afterwards).
#
# Environment: PYTHON (default .venv/bin/python; its folder's torchrun, else `PYTHON -m
# torch.distributed.run`), GPU_CHECK_DIR (default a new temporary folder), MASTER_PORT,
# GPU_CHECK_DEEPSPEED_CONFIG (another DeepSpeed JSON for step 4, passed as --deepspeed-config;
# bench/gpu_device.sh passes one without optimizer offload when CPU Adam cannot be built there),
# GPU_CHECK_PPO_TIMEOUT (seconds for steps 4-5, default 240). A PYTHONPATH set by the caller
# (wheels installed with pip --target) is kept, after tests/.
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=gpu
if [[ "${1:-}" == "--cpu" ]]; then MODE=cpu; fi
PY=${PYTHON:-.venv/bin/python}
TORCHRUN=("$(dirname "$PY")/torchrun")
[[ -x ${TORCHRUN[0]} ]] || TORCHRUN=("$PY" -m torch.distributed.run)
DS_ARGS=()
if [[ -n ${GPU_CHECK_DEEPSPEED_CONFIG:-} ]]; then
  DS_ARGS=(--deepspeed-config "$GPU_CHECK_DEEPSPEED_CONFIG")
fi
WORK=${GPU_CHECK_DIR:-$(mktemp -d)}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONHASHSEED=0
say() { printf '\n== %s\n' "$*"; }
start=$SECONDS

say "0. tiny world in $WORK"
PYTHONPATH="tests${PYTHONPATH:+:$PYTHONPATH}" "$PY" - "$WORK" <<'EOF'
import sys
from pathlib import Path

import ppo_tiny

world = ppo_tiny.build_world(Path(sys.argv[1]) / "world")
print("policy", world["policy"], "reward", world["reward"])
EOF

ATTN=eager
if [[ $MODE == gpu ]]; then
  say "1-3. CUDA, bf16, attention"
  ATTN=$("$PY" - "$WORK/world/policy" <<'EOF'
import sys

import torch

if not torch.cuda.is_available():
    sys.exit("1. CUDA: FAIL, torch.cuda.is_available() is False "
             f"(torch {torch.__version__}, built for CUDA {torch.version.cuda})")
p = torch.cuda.get_device_properties(0)
print(f"1. CUDA: ok, {torch.cuda.device_count()} x {p.name}, capability {p.major}.{p.minor}, "
      f"{p.total_memory / 2**30:.1f} GiB, torch {torch.__version__} CUDA {torch.version.cuda}",
      file=sys.stderr)
if not torch.cuda.is_bf16_supported():
    sys.exit("2. bf16: FAIL, not supported on this GPU")
a = torch.randn(256, 256, device="cuda")
err = ((a.bfloat16() @ a.bfloat16()).float() - a @ a).abs().max().item()
if not err < 1.0:
    sys.exit(f"2. bf16: FAIL, bf16 matmul differs from fp32 by {err}")
print(f"2. bf16: ok (max |bf16 - fp32| of a 256x256 matmul: {err:.3f})", file=sys.stderr)

from transformers import AutoModelForCausalLM

ids = torch.tensor([[2, 5, 6, 7, 3]], device="cuda")
chosen = "sdpa"
try:
    import flash_attn

    m = AutoModelForCausalLM.from_pretrained(sys.argv[1], attn_implementation="flash_attention_2",
                                             torch_dtype=torch.bfloat16).cuda()
    m(input_ids=ids)
    chosen = "flash_attention_2"
    print(f"3. attention: ok, flash-attention {flash_attn.__version__} runs", file=sys.stderr)
except Exception as exc:  # not installed, or no kernel for this GPU: say which, fall back
    print(f"3. attention: flash-attention 2 unavailable ({type(exc).__name__}: {exc}); "
          "trying SDPA", file=sys.stderr)
    m = AutoModelForCausalLM.from_pretrained(sys.argv[1], attn_implementation="sdpa",
                                             torch_dtype=torch.bfloat16).cuda()
    m(input_ids=ids)
    print("3. attention: ok, SDPA runs", file=sys.stderr)
print(chosen)
EOF
)
  ATTN=${ATTN##*$'\n'}  # its last line: an import that prints to stdout must not become the name
  export ACCELERATE_MIXED_PRECISION=bf16
else
  say "1-3. skipped (--cpu): no GPU checks"
fi

say "4-5. ZeRO-3 start-up and 3 PPO steps (attention: $ATTN, $MODE)"
PYTHONPATH="tests${PYTHONPATH:+:$PYTHONPATH}" "$PY" - "$WORK" "$ATTN" <<'EOF'
import sys
from pathlib import Path

import ppo_tiny

ppo_tiny.write_params(Path(sys.argv[1]) / "params.yaml", total_steps=3, batch_size=4,
                      mini_batch_size=2, checkpoint_every=3, csv_every=1, sharding="zero3",
                      gradient_accumulation_steps=1, attn_implementation=sys.argv[2])
EOF
timeout "${GPU_CHECK_PPO_TIMEOUT:-240}" "${TORCHRUN[@]}" --nproc_per_node 1 \
  --master_port "${MASTER_PORT:-29541}" \
  -m rlhf.cli.app ppo --policy "$WORK/world/policy" --reward "$WORK/world/rm" \
  --prompts "$WORK/world/prompts.jsonl" --out "$WORK/run" --rollouts "$WORK/rows" \
  --params "$WORK/params.yaml" --run-id gpu_check ${DS_ARGS[@]+"${DS_ARGS[@]}"} > "$WORK/ppo.log" 2>&1 \
  || { tail -40 "$WORK/ppo.log"; echo "4-5. FAIL: rlhf ppo under ZeRO-3 (log: $WORK/ppo.log)"; exit 1; }

"$PY" - "$WORK/run" "$MODE" <<'EOF'
import json
import sys
from pathlib import Path

run, mode = Path(sys.argv[1]), sys.argv[2]
e = json.loads((run / "summary.json").read_text())["engines"]
ok = (e["sharding"] == "zero3" and e["zero_stage"] == 3 and e["offload_param"] == "none"
      and e["engines"]["ref"].startswith("deepspeed"))
print(f"4. ZeRO-3: {'ok' if ok else 'FAIL'}, {json.dumps(e)}")
steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
# the wall-clock figures live beside the metrics, keyed by step (pipeline/ppo/wallclock.py)
timings = {t["step"]: t for t in map(json.loads, (run / "timings.jsonl").read_text().splitlines())}
steps = [{**m, **timings.get(m["step"], {})} for m in steps]
phases = ("generate", "score", "logprobs", "critic", "update", "records")
print(f"5. PPO: {'ok' if len(steps) == 3 else 'FAIL'}, {len(steps)} steps")
print("   step " + " ".join(f"{p:>17}" for p in phases))
for m in steps:
    cells = []
    for p in phases:
        gib = m.get(f"gpu_peak_gib_{p}")
        cells.append(f"{m[f'seconds_{p}']:7.2f}s " + (f"{gib:6.3f}GiB" if gib is not None
                                                       else "   n/a   "))
    print(f"   {m['step']:>4} " + " ".join(f"{c:>17}" for c in cells))
if mode == "cpu":
    print("   (memory per phase is GPU memory: n/a on CPU)")
sys.exit(0 if ok and len(steps) == 3 else 1)
EOF
say "done in $((SECONDS - start)) s ($MODE); work folder $WORK"
