# One virtual environment in .venv; every target creates it when missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo lint format typecheck test test-live check bench bench-compare docs clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

## The main job: a recipe end to end, offline (it replays the recording beside the recipe).
demo: $(STAMP)
	$(BIN)/minions run examples/activity_monitor/recipe.yaml

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

typecheck: $(STAMP)
	$(BIN)/mypy

## Two processes, each taking whole test files (a file's module fixtures stay in one process):
## about half the time of one process on 2 cores. `pytest tests/test_x.py` runs one file alone.
test: $(STAMP)
	$(BIN)/pytest -q -n 2 --dist loadfile

## Against real llama.cpp servers and small models (../shared/tools/local-llm, or
## MINIONS_LIVE_BASE_URL); not part of `check`.
test-live: $(STAMP)
	$(BIN)/pytest -q -m live tests/live

## Lint, type check and the whole test suite (what CI runs).
check: lint typecheck test

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

## The overhead workloads of BASE (default main) and the working tree, interleaved in one
## invocation: medians and ratios (docs/benchmarks.md). ARGS passes options, e.g.
## make bench-compare BASE=HEAD~1 ARGS="--rounds 9 --only W2 W4"
BASE ?= main
bench-compare: $(STAMP)
	$(BIN)/python benchmarks/compare.py $(BASE) $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
