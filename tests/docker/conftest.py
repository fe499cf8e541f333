"""The docker tests need a Docker engine: without one they are not collected, and one line says why.

``REPRO_REQUIRE_DOCKER=1`` (set by ``.ci/run``) turns "no engine" and every skip for want of one into a failure, so
a CI run that passes has executed them; the summary line counts them either way."""

from __future__ import annotations

import os

import pytest

from repro.sandbox.docker_engine import engine_available

REQUIRED = os.environ.get("REPRO_REQUIRE_DOCKER") == "1"
NO_ENGINE = engine_available()
if NO_ENGINE and REQUIRED:
    raise pytest.UsageError(f"REPRO_REQUIRE_DOCKER=1 but no Docker engine answers ({NO_ENGINE}); run .ci/docker-up")
collect_ignore_glob = ["test_*.py"] if NO_ENGINE else []


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if NO_ENGINE:
        terminalreporter.write_line(f"docker tests (tests/docker) not run: no Docker engine here ({NO_ENGINE}); "
                                    ".ci/run installs and starts one")
        return
    counts = {kind: sum(r.nodeid.startswith("tests/docker/") for r in terminalreporter.stats.get(kind, []))
              for kind in ("passed", "failed", "error", "skipped")}
    terminalreporter.write_line("docker tests (tests/docker): " + ", ".join(f"{n} {k}" for k, n in counts.items())
                                + (" (required: REPRO_REQUIRE_DOCKER=1)" if REQUIRED else ""))
