"""The outcome of one mini-SWE-agent process: what ran (:class:`HarnessIdentity`), how it ended
(:class:`HarnessRunResult`, classified by :func:`classify_run` from the exit and the trajectory)."""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from harness_adapters.processes import ProcessOutcome, tail

RunStatus = Literal["finished", "crashed", "timeout"]
FINISHED_EXIT_STATUSES = ("Submitted", "LimitsExceeded", "TimeExceeded", "RepeatedFormatError")
__all__ = ["FINISHED_EXIT_STATUSES", "HarnessIdentity", "HarnessRunResult", "RunStatus", "classify_run",
           "trajectory_info"]


@dataclass(frozen=True)
class HarnessIdentity:
    """What exactly ran: harness name/version, config file hashes, wire-relevant package versions."""

    name: str
    version: str
    config_sha256: str
    files: dict[str, str]
    packages: dict[str, str]


@dataclass(frozen=True)
class HarnessRunResult:
    """Outcome of one harness subprocess."""

    status: RunStatus
    reason: str
    exit_code: int | None
    duration_s: float
    cpu_s: float
    trajectory_path: Path | None
    exit_status: str
    n_model_calls: int
    stdout_tail: str
    stderr_tail: str
    command: list[str]
    identity: HarnessIdentity

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready view."""
        data = asdict(self)
        data["trajectory_path"] = str(self.trajectory_path) if self.trajectory_path else None
        return data


def classify_run(
    outcome: ProcessOutcome,
    trajectory: Path,
    output_dir: Path,
    cmd: list[str],
    identity: HarnessIdentity,
    timeout_s: float,
    finished: Collection[str] = FINISHED_EXIT_STATUSES,
) -> HarnessRunResult:
    """Classify a ``mini`` run from its exit and trajectory: finished iff it exited 0 with one of ``finished``."""
    info = trajectory_info(trajectory)
    exit_status = str((info or {}).get("exit_status") or "")
    status, reason = _status_and_reason(outcome, exit_status, info is not None, timeout_s, finished)
    if status == "crashed":
        last_err = tail(output_dir / "stderr.log").strip().splitlines()[-1:]
        reason = f"{reason}: {last_err[0]}" if last_err else reason
    return HarnessRunResult(
        status=status,
        reason=reason,
        exit_code=outcome.exit_code,
        duration_s=round(outcome.duration_s, 3),
        cpu_s=round(outcome.cpu_s, 3),
        trajectory_path=trajectory if trajectory.exists() else None,
        exit_status=exit_status,
        n_model_calls=int((info or {}).get("model_stats", {}).get("api_calls", 0)),
        stdout_tail=tail(output_dir / "stdout.log"),
        stderr_tail=tail(output_dir / "stderr.log"),
        command=cmd,
        identity=identity,
    )


def _status_and_reason(
    outcome: ProcessOutcome, exit_status: str, has_trajectory: bool, timeout_s: float, finished: Collection[str]
) -> tuple[RunStatus, str]:
    if outcome.timed_out:
        return "timeout", f"killed after {timeout_s:g} s"
    if outcome.exit_code != 0:
        return "crashed", f"exit code {outcome.exit_code}, exit status {exit_status or 'none'}"
    if not has_trajectory:
        return "crashed", "exit code 0 but no trajectory written"
    if exit_status not in finished:
        return "crashed", f"unexpected exit status {exit_status!r}"
    return "finished", exit_status


def trajectory_info(path: Path) -> dict[str, Any] | None:
    """The ``info`` dict of a mini trajectory file (None when missing or unreadable)."""
    try:
        return json.loads(path.read_text()).get("info", {})
    except (OSError, ValueError, AttributeError):
        return None
