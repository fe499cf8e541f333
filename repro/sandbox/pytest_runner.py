"""Run pytest node ids in a working copy and read each test's status with SWE-bench's own log parser."""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from swebench.harness.log_parsers.python import parse_log_pytest

from repro.sandbox.limits import ResourceLimits, clean_env, run_limited


@dataclass
class TestRun:
    """Statuses by test id (PASSED / FAILED / ERROR / SKIPPED / XFAIL; a test absent from the log is missing)."""

    statuses: dict[str, str] = field(default_factory=dict)
    exit_code: int = 0
    timed_out: bool = False
    duration_s: float = 0.0
    log: str = ""


def run_pytest(repo_dir: Path, test_ids: list[str], timeout_s: float = 120.0,
               limits: ResourceLimits | None = None, python: str = sys.executable) -> TestRun:
    """``python -m pytest -rA <test_ids>`` in ``repo_dir`` (clean env, rlimits, timeout); statuses parsed
    from the ``-rA`` summary by ``swebench.harness.log_parsers.parse_log_pytest``."""
    cmd = [python, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "-o", "addopts=", "--no-header", "-q",
           "--tb=short", *test_ids]
    with tempfile.TemporaryDirectory(prefix="repro-home-") as home:
        result = run_limited(cmd, repo_dir, clean_env(Path(home)), timeout_s, limits or ResourceLimits())
    statuses = {} if result.timed_out else parse_log_pytest(result.output, None)
    return TestRun(statuses, result.exit_code, result.timed_out, result.duration_s, result.output)
