"""What the conftests of tests that need an engine's own environment (tests/vllm_engine, tests/verl_engine) share: a
summary line counting their tests, and, when CI requires the engine (``REPRO_REQUIRE_<NAME>=1``), a skip turned into
a failure, so that a passing CI run has executed them."""

from __future__ import annotations

from typing import Any


def summary_line(terminalreporter: Any, unit: str, label: str, flag: str, required: bool) -> None:
    """``<label> tests (<unit>): N passed, N failed, N error, N skipped`` when any test of ``unit`` ran."""
    counts = {kind: sum(r.nodeid.startswith(unit) for r in terminalreporter.stats.get(kind, []))
              for kind in ("passed", "failed", "error", "skipped")}
    if not any(counts.values()):
        return
    terminalreporter.write_line(f"{label} tests ({unit.rstrip('/')}): " + ", ".join(f"{n} {k}" for k, n in
                                                                                   counts.items())
                                + (f" (required: {flag}=1)" if required else ""))


def fail_if_skipped(report: Any, flag: str, required: bool) -> None:
    """A required engine's skipped test fails, with the skip's reason."""
    if required and report.skipped:
        report.outcome = "failed"
        report.longrepr = f"{flag}=1: skipped ({report.longrepr})"
