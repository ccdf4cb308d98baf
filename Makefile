# The whole set-up for a new user: `make demo` or `make test`, each on its own.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.dpcomm-installed

.PHONY: demo test test-fast test-slow test-compat lint clean

# Keep bytecode (__pycache__ is git-ignored) even where the environment sets PYTHONDONTWRITEBYTECODE: else
# every process, the slow tier's hundreds of spawned workers included, compiles dpcomm from source, and
# pytest rewrites every test module's asserts again on each run (measured on the 2-core VM: collecting the
# fast tier took 8.1 s without bytecode, 3.5 s with it).
unexport PYTHONDONTWRITEBYTECODE

$(BIN)/python:
	$(PY) -m venv $(VENV)

# torch==2.13.0 is the CPU wheel this machine serves locally; the package itself asks for torch>=$(COMPAT_TORCH)
# (the oldest it supports, tested by `make test-compat`).
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

# The slow tier in two parts: files whose tests compare results only (no timeouts, signals, timings,
# namespaces) two at a time, a file per pytest-xdist worker (their launches leave about a quarter of the
# 2 cores idle one at a time: 238 s one at a time, 182 s two at a time on the 2-core VM); then every other
# file one test at a time, as before. The two parts split the slow tier: nothing runs twice.
SLOW_PAIRED := $(addprefix tests/test_,compile.py user_models.py fsdp.py hsdp.py train_hsdp.py ddp.py \
	ddp_hooks.py ddp_train.py ps_replica.py replan.py transformer_train.py fsdp_atoms.py \
	netsim_schedules.py netsim_multigpu.py cuda.py compat.py runtime.py clean_exit.py launch.py \
	ring_rsag.py dear_runtime.py)

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m "not ($(FAST))" -n 2 --dist loadfile $(SLOW_PAIRED)
	$(BIN)/python -m pytest -m "not ($(FAST))" $(addprefix --ignore=,$(SLOW_PAIRED))

# The compatibility tier: the oldest torch dpcomm supports (dpcomm.compat.MIN_TORCH and pyproject's torch>=
# say the same; tests/test_compat.py checks that the three agree), in a virtual environment of its own. The
# registry serves it as a CUDA wheel (530 MB, and 2.7 GB of NVIDIA libraries once installed: 216 s here);
# it runs on the CPU. Then the fast tier and the slow tests that launch workers, `wrap`, `shard`, and
# `dpcomm train` for each kind (dp, ddp, ddp:PLANNER, fsdp:PLANNER, ps).
COMPAT_TORCH := 2.11.0
COMPAT_VENV  := .venv-compat
COMPAT_STAMP := $(COMPAT_VENV)/.dpcomm-installed
COMPAT_SLOW  := tests/test_compat.py tests/test_fsdp_costs.py tests/test_launch.py tests/test_ddp.py \
                tests/test_fsdp.py tests/test_ddp_train.py tests/test_ps_replica.py

$(COMPAT_VENV)/bin/python:
	$(PY) -m venv $(COMPAT_VENV)

$(COMPAT_STAMP): $(COMPAT_VENV)/bin/python pyproject.toml
	$(COMPAT_VENV)/bin/pip install -q --upgrade pip
	$(COMPAT_VENV)/bin/pip install -q torch==$(COMPAT_TORCH)
	$(COMPAT_VENV)/bin/pip install -q -e '.[dev]'
	touch $(COMPAT_STAMP)

test-compat: $(COMPAT_STAMP)
	$(COMPAT_VENV)/bin/python -m pytest -m "$(FAST)" -n auto --maxprocesses 4 --dist loadfile
	$(COMPAT_VENV)/bin/python -m pytest -m slow $(COMPAT_SLOW)

# The third-party tier (issue 54): `wrap` and `shard` on GPT-2, T5, Switch Transformers and NLLB-MoE
# (transformers), a U-Net (diffusers) and a GCN (torch-geometric), tests/test_thirdparty.py, against plain DDP
# and plain FSDP2 (docs/models_tried.md). Its own tier, run by .ci/run after `make test`: the `thirdparty`
# extra (pinned in pyproject.toml) goes into .venv with torch named in the same install, so pip keeps the
# 2.13.0 above (21 s on the 2-core VM after `make`'s 41 s; the tests 30-55 s). DPCOMM_THIRDPARTY=1 un-skips
# the module, which `make test` skips at collection; the models are built from configs, never downloaded.
THIRDPARTY_STAMP := $(VENV)/.dpcomm-thirdparty-installed

.PHONY: test-thirdparty

$(THIRDPARTY_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install -q -e '.[thirdparty]' torch==2.13.0
	touch $(THIRDPARTY_STAMP)

test-thirdparty: $(THIRDPARTY_STAMP)
	DPCOMM_THIRDPARTY=1 HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -m thirdparty tests/test_thirdparty.py

# The frameworks tier (issue 55): dpcomm.integrations (Accelerate, the Trainer, Lightning DDP and FSDP2)
# trained against the same frameworks without dpcomm, the naive routes, and `dpcomm plan --export` read by
# DeepSpeed's, Megatron-Core's, the Trainer's, Accelerate's, Lightning's and torchtitan's own config classes
# (tests/test_frameworks.py, tests/test_export_frameworks.py). Its own virtual environment: the
# `frameworks` extra (pinned in pyproject.toml) with torch named in the same install, so pip keeps the
# 2.13.0 CPU wheel. `make test-frameworks` from a fresh clone on the 2-core VM, 2026-12-07: 113 s in all,
# of which the venv, installs (from pip's cache) and DeepSpeed's wheel build 84 s and the 18 tests 29 s.
# DPCOMM_FRAMEWORKS=1 un-skips the two modules, which `make test` skips at collection.
FRAMEWORKS_VENV  := .venv-frameworks
FRAMEWORKS_STAMP := $(FRAMEWORKS_VENV)/.dpcomm-installed

.PHONY: test-frameworks

$(FRAMEWORKS_VENV)/bin/python:
	$(PY) -m venv $(FRAMEWORKS_VENV)

$(FRAMEWORKS_STAMP): $(FRAMEWORKS_VENV)/bin/python pyproject.toml
	$(FRAMEWORKS_VENV)/bin/pip install -q --upgrade pip
	$(FRAMEWORKS_VENV)/bin/pip install -q torch==2.13.0
	$(FRAMEWORKS_VENV)/bin/pip install -q -e '.[dev,frameworks]' torch==2.13.0
	touch $(FRAMEWORKS_STAMP)

test-frameworks: $(FRAMEWORKS_STAMP)
	DPCOMM_FRAMEWORKS=1 HF_HUB_OFFLINE=1 $(FRAMEWORKS_VENV)/bin/python -m pytest -m frameworks -p no:warnings \
		tests/test_frameworks.py tests/test_export_frameworks.py

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) $(COMPAT_VENV) $(FRAMEWORKS_VENV) build src/*.egg-info .pytest_cache
