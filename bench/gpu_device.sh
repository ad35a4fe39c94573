#!/usr/bin/env bash
# The one prepared run on a lent GPU machine (docs/gpus.md, "The device run"): the machine's
# image has torch (CUDA), transformers 5.17, accelerate, pyarrow... but no TRL, datasets or
# DeepSpeed, and no network; those travel as wheels in .git/info/exclude'd .whl/ (named in the
# run's carry). Steps, each with its own time limit inside one overall deadline:
#
#   A. install   the carried wheels into /tmp/site (PYTHONPATH), our package into /tmp/rlhf_site
#                (pip --target of the tree; if that build fails, a namespace of links to it)
#   B. deps      every carried wheel's needs met by what is there (the checker below, on the
#                installed distributions); the versions the code path imports, and their files
#   C. cpu_adam  JIT-build DeepSpeed's CPU Adam once (gpu_check's ZeRO-3 offload needs it); if it
#                cannot be built in time, step D runs ZeRO-3 without optimizer offload (torch
#                AdamW on the GPU) and says so
#   D. check     bash bench/gpu_check.sh: CUDA, bf16, attention, ZeRO-3 + 3 PPO steps
#   E. engine    bench/engine.py on a random-weight policy of Qwen2-0.5B's shape (24 layers,
#                hidden 896, 14/2 heads, vocab 151936, tied embeddings) built here with the tests'
#                byte-level tokenizer (tests/tiny_world.py), bf16 on the GPU: batches 16 and 64,
#                then 256 if time is left; the variants: hf, hf with the static
#                cache compiled (CUDA graphs), transformers' continuous batching (generate_batch),
#                native and static (pipeline/decode/static.py), with ms per step, tokens/s, host
#                syncs per step, shapes, captures and peak memory per variant
#
#   F. stages    bench/stages_gpu.py: every stage of profiles/realdata/dvc.yaml, its command as
#                written there, on a random base model of Qwen2-0.5B's shape with a ChatML
#                template, bf16 on the GPU (compute: auto): SFT 20 steps, RM 20 steps a member,
#                PPO 3 steps with LoRA and 3 without, eval on 16 prompts; per stage seconds, peak
#                GPU memory, the resolved device and dtype. The data is a realdata-shaped sample
#                it writes (../shared/realdata does not travel to the device), each stage has its
#                own time limit
#
# GPU_DEVICE_STEPS=engine runs A, B and E only (the engine figures: under 8 minutes with the
# set-up); GPU_DEVICE_STEPS=stages runs A, B and F only (the stages figures, likewise); the
# default, all, runs A to E as before.
#
# Results go to $OUT (at most 8 files): device.log (all output), deps.txt, ppo_run.tgz (the PPO
# run's log, summary, metrics, timings, params), engine_gpu.json, logprob_mismatch.json,
# engine_gpu_b256.json; with stages: stages_gpu.json and stages_logs.tgz (each run's log). The last
# lines printed are a table: each step ok / FAIL / SKIP, with its seconds and reason. Exit status:
# 0 when every step ran ok, else 1 (the later steps still run).
#
#   bash bench/gpu_device.sh --fetch-wheels       # here, once: .whl/ from requirements.lock's pins
#   bash bench/gpu_device.sh --check-wheels KINDS.md  # here: their needs met by the image's list?
#   GPU_DEVICE_REHEARSAL=1 bash bench/gpu_device.sh   # here: .venv, no installs, CPU, tiny shapes
#   bash bench/gpu_device.sh                      # on the device (python3 = the image's torch)
#   GPU_DEVICE_STEPS=engine bash bench/gpu_device.sh  # on the device: the engine figures only
#   GPU_DEVICE_STEPS=stages bash bench/gpu_device.sh  # on the device: the stages figures only
set -uo pipefail
SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "$SELF")/.."
# What the image lacks or has at a version this code breaks on (docs/gpus.md); versions from
# requirements.lock (peft: the image has one, of a version no test here ran with transformers
# 5.24; PPO's and the RMs' LoRA need it).
# deepspeed has only an sdist: --fetch-wheels builds a pure-Python wheel of it.
WHEELS="transformers trl datasets dill multiprocess fsspec hjson pydantic pydantic_core
annotated-types typing-inspection typing_extensions peft"

