# Quick start: `make run` serves the API on 127.0.0.1:8000, `make test` runs every test.
# Both create .venv and install the project on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test install bench validate clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/python -m api.server

test: $(STAMP)
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python benchmarks/search_latency.py

validate: $(STAMP)
	$(BIN)/python benchmarks/validation.py
	$(BIN)/python benchmarks/memory_check.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
