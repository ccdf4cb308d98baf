# The whole set-up for a new user: `make demo` or `make test`, each on its own.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.dpcomm-installed

.PHONY: demo test lint clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

# torch==2.13.0 is the CPU wheel this machine serves locally; the package itself asks for torch>=2.4.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m dpcomm.demo

test: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
