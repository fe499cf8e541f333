"""The ``opencode serve`` launcher's pieces without OpenCode: the refusal to serve jailed rollouts, the events made
from a stored session, and the permission answers ``opencode run --auto`` gives."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import harness_adapters.opencode as opencode
from harness_adapters.opencode import OpenCodeConfig, OpenCodeHarness
from harness_adapters.opencode_env import OpenCodeEnv
from harness_adapters.opencode_outcome import classify_served, served_events
from harness_adapters.opencode_serve import ServedRollout, _handle
from repro.protocols import HarnessRollout
from repro.tasks.schema import Task
from tests.unit.test_opencode import make_fake_env


@pytest.fixture
def fake_env(tmp_path: Path) -> OpenCodeEnv:
    return make_fake_env(tmp_path)


def test_launcher_is_checked_and_serve_refuses_a_jail(fake_env: OpenCodeEnv, tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(ValueError, match="launcher must be one of run, serve"):
        OpenCodeConfig(launcher="fork")
    monkeypatch.setattr(opencode, "resolve_isolation", lambda mode: "jail" if mode != "none" else "none")
    with pytest.raises(ValueError, match=r"harness\.isolation=none"):
        OpenCodeHarness(OpenCodeConfig(launcher="serve"), env=fake_env, state_dir=tmp_path / "a")
    with OpenCodeHarness(OpenCodeConfig(launcher="serve", isolation="none"), env=fake_env,
                         state_dir=tmp_path / "b") as served, \
            OpenCodeHarness(OpenCodeConfig(isolation="none"), env=fake_env, state_dir=tmp_path / "c") as plain:
        assert served.identity() == plain.identity()  # the launcher is not what the model sees


def _message(role: str, parts: list[dict[str, Any]], error: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"info": {"role": role, **({"error": error} if error else {})}, "parts": parts}


SESSION = {"info": {"id": "ses_1"}, "messages": [
    _message("user", [{"type": "text", "text": "the task"}]),
    _message("assistant", [{"type": "step-start"}, {"type": "tool", "tool": "bash"},
                           {"type": "step-finish", "reason": "tool-calls"}]),
    _message("assistant", [{"type": "step-start"}, {"type": "text", "text": "Done."},
                           {"type": "step-finish", "reason": "stop"}]),
]}


def _rollout(tmp_path: Path) -> HarnessRollout:
    task = Task(instance_id="t", repo="o/r", base_commit="0" * 40, problem_statement="x")
    (tmp_path / "out").mkdir()
    return HarnessRollout("r", task, tmp_path, "http://127.0.0.1:9/rollouts/r/v1", "tiny", tmp_path / "out", 30)


def test_a_served_session_is_classified_as_opencode_run_would(tmp_path: Path) -> None:
    rollout = _rollout(tmp_path)
    done = classify_served(rollout, ServedRollout("ses_1", SESSION, False, None, 1.0, 0.5), tmp_path / "out")
    assert (done.status, done.exit_status, done.n_model_calls) == ("finished", "stop", 2)
    assert done.info["finish_reasons"] == ["tool-calls", "stop"] and done.info["cpu_s"] == 0.5
    assert json.loads(Path(done.trajectory_path).read_text()) == SESSION
    events = [json.loads(line) for line in (tmp_path / "out/stdout.log").read_text().splitlines()]
    assert [e["type"] for e in events] == ["step_start", "tool_use", "step_finish", "step_start", "text",
                                           "step_finish"]
    failed = dict(SESSION, messages=[*SESSION["messages"][:2], _message(
        "assistant", [{"type": "step-start"}], {"name": "APIError", "data": {"message": "Cannot connect to API"}})])
    crashed = classify_served(rollout, ServedRollout("ses_1", failed, False, None, 1.0, 0.5), tmp_path / "out")
    assert crashed.status == "crashed" and "Cannot connect to API" in crashed.reason
    timed = classify_served(rollout, ServedRollout("ses_1", None, True, None, 30.0, 0.5), tmp_path / "out")
    assert timed.status == "timeout"
    lost = served_events(ServedRollout(None, None, False, "ConnectError: refused", 0.1, 0.0))
    assert lost == [{"type": "error", "sessionID": None, "error": {"data": {"message": "ConnectError: refused"}}}]


class _Client:
    def __init__(self) -> None:
        self.posts: list[tuple[str, Any]] = []

    def post(self, path: str, json: Any = None) -> None:
        self.posts.append((path, json))


def test_permission_requests_of_the_session_and_its_children_are_approved_once() -> None:
    client, sessions = _Client(), {"ses_1"}
    _handle(client, {"type": "session.created", "properties": {"info": {"id": "ses_2", "parentID": "ses_1"}}},
            sessions)
    _handle(client, {"type": "session.created", "properties": {"info": {"id": "ses_9", "parentID": "other"}}},
            sessions)
    for session, request in (("ses_1", "per_a"), ("ses_2", "per_b"), ("ses_9", "per_c")):
        _handle(client, {"type": "permission.asked", "properties": {"id": request, "sessionID": session}}, sessions)
    assert sessions == {"ses_1", "ses_2"}
    assert client.posts == [("/permission/per_a/reply", {"reply": "once"}), ("/permission/per_b/reply",
                                                                              {"reply": "once"})]
