"""The verl tests run verl's real actor code in verl's own environment (:mod:`repro.verl.env`; ``python -m
repro.verl.env`` builds it, ``.ci/verl-env`` in CI). Without it they skip with one line; ``REPRO_REQUIRE_VERL=1`` (set
by ``.ci/run``) waits for the environment (building it when missing) and turns every such skip into a failure, so a
CI run that passes has executed them. The summary line counts them either way."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from repro.common.net import free_port
from repro.verl.env import cached_verl_python, ensure_verl_env, verl_command, verl_env_vars
from tests.required_engines import fail_if_skipped, summary_line

REQUIRED = os.environ.get("REPRO_REQUIRE_VERL") == "1"
UNIT = "tests/verl_engine/"


@pytest.fixture(scope="session")
def verl_python() -> Path:
    """The interpreter of verl's environment."""
    if REQUIRED:  # waits on the builder's lock when .ci/verl-env is still building it
        return ensure_verl_env()
    built = cached_verl_python()
    if built is None:
        pytest.skip("no verl here: build its environment with `python -m repro.verl.env` (about a minute of pip; CI "
                    "does, with REPRO_REQUIRE_VERL=1)")
    return built


def run_check(python: Path, args: Sequence[str], nproc: int = 1, timeout: float = 600) -> None:
    """``python -m repro.verl.check ARGS`` in verl's environment (under torchrun for ``nproc`` > 1); fails the test
    with verl's own output when it fails."""
    port = free_port() if nproc > 1 else 0
    out = subprocess.run(verl_command(python, "repro.verl.check", *args, nproc=nproc, master_port=port),
                         env=verl_env_vars(), capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    summary_line(terminalreporter, UNIT, "verl", "REPRO_REQUIRE_VERL", REQUIRED)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    fail_if_skipped(outcome.get_result(), "REPRO_REQUIRE_VERL", REQUIRED)  # these hooks see only this folder's tests
