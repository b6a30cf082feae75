# hpo-orchestrator: `make hpo` (run the default study), `make status`, `make report`,
# `make logs TRIAL=N`, `make test` (`make test-long` for the longest tests), `make lint`. (Or `. .venv/bin/activate` once, then the
# hpo-orchestrator command itself.)
PYTHON ?= python3
# From another folder (`make -f path/to/Makefile hpo`, e.g. where your objective's package
# is): the checkout's venv and package, and the study's files (hpo.db, hpo-runs/) in the
# current folder. The checkout's own targets (tests, lint, benchmarks) say to use make -C.
ROOT := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
HERE := $(if $(filter $(ROOT),$(CURDIR)),,$(ROOT)/)
CHECKOUT_ONLY := test test-long test-fast test-gpu lint mutation mutants bench bench-gpu bench-packing bench-quality clean
ifneq ($(HERE),)
ifneq ($(filter $(CHECKOUT_ONLY),$(MAKECMDGOALS)),)
$(error '$(filter $(CHECKOUT_ONLY),$(MAKECMDGOALS))' runs in the checkout: use 'make -C $(ROOT) $(MAKECMDGOALS)')
endif
endif
VENV ?= $(HERE).venv
# How the commands this Makefile runs suggest running it again: from another folder the
# user's own folder has no Makefile, so `make status` would find no rule there.
export HPO_MAKE := make$(if $(HERE), -f $(ROOT)/Makefile)
# Trials at once; empty: every GPU the run is given, once each (one per core without GPUs).
PAR ?=
ARGS ?=
# PyTorch's CPU build comes from PyTorch's own CPU wheel index (from PyPI alone, torch on
# Linux is the CUDA build, with ~19 nvidia-* packages, several GB); where that index cannot be
# reached, pip falls back to the configured indexes (PyPI, or a local wheelhouse). On a GPU
# machine whose Python already has a CUDA torch, create the venv with VENV_FLAGS=--system-site-packages.
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
VENV_FLAGS ?=
TRIAL ?=

BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: hpo status report logs install test test-long test-fast test-gpu lint mutation mutants bench bench-gpu bench-packing bench-quality clean

$(STAMP): $(HERE)pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null \
	  || $(BIN)/python -m pip install -q --retries 0 --timeout 15 --index-url "$(TORCH_INDEX)" "$(TORCH_SPEC)" \
	  || { echo "PyTorch's CPU index unreachable: installing $(TORCH_SPEC) from the configured indexes"; \
	       $(BIN)/python -m pip install -q "$(TORCH_SPEC)"; }
	$(BIN)/python -m pip install -q -e "$(if $(HERE),$(ROOT),.)[dev]"
	@# the package's bytecode, once: where PYTHONDONTWRITEBYTECODE is set, every run would
	@# compile it again (0.15 s of each start-up on 2 cores)
	$(BIN)/python -m compileall -q "$(if $(HERE),$(ROOT),.)/hpo_orchestrator" >/dev/null
	touch $(STAMP)

install: $(STAMP)

hpo: $(STAMP)
	$(BIN)/hpo-orchestrator run $(if $(PAR),scheduler.parallel=$(PAR)) $(ARGS)

# The commands `make hpo` suggests, without activating the venv (ARGS="--study NAME" etc.).
status: $(STAMP)
	$(BIN)/hpo-orchestrator status $(ARGS)

report: $(STAMP)
	$(BIN)/hpo-orchestrator report --out report.html $(ARGS)

logs: $(STAMP)
	@test -n "$(TRIAL)" || { echo "usage: $(HPO_MAKE) logs TRIAL=N (a trial number; see $(HPO_MAKE) status)" >&2; exit 2; }
	$(BIN)/hpo-orchestrator logs $(TRIAL) $(ARGS)

