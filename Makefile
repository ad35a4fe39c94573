# The two commands: `make run` (the whole pipeline) and `make test` (the whole suite).
# Each does its own set-up on a machine that has only python3 and the package registries.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# Models never come from a hub at run time (README: "Offline by design").
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export PATH := $(CURDIR)/$(BIN):$(PATH)
# set-up installs without byte-compiling (below): let the first import write each .pyc
unexport PYTHONDONTWRITEBYTECODE
# One torch thread per stage unless you say otherwise: a stage's outputs (weights, samples) are
# byte-identical from run to run only at a fixed thread count, and the committed dvc.lock was
# made with one, so `make run` on a clean clone of a machine like ours leaves `git status` clean
# (docs/reliability.md). `make run RLHF_TORCH_THREADS=0` takes every core: faster, other bytes.
export RLHF_TORCH_THREADS ?= 1
# ... and a stage's independent, self-seeded jobs run in one process per core (0), each at that
# one thread: the reward stage's strong members and its distillation rollouts (drawn while the
# members train), eval's policies, difficulty's sampled batches; the strong RM ensemble scores
# its members in one thread per core; byte-identical to the inline run, both cores busy
# (pipeline/workers.py, pipeline/reward/scorer.py). Unset or 1: inline, as in the test suite
# (tests/conftest.py unsets it: its two workers already share the cores).
export RLHF_WORKERS ?= 0

.PHONY: run report test test-fast setup lock lint clean bench bench-all

setup: $(STAMP)

# torch goes first, on its own and pinned: `pip install torch==2.13.0` takes the CPU build
# (an unpinned torch, or uv/poetry, would download a multi-GB CUDA build). The lock is complete
# (`pip check` passes on it), so it installs with --no-deps, without a resolver pass. --no-compile:
# pip byte-compiles every file it installs (torch, transformers: tens of thousands), which was half
# of set-up; Python compiles a module when it is first imported instead, only what the pipeline
# imports (PYTHONDONTWRITEBYTECODE is unexported below so that it may write the .pyc). Measured in
# two clean clones on 2 cores under the same load: `make setup` 241 s before, 122 s after; the
# first import of torch+transformers+trl+dvc afterwards took 15 s longer, once.
$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip>=25" 2>&1 | grep -v "^WARNING: Location" || true
	$(BIN)/python -m pip install -q --no-compile torch==2.13.0 2>&1 | grep -v "^WARNING: Location" || true
	$(BIN)/python -m pip install -q --no-compile --no-deps -r requirements.lock 2>&1 | grep -v "^WARNING: Location" || true
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v "^WARNING: Location" || true
	$(BIN)/python -m pip check  # the lock installed without a resolver: is it complete?
	$(BIN)/python -c "import torch, trl, rlhf.store, rlhf.pipeline, rlhf.cli"
	touch $@

# SOURCE_DATE_EPOCH (reproducible-builds.org): the PPO store rows are stamped with this fixed
# time plus their step rather than the time of the run, so a rerun writes the committed bytes
# (pipeline/ppo/wallclock.py; `make run SOURCE_DATE_EPOCH=` stamps the real time).
SOURCE_DATE_EPOCH ?= 1767225600

# dvc repro's output passes through cli/repro_times.py, which ends with one line of each
# stage's seconds (pipefail: a failed stage still fails make run).
run: setup
	bash -o pipefail -c 'SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) $(BIN)/dvc repro 2>&1 \
	  | $(BIN)/python -m rlhf.cli.repro_times .dvc/tmp/stage_times.txt'
	@# the root pipeline only: a bare `dvc status` also lists the realdata profile's stages,
	@# which `make run` does not build (profiles/realdata/dvc.yaml)
	$(BIN)/dvc status dvc.yaml
	@# the last stage's verdict: SFT vs every PPO checkpoint (artifacts/eval/report.md)
	@sed -n '/^| step/,/^## Figures/p' artifacts/eval/report.md
	@echo "plots: artifacts/eval/gold_proxy_vs_kl.png, artifacts/eval/metrics_sft_vs_ppo.png;" \
	      "all of them: dvc plots show (dvc_plots/index.html); headline figures: dvc metrics show"
	@cat .dvc/tmp/stage_times.txt

# The figures no stage of `make run` reads (reports/dvc.yaml; README "make report"): each RM vs
# gold on fresh and on-policy samples, light vs strong, the speed ratio. Its upstream is `make
# run`'s pipeline: DVC reruns whatever of it is stale first.
report: setup
	bash -o pipefail -c 'SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) $(BIN)/dvc repro reports/dvc.yaml 2>&1 \
	  | $(BIN)/python -m rlhf.cli.repro_times .dvc/tmp/report_times.txt'
	$(BIN)/dvc metrics show artifacts/metrics/reward_figures.json
	@cat .dvc/tmp/report_times.txt

# Two pytest workers (pytest-xdist), a test file per worker at a time (its module fixtures
# trained once): each test's stages run at one torch thread, so one worker per core keeps both
# busy. `make test TEST_JOBS=0` runs in one process.
TEST_JOBS ?= 2
PYTEST := $(BIN)/python -m pytest -q $(if $(filter 0,$(TEST_JOBS)),,-n $(TEST_JOBS) --dist loadfile)

test: setup
	$(PYTEST)

# The edit-test loop: everything but the tests marked `slow` (the tiny trainings).
test-fast: setup
	$(PYTEST) -m "not slow"

# The rollout-economy benchmark (bench/dvc.yaml, docs/benchmarks.md), on `make run`'s artifacts:
# `bench` the headline arms x 3 seeds -> BENCHMARKS.md; `bench-all` every arm (and
# bench/BENCHMARKS_ALL.md). DVC reruns only the arms a change touches, two at a time (one
# core each); a second run runs nothing.
bench: setup
	$(BIN)/python -m bench.economy.dvc_stages --check
	@$(BIN)/dvc status dvc.yaml --quiet || { echo "bench: the pipeline's artifacts are not" \
	  "up to date (dvc status dvc.yaml): run make run first"; exit 1; }
	$(BIN)/python -m bench.economy.dvc_stages --run headline --jobs 2

bench-all: setup
	$(BIN)/python -m bench.economy.dvc_stages --check
	@$(BIN)/dvc status dvc.yaml --quiet || { echo "bench-all: the pipeline's artifacts are" \
	  "not up to date (dvc status dvc.yaml): run make run first"; exit 1; }
	$(BIN)/python -m bench.economy.dvc_stages --run all --jobs 2

# Re-resolve the lock from pyproject's ranges (then review the diff and commit it).
lock: setup
	$(BIN)/python -m pip install -q -e ".[dev]"
	$(BIN)/python -m pip freeze --exclude-editable | grep -v "^rlhf-pipeline" > requirements.lock

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf artifacts .dvc/cache .dvc/tmp