write_checker() {  # the wheel-needs checker, as a file: write_checker PATH
  cat > "$1" <<'CHECKER'
"""Are the Requires-Dist of every carried wheel met by (carried wheels + what is already there)?

    bash bench/gpu_device.sh --check-wheels KINDS.md   # here, before a run (--kinds)
    (step B of bench/gpu_device.sh)                     # on the device (--installed)

--kinds: "already there" = the nvidia-h200 image's package list in KINDS.md (names; versions
only where its pip-list row gives one: other constraints are reported as unknown, not failed).
--installed: "already there" = the distributions this interpreter sees (PYTHONPATH first, so
the carried copies in /tmp/site win, as they do at run time).
Markers are evaluated for CPython 3.12 on Linux x86_64; extras are skipped. Exit 1 on a
missing or unsatisfied requirement or on two versions of one wheel; unknown versions are notes.
"""

from __future__ import annotations

import argparse
import re
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
       "implementation_name": "cpython", "platform_python_implementation": "CPython",
       "extra": ""}


def wheel_meta(path: Path):
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        msg = Parser().parsestr(z.read(name).decode("utf-8"))
    return msg["Name"], msg["Version"], msg.get_all("Requires-Dist") or []


def kinds_packages(path: Path) -> dict[str, str | None]:
    text = path.read_text(encoding="utf-8")
    sec = text[text.index("## Python packages already there"):]
    names = sec[sec.index("Packages:") + len("Packages:"):].split("\n")[0]
    have = {canonicalize_name(n.strip().rstrip(".")): None for n in names.split(",") if n.strip()}
    row = next((ln for ln in text.splitlines() if ln.startswith("| pip list")), "")
    for n, v in re.findall(r"([A-Za-z0-9_.\-]+) (\d[0-9A-Za-z.+\-]*)(?=,| \|)", row):
        if canonicalize_name(n) in have:
            have[canonicalize_name(n)] = v
    return have


def installed_packages() -> dict[str, str | None]:
    from importlib import metadata

    have: dict[str, str | None] = {}
    for d in metadata.distributions():  # sys.path order: the first one found is the one imported
        n = d.metadata["Name"]
        if n:
            have.setdefault(canonicalize_name(n), d.version)
    return have


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("wheels", type=Path)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--kinds", type=Path, help="KINDS.md: the device image's package list")
    g.add_argument("--installed", action="store_true", help="this interpreter's distributions")
    ap.add_argument("--need", nargs="*", default=[],
                    help="also report these distributions (what the code path imports)")
    args = ap.parse_args()

    carried: dict[str, tuple[str, list[str], str]] = {}
    bad = 0
    for w in sorted(args.wheels.glob("*.whl")):
        name, version, reqs = wheel_meta(w)
        key = canonicalize_name(name)
        if key in carried:
            print(f"FAIL two versions of {name}: {carried[key][2]} and {w.name}")
            bad += 1
        carried[key] = (version, reqs, w.name)
    base = kinds_packages(args.kinds) if args.kinds else installed_packages()
    where = "KINDS.md" if args.kinds else "installed"
    print(f"{len(carried)} carried wheels; {len(base)} distributions already there ({where})")
    unknown = 0
    if args.installed:  # each carried wheel must be the copy this interpreter finds first
        for key, (version, _, fname) in sorted(carried.items()):
            if base.get(key) != version:
                print(f"FAIL {fname}: this interpreter finds {key} {base.get(key)}, not {version}")
                bad += 1
    for key, (version, reqs, fname) in sorted(carried.items()):
        for line in reqs:
            r = Requirement(line)
            if r.marker is not None and not r.marker.evaluate(ENV):
                continue  # an extra's, or another platform's
            rk = canonicalize_name(r.name)
            if rk in carried and not args.installed:
                v, src = carried[rk][0], "carried"
            elif rk in base:
                v, src = base[rk], where
            else:
                print(f"FAIL {fname}: needs {line}: not carried, not there")
                bad += 1
                continue
            if v is None:
                if r.specifier:
                    print(f"note {fname}: needs {r}: {src}, version unknown")
                    unknown += 1
            elif not r.specifier.contains(Version(v), prereleases=True):
                print(f"FAIL {fname}: needs {r}: {src} has {v}")
                bad += 1
    for n in args.need:
        k = canonicalize_name(n)
        src = ("carried " + carried[k][0]) if k in carried and not args.installed else (
            f"{where} {base[k] or '(version unknown)'}" if k in base else None)
        if src is None:
            print(f"FAIL needed by the code path: {n}: not carried, not there")
            bad += 1
        else:
            print(f"ok   {n}: {src}")
    print(f"{'FAIL' if bad else 'OK'}: {bad} unmet, {unknown} constraint(s) on versions unknown here")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
