# Quick start: `make run` (set up + main job), `make test` (the suite). Everything lives in .venv.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.repro-installed

.PHONY: setup envs run test lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# CPU torch first, pinned: a bare `torch` requirement would pull a multi-GB CUDA build
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The environments the default job runs in (mini-SWE-agent 2.4.6, the grading pytest): pip installs into the cache
# dir, once per machine (a no-op when they are there), so that `make run`'s job time is the experiment's own.
envs: $(STAMP)
	$(BIN)/python -c 'from harness_adapters.mini_swe_agent.adapter import ensure_mini_swe_agent_env; \
	from repro.sandbox.grading_env import default_grading_python; default_grading_python(); ensure_mini_swe_agent_env()'

setup: $(STAMP) envs

run: setup
	$(BIN)/repro run

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check repro harness_adapters tests

bench: $(STAMP)
	$(BIN)/repro run experiment=bench_proxy

clean:
	rm -rf $(VENV) outputs .pytest_cache .ruff_cache
