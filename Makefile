# The two commands of the README:
#   make run    set up .venv (pinned) and run the whole default pipeline (smoke scale, offline, MLflow in results/)
#   make test   set up .venv (pinned) and run the test suite (what .ci/run calls)
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
JOBS ?= 2
# test processes (pytest-xdist); --dist loadfile keeps a file's tests, and its module fixtures
# (one ci run of all 38 methods, one SLURM run), in one process
TEST_WORKERS ?= 2
ARGS ?=

.PHONY: setup run test test-fast lint ui bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt constraints.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt -c constraints.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	@touch $@

run: setup
	$(VENV)/bin/snakemake --cores $(JOBS) $(ARGS)

test: setup
	$(VENV)/bin/pytest -q -rs -n $(TEST_WORKERS) --dist loadfile --durations=15 $(ARGS)

test-fast: setup
	$(VENV)/bin/pytest -q -rs -n $(TEST_WORKERS) --dist loadfile -m "not integration and not slurm" $(ARGS)

lint: setup
	$(VENV)/bin/snakemake --lint

ui: setup
	$(VENV)/bin/reprozoo ui

bench: setup
	$(VENV)/bin/python -m benchmarks

clean:
	rm -rf results/* .snakemake
	git checkout -- results/README.md
