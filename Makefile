# segtxn: `make demo` runs the main job, `make test` runs the whole suite.
# Both bootstrap what they need (a .venv with the package and its extras) by themselves.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev

.PHONY: demo test lint bench venv clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Reinstall when the package metadata changes (a stale venv is rebuilt in place).
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/segtxn demo

lint: $(STAMP)
	$(BIN)/ruff check segtxn tests bench
	$(BIN)/ruff format --check segtxn tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

test: lint
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python bench/metastore.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