# Everything but the GPU suite and the `long` tests (whole studies of 9 s to 90 s each: several
# hosts, kill -9, the README in order). CI runs both.
# TEST_WORKERS: pytest-xdist processes (default 3, on 2 cores too: most of a slow test's time is
# spent waiting for its study's processes, so a third worker fills the gaps; each worker has its
# own PostgreSQL database, lease folders and fake GPUs, tests/conftest.py). TEST_WORKERS=0: one
# process, as plain pytest (-p no:xdist is not needed). Timings: docs/TESTING.md.
TEST_WORKERS ?= 3
# The PostgreSQL tests (the advisory-lock budget, the tally's holes, every PostgreSQL contract
# case) run where a server can be had: scripts/test_postgres.sh finds or starts the local one
# (127.0.0.1:5432, user postgres, database test), as .ci/run does, or says why not; then they
# are skipped, and the run says so loudly at its end. -rs prints every skip's reason.
define PYTEST_WITH_POSTGRES
	@url="$$(scripts/test_postgres.sh)"; \
	if [ -n "$$url" ]; then export HPO_TEST_POSTGRES_URL="$$url"; \
	  echo "PostgreSQL tests: $$url"; fi; \
	$(BIN)/python -m pytest -q -rs -m "$(1)" -n $(TEST_WORKERS) $(PYTEST_ARGS); status=$$?; \
	if [ -z "$$url" ]; then \
	  echo "*** PostgreSQL tests were SKIPPED: no server (see the reason above; set HPO_TEST_POSTGRES_URL)" >&2; \
	fi; \
	exit $$status
endef

test: $(STAMP)
	$(call PYTEST_WITH_POSTGRES,not gpu and not long)

test-long: $(STAMP)
	$(call PYTEST_WITH_POSTGRES,long and not gpu)

# Unit tests only: no study in subprocesses (those are marked slow; tests/conftest.py fails an
# unmarked test that runs one).
test-fast: $(STAMP)
	$(call PYTEST_WITH_POSTGRES,not gpu and not slow)

# Fails when no GPU test ran (every one skipped or deselected): see tests/conftest.py.
test-gpu: $(STAMP)
	HPO_TEST_REQUIRE_GPU=1 $(BIN)/python -m pytest -q -m gpu -rs $(PYTEST_ARGS)

# Mutation testing: each edit of tests/mutations/*.toml applied alone to a scratch copy, its
# guarding tests run; fails when any survives (docs/MUTATION.md). MUTATION_ARGS='--only NAME'.
mutation: $(STAMP)
	$(BIN)/python scripts/mutation.py $(MUTATION_ARGS)

# Mutation testing by mutmut (the `mutants` extra) over the modules [tool.mutmut] names in
# pyproject.toml: every mutant its own tests can reach, the results kept in mutants/ (`mutmut
# results`, `mutmut show NAME`). Tens of minutes on 2 cores: not in CI. MUTANTS: mutmut's name
# pattern, e.g. MUTANTS='hpo_orchestrator.scheduler._budget*'. docs/MUTATION.md, "mutmut".
MUTANTS ?=
mutants: $(STAMP)
	test -x $(BIN)/mutmut || $(BIN)/python -m pip install -q -e ".[mutants]"
	@url="$$(scripts/test_postgres.sh)"; if [ -n "$$url" ]; then export HPO_TEST_POSTGRES_URL="$$url"; fi; \
	$(BIN)/mutmut run --max-children 2 $(MUTANTS); status=$$?; \
	$(BIN)/mutmut results; exit $$status

# Benchmarks (not tests: they time things); results go to docs/BENCHMARKS.md.
bench: $(STAMP)
	$(BIN)/python scripts/bench_status.py --real-run 1000 --first-run
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

# Time to quality (issue 26, docs/QUALITY.md): each contender launched as its own command and
# timed to targets from a reference run. OUT (default bench-quality) keeps results.json,
# targets.json, results.md and the curves PNG; a call adds its seeds (--seeds 3-5) to OUT.
# QUALITY_ARGS: everything else; the default is the CPU smoke run of workload (a) (make
# bench-quality QUALITY_ARGS="--reference ..." first: see docs/QUALITY.md for the commands).
QUALITY_OUT = $(if $(filter command line environment,$(origin OUT)),$(OUT),bench-quality)
QUALITY_ARGS ?= --workload a --seeds 1-2 --budget 60 --contenders ours,optuna-cpu-t1
bench-quality: $(STAMP)
	$(BIN)/python scripts/bench_quality.py --out $(QUALITY_OUT) $(QUALITY_ARGS)

# mypy: the package, and what of this repository is imported by name in a study's processes
# (the benchmark's package, the test objectives) or by both tests and scripts.
lint: $(STAMP)
	$(BIN)/ruff check hpo_orchestrator tests scripts
	$(BIN)/mypy hpo_orchestrator scripts/benchmarking tests/objectives/__init__.py tests/misbehaving.py tests/probes.py tests/browser.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache .mypy_cache
