# Quick start: `make run` serves the API on 127.0.0.1:8000, `make test` runs every test.
# Both create .venv and install the project on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test install bench validate bands clean browser screenshot lint

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# ruff (lint rules and formatting) and mypy (optimizer/, api/), configured in pyproject.toml; the
# 'lint' extra is installed on first use.
LINT_STAMP := $(VENV)/.lint-installed
$(LINT_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[test,lint]'
	touch $(LINT_STAMP)

# Runs all three checks and fails if any did.
lint: $(LINT_STAMP)
	@status=0; \
	$(BIN)/ruff check . || status=1; \
	$(BIN)/ruff format --check . || status=1; \
	$(BIN)/mypy || status=1; \
	exit $$status

run: $(STAMP)
	$(BIN)/python -m api.server

# -n auto: one pytest-xdist worker per core. --dist worksteal splits the tests (the long ones first,
# see tests/conftest.py) and lets an idle worker take the unstarted tail of another's share.
# Plugins are named rather than autoloaded: autoloading also has pytest rewrite the asserts of
# every module of their packages (about 350 of schemathesis, hypothesis and anyio), some 2 s of
# each worker's start. These are the installed ones (xdist's looponfail aside); a new plugin
# needs its -p here.
TEST_PLUGINS := -p xdist.plugin -p _hypothesis_pytestplugin -p schemathesis.pytest.plugin -p anyio.pytest_plugin
test: $(STAMP) browser
	PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 $(BIN)/python -m pytest $(TEST_PLUGINS) -n auto --dist worksteal

# The browser tests (tests/web) drive Debian's chromium with its chromium-driver; as root on a
# Debian-like machine this installs both when missing.
browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "apt-get install chromium chromium-driver"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	else \
		echo "tests/web needs chromium and chromium-driver: apt-get install chromium chromium-driver" >&2; \
	fi

# The web page's picture in the README.
screenshot: $(STAMP) browser
	PYTHONPATH=. $(BIN)/python tests/web/screenshot.py docs/img/plan-page.png

bench: $(STAMP)
	$(BIN)/python benchmarks/search_latency.py
	$(BIN)/python benchmarks/topology_bench.py
	$(BIN)/python benchmarks/sweep_bench.py

validate: $(STAMP)
	$(BIN)/python benchmarks/validation.py
	$(BIN)/python benchmarks/memory_check.py
	$(BIN)/python benchmarks/error_bands.py

# the plans' 80% error bands (optimizer/data/error_bands.toml, docs/error_bands.md) from the validation residuals
bands: $(STAMP)
	$(BIN)/python benchmarks/error_bands.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
