# kvcheck: every target creates and reuses .venv, so a fresh machine needs only python3 and make.
# pip installs with --no-compile: Python compiles a module when it is first imported, so the
# thousands of installed files nothing imports (most of torch, ray, z3's) are never compiled.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kvcheck-installed
SECONDS ?= 60
SGLANG_VERSIONS ?= 0.5.15 0.5.23
CHECK_SGLANG_EXAMPLES ?= 200
SEED ?=
ROUNDS ?=
WORKERS ?=
EXTRAS ?= dev,ray,mutation,cython
COVERAGE_FLAGS ?=
MUTATION_SAMPLE ?= 20
# the sample's floor: 20 mutants are 5 points each; the goal over all mutants is 90
MUTATION_MIN_SCORE ?= 75
TRACE ?=
CHECK_FLAGS ?=
EXPLORE_FLAGS ?=
# make test: one pytest worker per core (pytest-xdist); PYTEST_FLAGS= runs it in one process
PYTEST_FLAGS ?= -n auto --dist worksteal

.PHONY: venv check test fuzz replay explore prove selftest bench bench-sglang check-gpu sglang-env check-sglang clean cython explore-compiled explore-nightly explore-nightly-rounds coverage mutation mutation-sample

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile "$(TORCH_SPEC)"
	$(PY) -m pip install -q --no-compile -e ".[$(EXTRAS)]"
	$(PY) -m kvcheck.compiled setup
	touch $(STAMP)

check: $(STAMP)
	$(VENV)/bin/kvcheck check $(CHECK_FLAGS)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_FLAGS)

fuzz: $(STAMP)
	$(VENV)/bin/kvcheck fuzz $(if $(ROUNDS),--rounds $(ROUNDS),--seconds $(SECONDS)) $(if $(SEED),--seed $(SEED)) $(if $(WORKERS),--workers $(WORKERS))

replay: $(STAMP)
	@test -n "$(TRACE)" || (echo "usage: make replay TRACE=path/to/trace.json" >&2; exit 2)
	$(VENV)/bin/kvcheck replay $(TRACE)

explore: $(STAMP)
	$(VENV)/bin/kvcheck explore

# the explorer's modules compiled by Cython from the same .py sources (build/cython/,
# refused once a source changes; `make venv` builds it where a C compiler is present);
# without it everything runs interpreted
cython: $(STAMP)
	$(PY) -m pip install -q "Cython>=3.1,<3.3"
	$(PY) -m kvcheck.compiled build

explore-compiled: $(STAMP)
	$(PY) -m kvcheck.run_compiled explore $(EXPLORE_FLAGS)

# the nightly scope: 2 sessions x 3 turns + a plain request (compiled when built)
explore-nightly: $(STAMP)
	$(PY) -m kvcheck.run_compiled explore --preset nightly $(EXPLORE_FLAGS)

# three sessions and the scheduling rounds: days of one core, so on every core
# (WORKERS=N; EXPLORE_FLAGS="--ray ADDRESS" for a cluster, "--max-seconds S" bounds it)
explore-nightly-rounds: $(STAMP)
	$(PY) -m kvcheck.run_compiled explore --preset nightly-rounds --workers $(or $(WORKERS),$(shell nproc 2>/dev/null || echo 1)) $(EXPLORE_FLAGS)

prove: $(STAMP)
	$(VENV)/bin/kvcheck prove

selftest: $(STAMP)
	$(VENV)/bin/kvcheck selftest

# one run, one summary: explorer old vs new, fuzz engines, detection, workers, check by part;
# the search on 1 and 2 workers and on Ray;
# each table is written into docs/speed.md under the machine it ran on
bench: $(STAMP)
	$(PY) -m benchmarks.doc summary docs/speed.md --from "== summary" -- $(PY) -m benchmarks.summary
	$(PY) -m benchmarks.doc parallel docs/speed.md -- $(PY) -m benchmarks.bench_parallel --ray
	$(PY) -m benchmarks.doc coverage docs/speed.md -- $(PY) -m benchmarks.bench_coverage

# the exhaustive differential against each release with each planted upstream fault
# (adapters/sglang/faults.py): caught where, how fast; the clean releases pass (~10 min)
bench-sglang: $(STAMP) sglang-env
	$(PY) -m benchmarks.bench_sglang_faults

# line and branch coverage of impl/ by check's runs and a fixed-count fuzz run
# (COVERAGE_FLAGS="--backend sglang:0.5.23": of a release's modules, in its venv)
coverage: $(STAMP)
	$(VENV)/bin/kvcheck coverage $(COVERAGE_FLAGS)

# mutation testing of impl/ with mutmut: every mutant (nightly), or a fixed-seed sample (CI)
mutation: $(STAMP)
	$(PY) -m kvcheck.mutation

mutation-sample: $(STAMP)
	$(PY) -m kvcheck.mutation --sample $(MUTATION_SAMPLE) --examples 30 --min-score $(MUTATION_MIN_SCORE)

# impl/ tests, a fuzz run and per-op latency on CUDA beside CPU (KVCHECK_DEVICE=cpu: cpu only)
check-gpu: $(STAMP)
	$(PY) -m benchmarks.check_gpu

# Real upstream releases, each in its own venv (.venv-sglang-VERSION), built from PyPI.
# one target per release, so that `make -j3 venv sglang-env` builds the three venvs side by side
sglang-env: $(addprefix sglang-env-,$(SGLANG_VERSIONS))

sglang-env-%:
	adapters/sglang/make_env.sh $*

# The differential run takes each release's recorded findings (adapters/sglang/findings.py
# RELEASES) as known behaviour (--accept) and drives their paths instead of skipping them;
# so does the exhaustive one (every transition of small scopes, the release forked per state).
check-sglang: $(STAMP) sglang-env
	@for v in $(SGLANG_VERSIONS); do \
	  echo "=== sglang $$v: conformance of stateful_tests/upstream (shape, lockstep, upstream past the first failure)"; \
	  $(PY) -m kvcheck.adapters.sglang.conformance --version $$v --past-failure stateful_tests/upstream/*-sglang-$$v.json || exit 1; \
	  accept=$$($(PY) -c "from kvcheck.adapters.sglang.findings import RELEASES; print(','.join(RELEASES.get('$$v', ())))"); \
	  echo "=== sglang $$v: recorded findings, regression corpus, differential run, every transition of preset check-sglang-$$v (--accept $$accept)"; \
	  $(VENV)/bin/kvcheck check --backend sglang:$$v --accept "$$accept" \
	    --examples $(CHECK_SGLANG_EXAMPLES) --skip-proofs || exit 1; \
	done

clean:
	rm -rf $(VENV) .hypothesis .pytest_cache failures build mutants