CHECKER
}

pin() {  # NAME==VERSION of a requirements.lock line, - and _ alike
  grep -i -E "^$(sed 's/[-_]/[-_]/g' <<<"$1")==" requirements.lock | head -1
}

if [[ ${1:-} == --fetch-wheels ]]; then
  ex=$(git rev-parse --git-path info/exclude) && mkdir -p "$(dirname "$ex")" || exit 1
  grep -qx '/.whl/' "$ex" 2>/dev/null || echo /.whl/ >> "$ex"
  mkdir -p .whl
  for name in $WHEELS; do
    spec=$(pin "$name") && [[ -n $spec ]] || { echo "no pin for $name in requirements.lock"; exit 1; }
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      --platform manylinux1_x86_64 -d .whl "$spec" || exit 1
  done
  spec=$(pin deepspeed) && sdist=$(mktemp -d) || exit 1
  python3 -m pip download -q --no-deps --no-binary=:all: -d "$sdist" "$spec" || exit 1
  # built by the .venv's python (its torch lets setup.py run); no ops compiled (DS_BUILD_OPS=0):
  # they JIT-compile where they run, as with the sdist installed there
  DS_BUILD_OPS=0 "${PYTHON:-.venv/bin/python}" -m pip wheel -q --no-deps --no-build-isolation \
    --no-index -w .whl "$sdist"/deepspeed-*.tar.gz || exit 1
  rm -rf "$sdist"
  ls -l .whl; du -cb .whl | tail -1
  exit 0
fi
if [[ ${1:-} == --check-wheels ]]; then
  write_checker /tmp/gpu_device_check_wheels.py
  exec "${PYTHON:-.venv/bin/python}" /tmp/gpu_device_check_wheels.py .whl --kinds "${2:?KINDS.md}"
