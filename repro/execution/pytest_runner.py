"""Run pytest node ids in a working copy and read each test's status with SWE-bench's own log parser.

pytest 9 reports a failing unittest ``subTest`` as its own ``SUBFAILED(...) <test id> - ...`` summary line while
the test itself is reported ``PASSED``; swebench's parser (written for pytest <= 8, where such a test fails)
ignores that line. :func:`parse_statuses` marks a test with any failed sub-test FAILED, whatever the version.
"""

from __future__ import annotations

import contextlib
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from repro.execution.limits import ResourceLimits, clean_env, run_limited
from repro.execution.pytest_server import POOL, ServerGone

# Like `python -m pytest`, but pytest is imported before the working copy goes first on sys.path: otherwise a
# patch that adds a `pytest.py` would replace the test runner (SWE-bench's `pytest` script is not exposed either).
PYTEST_MAIN = ("import os, sys; sys.path[:] = [p for p in sys.path if p not in ('', os.getcwd())]; import pytest; "
               "sys.path.insert(0, os.getcwd()); sys.exit(int(pytest.main()))")  # console_main: deprecated in pytest 9


# "SUBFAILED[msg] (k=v, ...) <test id> - <message>": the description ends with "]" or ")", the id follows it
_SUBFAILED = re.compile(r"^SUBFAILED.*?[\])] (\S+::\S+)(?: - |$)", re.M)


@dataclass
class TestRun:
    """Statuses by test id (PASSED / FAILED / ERROR / SKIPPED / XFAIL; a test absent from the log is missing)."""

    statuses: dict[str, str] = field(default_factory=dict)
    exit_code: int = 0
    timed_out: bool = False
    duration_s: float = 0.0
    log: str = ""
    timeout_s: float = 0.0  # the wall-clock limit the run had


def parse_statuses(log: str) -> dict[str, str]:
    """Test statuses from a ``pytest -rA`` log: swebench's parser, plus pytest 9's ``SUBFAILED`` lines (a test
    with a failed sub-test is FAILED)."""
    from swebench.harness.log_parsers.python import parse_log_pytest  # swebench takes seconds to import: on first use

    statuses = parse_log_pytest(log, None)
    for match in _SUBFAILED.finditer(log):
        statuses[match.group(1)] = "FAILED"
    return statuses


def run_pytest(repo_dir: Path, test_ids: list[str], timeout_s: float = 120.0,
               limits: ResourceLimits | None = None, python: str = sys.executable, forked: bool = False) -> TestRun:
    """``pytest -rA <test_ids>`` with ``python`` in ``repo_dir`` (clean env, rlimits, timeout); statuses parsed
    from the ``-rA`` summary by ``swebench.harness.log_parsers.parse_log_pytest``. ``forked``: the run is forked
    from a warm pytest server of ``python`` (:mod:`repro.execution.pytest_server`; a fresh process if it fails)."""
    args = ["-rA", "-p", "no:cacheprovider", "-o", "addopts=", "--no-header", "-q", "--tb=short", *test_ids]
    limits = limits or ResourceLimits()
    with tempfile.TemporaryDirectory(prefix="repro-home-") as home:
        env, result = clean_env(Path(home)), None
        if forked:
            with contextlib.suppress(ServerGone):
                result = POOL.run(python, args, repo_dir, env, timeout_s, limits)
        if result is None:
            result = run_limited([python, "-c", PYTEST_MAIN, *args], repo_dir, env, timeout_s, limits)
    statuses = {} if result.timed_out else parse_statuses(result.output)
    return TestRun(statuses, result.exit_code, result.timed_out, result.duration_s, result.output, timeout_s)
