"""The vLLM tests need vLLM: this interpreter's (the ``gpu`` extra) or the cached environment
(:mod:`repro.serving.vllm_env`, ``python -m repro.serving.vllm_env`` builds it, ``.ci/vllm-env`` in CI). Without it
they skip with one line; ``REPRO_REQUIRE_VLLM=1`` (set by ``.ci/run``) waits for the environment (building it when
missing) and turns every such skip into a failure, so a CI run that passes has executed them. The summary line counts
them either way."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

from repro.serving.vllm_env import cached_vllm_python, ensure_vllm_env
from tests.required_engines import fail_if_skipped, summary_line

REQUIRED = os.environ.get("REPRO_REQUIRE_VLLM") == "1"
UNIT = "tests/vllm_engine/"


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The interpreter whose vLLM the tests start."""
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    if REQUIRED:  # waits on the builder's lock when .ci/vllm-env is still building it
        return str(ensure_vllm_env())
    built = cached_vllm_python()
    if built is None:
        pytest.skip("no vLLM here: build its environment with `python -m repro.serving.vllm_env` (a few minutes of "
                    "pip; CI does, with REPRO_REQUIRE_VLLM=1)")
    return str(built)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    summary_line(terminalreporter, UNIT, "vllm", "REPRO_REQUIRE_VLLM", REQUIRED)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    fail_if_skipped(outcome.get_result(), "REPRO_REQUIRE_VLLM", REQUIRED)  # these hooks see only this folder's tests