fi
REHEARSAL=${GPU_DEVICE_REHEARSAL:-0}
OUT=${OUT:-/tmp/gpu_device_out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
if [[ -z ${GPU_DEVICE_LOGGED:-} ]]; then  # everything printed also goes to $OUT/device.log
  GPU_DEVICE_LOGGED=1 OUT=$OUT bash "$SELF" "$@" 2>&1 | tee "$OUT/device.log"
  exit "${PIPESTATUS[0]}"
fi
DEADLINE=$((SECONDS + ${GPU_DEVICE_SECONDS:-450}))  # every step's limit keeps inside this
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export HF_DATASETS_OFFLINE=1 DS_BUILD_OPS=0

if [[ $REHEARSAL == 1 ]]; then
  PY=${PYTHON:-.venv/bin/python}
  DEV=cpu DTYPE=float32 SHAPE=tiny BATCHES="4 8" REPEATS=2 NEW=12 BIG=16 MODE=--cpu
  # a CPU cannot capture CUDA graphs (hf-static-compile) and generate_batch idles ~60 s a call
  # there: the rehearsal runs the other variants through the same code
  VARIANTS="hf hf-static native static"
else
  PY=${PYTHON:-$(command -v python3)}
  DEV=cuda DTYPE=bfloat16 SHAPE=qwen2-0.5b BATCHES="16 64" REPEATS=3 NEW=64 BIG=256 MODE=
  VARIANTS="hf hf-static-compile hf-batch native static"
fi
STEPS=${GPU_DEVICE_STEPS:-all}
[[ $STEPS == all || $STEPS == engine || $STEPS == stages ]] || {
  echo "GPU_DEVICE_STEPS: all, engine or stages, got $STEPS"; exit 2; }
PY=$("$PY" -c 'import sys; print(sys.executable)')  # absolute: gpu_check.sh finds torchrun beside it
WORK=/tmp/gpu_device_work
rm -rf "$WORK"; mkdir -p "$WORK"

declare -a ROWS=()
FAILED=0
row() { ROWS+=("$(printf '%-9s %-5s %5ss  %s' "$1" "$2" "$3" "$4")"); [[ $2 == FAIL ]] && FAILED=1; }
left() { echo $((DEADLINE - SECONDS)); }
# limit CAP [RESERVE]: seconds for the next step, at most CAP, leaving RESERVE for later steps
limit() { local l=$(($(left) - ${2:-0})); ((l > $1)) && l=$1; ((l < 1)) && l=1; echo "$l"; }
say() { printf '\n===== %s (%ss left)\n' "$*" "$(left)"; }

main() {
  say "0. machine"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv \
    2>&1 || echo "(no nvidia-smi)"
  "$PY" -c 'import sys, torch; print(sys.version.split()[0], sys.executable, "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())'
  nproc; df -h /tmp | tail -1; command -v g++ gcc nvcc ninja || true
  "$PY" -c 'import os, sysconfig; h = os.path.join(sysconfig.get_paths()["include"], "Python.h"); print(h, "present" if os.path.exists(h) else "MISSING (CPU Adam cannot build)")'

  # ---- A. install
  say "A. install"
  local t=$SECONDS
  if [[ $REHEARSAL == 1 ]]; then
    row install SKIP 0 "rehearsal: the .venv's packages"
  elif ! ls .whl/*.whl >/dev/null 2>&1; then
    row install FAIL 0 "no .whl/*.whl here: name .whl in the run's carry"
  else
    rm -rf /tmp/site /tmp/rlhf_site  # a warm machine's earlier install must not stay
    if timeout "$(limit 120)" "$PY" -m pip install -q --no-index --no-deps --no-compile \
        --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; then
      export PYTHONPATH=/tmp/site
      local how=pip
      if ! timeout "$(limit 90)" "$PY" -m pip install -q --no-index --no-deps --no-compile \
          --no-build-isolation --no-cache-dir --target /tmp/rlhf_site . > "$WORK/pkg.log" 2>&1; then
        tail -5 "$WORK/pkg.log"
        how="links (pip install of the tree failed: see above)"
        rm -rf /tmp/rlhf_site; mkdir -p /tmp/rlhf_site/rlhf
        for d in store pipeline cli; do ln -s "$PWD/$d" "/tmp/rlhf_site/rlhf/$d"; done
      fi
      export PYTHONPATH=/tmp/rlhf_site:/tmp/site
      row install ok $((SECONDS - t)) "$(ls .whl/*.whl | wc -l) wheels -> /tmp/site; rlhf by $how"
    else
      row install FAIL $((SECONDS - t)) "pip install of the carried wheels failed (above)"
    fi
  fi

  # ---- B. deps
  say "B. deps (PYTHONPATH=${PYTHONPATH:-})"
  t=$SECONDS
  {
    if [[ $REHEARSAL != 1 ]]; then
      write_checker "$WORK/check_wheels.py"
      timeout "$(limit 60 300)" "$PY" "$WORK/check_wheels.py" .whl --installed --need torch \
        transformers trl datasets deepspeed accelerate huggingface-hub tokenizers safetensors \
        pyarrow pandas numpy scipy typer rich pyyaml jinja2 tensorboard psutil py-cpuinfo msgpack \
        einops ninja hjson pydantic xxhash dill multiprocess fsspec regex tqdm packaging setuptools \
        peft sentence-transformers tensorboard scikit-learn
      echo "check_deps exit: $?"
    fi
    timeout "$(limit 90 300)" "$PY" - <<'EOF'
import importlib

for m in ("torch", "transformers", "trl", "datasets", "deepspeed", "accelerate", "huggingface_hub",
          "tokenizers", "pyarrow", "pydantic", "peft", "sentence_transformers", "rlhf.cli.app",
          "rlhf.pipeline.ppo.trainer"):
    try:
        mod = importlib.import_module(m)
        print(f"import ok  {m:28s} {getattr(mod, '__version__', ''):14s} {mod.__file__}")
    except Exception as exc:
        print(f"import FAIL {m:28s} {type(exc).__name__}: {exc}")
EOF
    echo "imports exit: $?"
  } > "$OUT/deps.txt" 2>&1
  cat "$OUT/deps.txt"
  if grep -q -e "^import FAIL" -e "^imports exit: [^0]" "$OUT/deps.txt"; then
    row deps FAIL $((SECONDS - t)) "an import failed (deps.txt)"
  elif grep -q "^check_deps exit: [^0]" "$OUT/deps.txt"; then
    row deps FAIL $((SECONDS - t)) "a carried wheel's need is unmet (deps.txt)"
  else
    row deps ok $((SECONDS - t)) "imports ok; carried wheels' needs met"
  fi

  if [[ $STEPS == engine ]]; then
    row cpu_adam SKIP 0 "GPU_DEVICE_STEPS=engine"
    row check SKIP 0 "GPU_DEVICE_STEPS=engine"
    engine_step
    return
  fi
  if [[ $STEPS == stages ]]; then
    row cpu_adam SKIP 0 "GPU_DEVICE_STEPS=stages"
    row check SKIP 0 "GPU_DEVICE_STEPS=stages"
    row engine SKIP 0 "GPU_DEVICE_STEPS=stages"
    stages_step
    return
  fi
  # ---- C. cpu_adam
  say "C. DeepSpeed CPU Adam (JIT build)"
  t=$SECONDS
  unset GPU_CHECK_DEEPSPEED_CONFIG
  if timeout "$(limit 150 250)" "$PY" -c '
from deepspeed.ops.op_builder import CPUAdamBuilder
CPUAdamBuilder().load(verbose=True)
print("cpu_adam loaded")' > "$WORK/cpu_adam.log" 2>&1; then
    row cpu_adam ok $((SECONDS - t)) "built or cached (~/.cache/torch_extensions)"
  else
    local rc=$?
    tail -25 "$WORK/cpu_adam.log"
    "$PY" - "$WORK/ds_no_offload.json" <<'EOF'
import json
import sys

d = json.load(open("configs/deepspeed_zero3.json"))
d["zero_optimization"].pop("offload_optimizer", None)
json.dump(d, open(sys.argv[1], "w"), indent=1)
EOF
    export GPU_CHECK_DEEPSPEED_CONFIG=$WORK/ds_no_offload.json
    local why="exit $rc"; ((rc == 124)) && why="timed out"
    row cpu_adam FAIL $((SECONDS - t)) "$why: ZeRO-3 below runs without optimizer offload"
  fi

  # ---- D. gpu_check.sh
  say "D. bench/gpu_check.sh $MODE"
  t=$SECONDS
  local cap
  cap=$(limit 270 130)
  if ((cap < 60)); then
    row check SKIP 0 "only ${cap}s left before the engine timing"
  else
    PYTHON=$PY GPU_CHECK_DIR=$WORK/check GPU_CHECK_PPO_TIMEOUT=$((cap - 45)) \
      timeout "$cap" bash bench/gpu_check.sh $MODE
    local rc=$?
    local note="CUDA, bf16, attention, ZeRO-3, 3 PPO steps"
    [[ -n ${GPU_CHECK_DEEPSPEED_CONFIG:-} ]] && note="$note (ZeRO-3 WITHOUT optimizer offload)"
    if ((rc == 0)); then row check ok $((SECONDS - t)) "$note"
    else row check FAIL $((SECONDS - t)) "exit $rc$( ((rc == 124)) && echo ' (timed out)'): see above"
    fi
    (cd "$WORK/check" 2>/dev/null && tar czf "$OUT/ppo_run.tgz" --ignore-failed-read ppo.log \
      params.yaml run/summary.json run/metrics.jsonl run/timings.jsonl 2>/dev/null)
  fi

  engine_step
}

engine_step() {
  # ---- E. engine timing
  say "E. engine timing: random $SHAPE policy, $DEV $DTYPE"
  local t=$SECONDS
  if ! PYTHONPATH="tests${PYTHONPATH:+:$PYTHONPATH}" timeout "$(limit 90 20)" "$PY" - \
      "$WORK/policy" "$DEV" "$SHAPE" <<'EOF'
import json
import sys
import time
from pathlib import Path

import torch
from tiny_world import write_tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config

out, device, shape = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
t0 = time.time()
tok = AutoTokenizer.from_pretrained(write_tokenizer(out))  # the tests' byte-level BPE: pad 0, bos 1, eos 2
dims = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
            num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768)
if shape == "tiny":
    dims = dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
cfg = Qwen2Config(**dims, tie_word_embeddings=True, rms_norm_eps=1e-6,
                  pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                  eos_token_id=tok.eos_token_id)
torch.manual_seed(0)
with torch.device(device):
    model = AutoModelForCausalLM.from_config(
        cfg, dtype=torch.bfloat16 if device == "cuda" else torch.float32).eval()
# random weights never say eos: raise its logit along the mean final hidden state until eos has
# probability 1/40 per token at the bench's temperature 0.8, so rows end at varied lengths
# (bench/engine.py's tiny_policy does the same) and stopped rows leaving the batch matters. The
# hidden states it is fitted on are those of sampled continuations of the bench's own prompts
# (a first version fitted on random token ids, and no row of the bench ever stopped)
from rlhf.pipeline.decode import encode_prompts
eos, T, target = tok.eos_token_id, 0.8, 1 / 40
with torch.no_grad():
    w = model.get_output_embeddings().weight
    w[eos] = 0
    torch.manual_seed(1)
    enc = {k: v.to(device) for k, v in encode_prompts(
        tok, [f"tell me about item {i}" for i in range(16)]).items()}
    seq = model.generate(**enc, do_sample=True, temperature=T, top_p=0.95, top_k=0,
                         max_new_tokens=48, min_new_tokens=48, pad_token_id=tok.pad_token_id)
    P = enc["input_ids"].shape[1]
    full_mask = torch.cat([enc["attention_mask"], torch.ones_like(seq[:, P:])], 1)
    h = model.model(input_ids=seq, attention_mask=full_mask).last_hidden_state
    h = h[:, P - 1:-1].float().flatten(0, 1)                       # [N, d]: generated positions
    logits = h @ w.float().T
    logits[:, eos] = -float("inf")
    lse = torch.logsumexp(logits / T, -1)
    u = h.mean(0) / h.mean(0).norm()
    proj = h @ u
    lo, hi = 0.0, 1e4
    for _ in range(60):
        c = (lo + hi) / 2
        prob = torch.sigmoid(c * proj / T - lse).mean().item()
        lo, hi = (c, hi) if prob < target else (lo, c)
    w[eos] = (c * u).to(w.dtype)
model.save_pretrained(out)
n = sum(p.numel() for p in model.parameters())
info = {"shape": shape, "params": n, "dtype": str(model.dtype), "eos_scale": round(c, 3),
        "eos_prob_probe": round(prob, 4),
        "positions_with_positive_projection": round((proj > 0).float().mean().item(), 3),
        "seconds": round(time.time() - t0, 1)}
print("policy", out, json.dumps(info))
EOF
  then
    row engine FAIL $((SECONDS - t)) "building the random policy failed (above)"
    return
  fi
  local cap1
  cap1=$(limit "$([[ $STEPS == engine ]] && echo 300 || echo 200)" 5)  # engine only: more room
  if timeout "$cap1" "$PY" bench/engine.py --policy "$WORK/policy" --device "$DEV" --dtype "$DTYPE" \
      --batches $BATCHES --repeats "$REPEATS" --max-new-tokens "$NEW" --drafts \
      --variants $VARIANTS --json "$OUT/engine_gpu.json"; then
    row engine ok $((SECONDS - t)) "batches $BATCHES x $REPEATS repeats, $NEW new tokens: engine_gpu.json"
  else
    local rc=$?
    row engine FAIL $((SECONDS - t)) "exit $rc$( ((rc == 124)) && echo " (timed out at ${cap1}s)")"
    return
  fi
  t=$SECONDS  # the engines' old log-probs against the trainer's forward, this dtype
  if timeout "$(limit 60 5)" "$PY" bench/logprob_mismatch.py --policy "$WORK/policy" \
      --device "$DEV" --dtype "$DTYPE" --batch 16 --max-new-tokens "$NEW" \
      --json "$OUT/logprob_mismatch.json"; then
    row mismatch ok $((SECONDS - t)) "logprob_mismatch.json"
  else
    row mismatch FAIL $((SECONDS - t)) "exit $?"
  fi
  t=$SECONDS
  local cap2
  cap2=$(limit 150 5)
  if ((cap2 < 60)); then
    row "engine$BIG" SKIP 0 "only ${cap2}s left"
  elif timeout "$cap2" "$PY" bench/engine.py --policy "$WORK/policy" --device "$DEV" \
      --dtype "$DTYPE" --batches "$BIG" --repeats 2 --max-new-tokens "$NEW" --drafts \
      --variants $VARIANTS --json "$OUT/engine_gpu_b$BIG.json"; then
    row engine$BIG ok $((SECONDS - t)) "batch $BIG x 2 repeats: engine_gpu_b$BIG.json"
  else
    local rc=$?
    row engine$BIG FAIL $((SECONDS - t)) "exit $rc$( ((rc == 124)) && echo " (timed out at ${cap2}s)")"
  fi
}

stages_step() {
  # ---- F. the realdata profile's stages (bench/stages_gpu.py writes the JSON after every run)
  say "F. stages: the realdata profile on a random $SHAPE base model, $DEV"
  local t=$SECONDS cap rc=0
  cap=$(limit 420 5)
  PYTHONPATH="tests${PYTHONPATH:+:$PYTHONPATH}" timeout "$cap" "$PY" bench/stages_gpu.py \
    --work "$WORK/stages" --seconds $((cap - 15)) --json "$OUT/stages_gpu.json" \
    --logs "$OUT/stages_logs.tgz" --table "$WORK/stages_table.txt" \
    $([[ $REHEARSAL == 1 ]] && echo --rehearsal) || rc=$?
  local n s sec note
  while read -r n s sec note; do  # one summary row per run
    row "  $n" "$s" "$sec" "$note"
  done < <(cat "$WORK/stages_table.txt" 2>/dev/null)
  if ((rc == 0)); then row stages ok $((SECONDS - t)) "stages_gpu.json"
  else
    row stages FAIL $((SECONDS - t)) "exit $rc$( ((rc == 124)) && echo " (timed out at ${cap}s)")"
  fi
}

main
say "summary ($SECONDS s in all)"
printf '%s\n' "${ROWS[@]}"
exit "$FAILED"
