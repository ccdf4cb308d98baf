# The whole set-up for a new user: `make demo` or `make test`, each on its own.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.dpcomm-installed

.PHONY: demo test test-fast test-slow lint clean

# Keep bytecode (__pycache__ is git-ignored) even where the environment sets PYTHONDONTWRITEBYTECODE: else
# every process, the slow tier's hundreds of spawned workers included, compiles dpcomm from source, and
# pytest rewrites every test module's asserts again on each run (measured on the 2-core VM: collecting the
# fast tier took 8.1 s without bytecode, 3.5 s with it).
unexport PYTHONDONTWRITEBYTECODE

$(BIN)/python:
	$(PY) -m venv $(VENV)

# torch==2.13.0 is the CPU wheel this machine serves locally; the package itself asks for torch>=2.4.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/python -m compileall -q src tests
	touch $(STAMP)

# As root (network namespaces and tc): 4 emulated servers on 100 Mbit/s links, 5 schedules measured side by
# side with the simulator's prediction, about 70 s on 2 cores. Otherwise one line says why, and the
# simulator answers for a real cluster (a few seconds). Writes out/demo/.
demo: $(STAMP)
	$(BIN)/python -m dpcomm.demo

# Tests, cheapest first: the fast tier (pure functions, planners, cost models, topology, formats; no worker
# processes; spread over the cores by pytest-xdist, a test file per worker) runs first, then the
# multi-process (`slow`) and emulated-cluster (`testbed`) tiers, one test at a time.
# The two selections split the suite: nothing runs twice, nothing is left out.
FAST := not slow and not testbed

test: test-fast test-slow

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "$(FAST)" -n auto --maxprocesses 4 --dist loadfile

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m "not ($(FAST))"

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
