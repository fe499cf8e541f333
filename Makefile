# Quick start: `make run` (set up + main job), `make test` (the suite). Everything lives in .venv.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.repro-installed

.PHONY: setup run test lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# CPU torch first, pinned: a bare `torch` requirement would pull a multi-GB CUDA build
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/repro run

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check repro harness_adapters tests

bench: $(STAMP)
	$(BIN)/repro run experiment=bench_proxy

clean:
	rm -rf $(VENV) outputs .pytest_cache .ruff_cache
