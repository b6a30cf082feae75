# hpo-orchestrator: `make hpo` (run the default study), `make test`, `make lint`.
PYTHON ?= python3
VENV ?= .venv
PAR ?= 4
ARGS ?=
# CPU machines get PyTorch's CPU build (no multi-GB CUDA download). On a GPU machine whose
# Python already has a CUDA torch, create the venv with VENV_FLAGS=--system-site-packages.
TORCH_SPEC ?= torch==2.13.0
VENV_FLAGS ?=

BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: hpo install test test-fast test-gpu lint mutation bench bench-gpu bench-packing clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

hpo: $(STAMP)
	$(BIN)/hpo-orchestrator run scheduler.parallel=$(PAR) $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not gpu" $(PYTEST_ARGS)

# Unit tests only: no study in subprocesses (those are marked slow; tests/conftest.py fails an
# unmarked test that runs one).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not gpu and not slow" $(PYTEST_ARGS)

# Fails when no GPU test ran (every one skipped or deselected): see tests/conftest.py.
test-gpu: $(STAMP)
	HPO_TEST_REQUIRE_GPU=1 $(BIN)/python -m pytest -q -m gpu -rs $(PYTEST_ARGS)

# Mutation testing: each edit of tests/mutations/*.toml applied alone to a scratch copy, its
# guarding tests run; fails when any survives (docs/MUTATION.md). MUTATION_ARGS='--only NAME'.
mutation: $(STAMP)
	$(BIN)/python scripts/mutation.py $(MUTATION_ARGS)

# Benchmarks (not tests: they time things); results go to docs/BENCHMARKS.md.
bench: $(STAMP)
	$(BIN)/python scripts/bench_status.py
	$(BIN)/python scripts/bench_sampler.py
	$(BIN)/python scripts/bench_scheduling.py

# Benchmark 4 (needs NVIDIA GPUs; see docs/BENCHMARKS.md).
bench-gpu: $(STAMP)
	$(BIN)/python scripts/bench_gpu.py --trials 12

# trials_per_gpu = 1, 2, 3, 4 and auto on the same fixed workloads (needs NVIDIA GPUs; about 8
# minutes on one H100). OUT: the results folder (results.md, results.json, one log per run).
OUT ?= bench-packing
bench-packing: $(STAMP)
	$(BIN)/python scripts/bench_packing.py --out $(OUT)

lint: $(STAMP)
	$(BIN)/ruff check hpo_orchestrator tests scripts
	$(BIN)/mypy hpo_orchestrator

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache .mypy_cache
