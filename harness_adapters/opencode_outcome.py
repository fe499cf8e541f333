"""How an OpenCode rollout ended: the events of ``opencode run --format json`` (or, for a served rollout, the same
events made from its stored session) and the process outcome turned into the contract's result."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness_adapters.opencode_serve import ServedRollout
from harness_adapters.processes import TAIL_CHARS, ProcessOutcome, last_line, tail
from repro.protocols import HarnessResult, HarnessRollout

SESSION_NAME = "session.json"


def parse_events(text: str) -> list[dict[str, Any]]:
    """The JSON events of ``opencode run --format json`` (stdout); other lines are skipped."""
    events = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return events



def classify(rollout: HarnessRollout, outcome: ProcessOutcome, events: list[dict[str, Any]], out: Path,
             session: Path | None) -> HarnessResult:
    """The contract's result from the exit and the event stream: finished iff exit 0, a step ran and no error."""
    steps = [e for e in events if e.get("type") == "step_start"]
    finishes = [e.get("part", {}).get("reason", "") for e in events if e.get("type") == "step_finish"]
    errors = [e for e in events if e.get("type") == "error"]
    exit_status = "error" if errors else (finishes[-1] if finishes else "")
    if outcome.timed_out:
        status, reason = "timeout", f"killed after {rollout.timeout_s:g} s"
    elif errors:
        status, reason = "crashed", f"exit code {outcome.exit_code}, error event: {_error_text(errors[-1])}"
    elif outcome.exit_code != 0:
        status, reason = "crashed", f"exit code {outcome.exit_code}: {last_line(tail(out / 'stderr.log'))}"
    elif not steps:
        status, reason = "crashed", "exit code 0 but no step ran"
    else:
        status, reason = "finished", exit_status
    return HarnessResult(
        rollout_id=rollout.rollout_id, status=status, reason=reason, exit_status=exit_status,
        n_model_calls=len(steps), duration_s=round(outcome.duration_s, 3),
        trajectory_path=str(session) if session else None,
        info={"cpu_s": round(outcome.cpu_s, 3), "exit_code": outcome.exit_code,
              "session_id": next((e["sessionID"] for e in events if e.get("sessionID")), None),
              "n_steps": len(steps), "finish_reasons": finishes, "events_log": str(out / "stdout.log"),
              "stderr_log": str(out / "stderr.log"), "stderr_tail": tail(out / "stderr.log", TAIL_CHARS // 4)},
    )


def classify_served(rollout: HarnessRollout, served: ServedRollout, out: Path) -> HarnessResult:
    """:func:`classify` for a served rollout: the session is written to ``<out>/session.json`` and its parts to
    ``<out>/stdout.log`` as the events ``opencode run --format json`` prints (``step_start``, ``step_finish``,
    ``tool_use``, ``text``, ``error``)."""
    (out / "stderr.log").write_text(served.error or "", encoding="utf-8")
    events = served_events(served)
    (out / "stdout.log").write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    session = None
    if served.session is not None:
        session = out / SESSION_NAME
        session.write_text(json.dumps(served.session, indent=2) + "\n", encoding="utf-8")
    failed = served.error is not None or any(e["type"] == "error" for e in events)
    outcome = ProcessOutcome(None if served.timed_out else int(failed), served.timed_out, served.duration_s,
                             served.cpu_s)
    return classify(rollout, outcome, events, out, session)


_PART_EVENTS = {"step-start": "step_start", "step-finish": "step_finish", "tool": "tool_use", "text": "text"}


def served_events(served: ServedRollout) -> list[dict[str, Any]]:
    """The session's parts as ``opencode run`` events, then an ``error`` event for a message's or the call's error."""
    events: list[dict[str, Any]] = []
    for message in (served.session or {}).get("messages", []):
        info = message.get("info") or {}
        if info.get("role") != "assistant":
            continue
        events += [{"type": _PART_EVENTS[part["type"]], "sessionID": served.session_id, "part": part}
                   for part in message.get("parts", []) if part.get("type") in _PART_EVENTS]
        if info.get("error"):
            events.append({"type": "error", "sessionID": served.session_id, "error": info["error"]})
    if served.error is not None and not served.timed_out:
        events.append({"type": "error", "sessionID": served.session_id, "error": {"data": {"message": served.error}}})
    return events


def _error_text(event: dict[str, Any]) -> str:
    error = event.get("error") or {}
    data = error.get("data") if isinstance(error, dict) else None
    message = (data or {}).get("message") if isinstance(data, dict) else None
    return str(message or error)[:500]
