"""The docker tests need a Docker engine: without one they are not collected, and one line says why."""

from __future__ import annotations

from repro.sandbox.docker_engine import engine_available

NO_ENGINE = engine_available()
collect_ignore_glob = ["test_*.py"] if NO_ENGINE else []


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if NO_ENGINE:
        terminalreporter.write_line(f"docker tests (tests/docker) not run: no Docker engine here ({NO_ENGINE}); "
                                    ".ci/run installs and starts one")
