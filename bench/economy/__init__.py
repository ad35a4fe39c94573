"""The rollout-economy benchmark (docs/benchmarks.md): held-out gold against generated tokens,
arm by arm, seed by seed, written to BENCHMARKS.md. Run from the repository root:

    .venv/bin/python -m bench.economy --quick --out /tmp/q      # the command line (driver.py)
    .venv/bin/python -m bench.economy.dvc_stages --check         # bench/dvc.yaml is up to date

The modules: `arms` (the arms and their switches), `prepare` (the setup every job shares),
`results` (a job's saved result, its spec and provenance), `job` (one arm x seed trained and
scored), `driver` (the command line and the job scheduler), `dvc_stages` (bench/dvc.yaml, `make
bench`), `report` and `figures` (BENCHMARKS.md), `stats` (its arithmetic), `freshness` (were its
inputs `make run`'s), `peers` (TRL's GRPO and RLOO), `sample`, `schedule` and `tiers` (the
features' own figures), `world` (the --quick world).
"""

import os

# set before a job imports torch or transformers (every job is a process of this package)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RLHF_TORCH_THREADS", "1")
