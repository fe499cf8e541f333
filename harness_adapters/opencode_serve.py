"""OpenCode's own headless server (``opencode serve``) as a launcher: one server per concurrent rollout slot, one
session per rollout, instead of one ``opencode run`` process per rollout.

What ``opencode run --auto`` does in 1.18.33 (read from its bundled JS) is what a rollout here does over the
server's HTTP API: ``POST /session`` with the same permission rules (``question``, ``plan_enter``, ``plan_exit``
denied), a subscription to ``GET /event`` that answers every ``permission.asked`` of the session (and of its child
sessions) with ``once``, then ``POST /session/<id>/message`` with the agent, ``{providerID, modelID}`` and the
task as one text part; the call returns when the session is idle. The session's stored messages are the export
(``GET /session/<id>`` and ``/message``), and the instance is disposed after the rollout.

The rollout's provider base URLs live in its config: the server reads ``OPENCODE_CONFIG`` each time it creates an
instance (one per directory, ``x-opencode-directory``), so each rollout's config is written to that path just
before its first request, and a server runs one rollout at a time. The model sees what ``opencode run`` sends
(``tests/integration/test_opencode_serve.py`` compares the recorded calls of both launchers).

What the launcher cannot do: jail each rollout. The agent's tools run inside the shared server process (its
``read``/``write``/``grep`` tools in-process, ``bash`` as its children), so one jail per rollout is not possible;
the adapter refuses ``launcher=serve`` with a jail (``isolation=none`` only).
"""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from harness_adapters.processes import kill_tree
from repro.common.accounting import process_tree_cpu_s
from repro.common.lifecycle import Closing
from repro.common.net import free_port

READY_TIMEOUT_S = 120.0
DENIED = ("question", "plan_enter", "plan_exit")  # what `opencode run` denies in the sessions it creates
DIRECTORY_HEADER = "x-opencode-directory"


@dataclass(frozen=True)
class ServedRollout:
    """What one rollout on a server gave: its session, the stored session (info + messages), how it ended."""

    session_id: str | None
    session: dict[str, Any] | None
    timed_out: bool
    error: str | None
    duration_s: float
    cpu_s: float


class OpenCodeServer(Closing):
    """One ``opencode serve`` process (started on first use, restarted if it died), one rollout at a time."""

    def __init__(self, command: list[str], env: dict[str, str], folder: Path, config_path: Path) -> None:
        self.command, self.env, self.folder, self.config_path = command, env, folder, config_path
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def ensure_started(self) -> None:
        """Start the server if it is not running, and wait until it answers ``/global/health``."""
        if self.proc is not None and self.proc.poll() is None:
            return
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        with open(self.folder / "serve.stdout.log", "ab") as out, open(self.folder / "serve.stderr.log", "ab") as err:
            self.proc = subprocess.Popen([*self.command, "--port", str(port), "--hostname", "127.0.0.1"],
                                         cwd=self.folder, env=self.env, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=err, start_new_session=True)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise OSError(f"opencode serve exited with {self.proc.returncode} (see {self.folder}/serve.stderr.log)")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/global/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.1)
        raise OSError(f"opencode serve did not answer within {READY_TIMEOUT_S:g} s")

    def cpu_seconds(self) -> float:
        """CPU seconds of the server and its live children (plus children it reaped)."""
        return process_tree_cpu_s(self.proc.pid if self.proc is not None else None)

    def run(self, workdir: Path, config: bytes, task: str, agent: str, model: dict[str, str],
            timeout_s: float) -> ServedRollout:
        """One rollout: its config in place, then a session in ``workdir`` prompted with ``task``."""
        self.ensure_started()
        self.config_path.write_bytes(config)
        started, cpu0 = time.monotonic(), self.cpu_seconds()
        headers = {DIRECTORY_HEADER: str(workdir)}
        with httpx.Client(base_url=self.url, headers=headers, timeout=httpx.Timeout(60.0)) as client:
            session_id, timed_out, error = None, False, None
            try:
                session_id = _create_session(client)
                with _approving(self.url, headers, session_id):
                    timed_out, error = _prompt(client, session_id, task, agent, model, timeout_s)
                session = _stored_session(client, session_id)
            except httpx.HTTPError as exc:
                session, error = None, f"{type(exc).__name__}: {exc}"
            finally:
                with contextlib.suppress(httpx.HTTPError):
                    if session_id is not None:
                        client.delete(f"/session/{session_id}")
                    client.post("/instance/dispose")
        return ServedRollout(session_id, session, timed_out, error, time.monotonic() - started,
                             self.cpu_seconds() - cpu0)

    def close(self) -> None:
        """Stop the server and everything it started."""
        if self.proc is not None and self.proc.poll() is None:
            kill_tree(self.proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        self.proc = None


class ServerPool(Closing):
    """Servers handed out one rollout at a time (one per concurrent rollout, made on demand)."""

    def __init__(self, make: Any) -> None:
        self._make = make
        self._idle: queue.SimpleQueue[OpenCodeServer] = queue.SimpleQueue()
        self._all: list[OpenCodeServer] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def server(self) -> Iterator[OpenCodeServer]:
        """An idle server (a new one when none is idle), returned to the pool afterwards."""
        try:
            server = self._idle.get_nowait()
        except queue.Empty:
            with self._lock:
                server = self._make(len(self._all))
                self._all.append(server)
        try:
            yield server
        finally:
            self._idle.put(server)

    def close(self) -> None:
        """Stop every server."""
        with self._lock:
            for server in self._all:
                server.close()


def _create_session(client: httpx.Client) -> str:
    rules = [{"permission": name, "action": "deny", "pattern": "*"} for name in DENIED]
    response = client.post("/session", json={"permission": rules})
    response.raise_for_status()
    return str(response.json()["id"])


def _prompt(client: httpx.Client, session_id: str, task: str, agent: str, model: dict[str, str],
            timeout_s: float) -> tuple[bool, str | None]:
    """Send the task and wait for the session to go idle: (timed out, error text)."""
    body = {"agent": agent, "model": model, "parts": [{"type": "text", "text": task}]}
    try:
        response = client.post(f"/session/{session_id}/message", json=body, timeout=httpx.Timeout(timeout_s or None))
    except httpx.TimeoutException:
        with contextlib.suppress(httpx.HTTPError):
            client.post(f"/session/{session_id}/abort")
        return True, None
    if response.status_code >= 400:
        return False, f"HTTP {response.status_code}: {response.text[:500]}"
    return False, None


def _stored_session(client: httpx.Client, session_id: str) -> dict[str, Any]:
    """``{"info", "messages"}``: what ``opencode export`` prints, from the server."""
    info = client.get(f"/session/{session_id}")
    messages = client.get(f"/session/{session_id}/message")
    info.raise_for_status()
    messages.raise_for_status()
    return {"info": info.json(), "messages": messages.json()}


@contextlib.contextmanager
def _approving(url: str, headers: dict[str, str], session_id: str) -> Iterator[None]:
    """While the body runs, answer each permission request of the session (or of a session it started) with
    ``once``, as ``opencode run --auto`` does (the event stream is open before the body starts)."""
    client = httpx.Client(base_url=url, headers=headers, timeout=httpx.Timeout(10.0, read=None))
    try:
        stream = client.send(client.build_request("GET", "/event"), stream=True)
        stream.raise_for_status()
    except httpx.HTTPError:
        client.close()
        raise
    thread = threading.Thread(target=_approve_events, args=(client, stream, session_id), daemon=True,
                              name="opencode-permissions")
    thread.start()
    try:
        yield
    finally:
        stream.close()  # ends the thread's read
        client.close()
        thread.join(5)


def _approve_events(client: httpx.Client, stream: httpx.Response, session_id: str) -> None:
    sessions = {session_id}
    with contextlib.suppress(httpx.HTTPError, httpx.StreamClosed, RuntimeError):
        for line in stream.iter_lines():
            event = _event(line)
            if event is not None:
                _handle(client, event, sessions)


def _event(line: str) -> dict[str, Any] | None:
    if not line.startswith("data:"):
        return None
    try:
        event = json.loads(line[len("data:"):])
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def _handle(client: httpx.Client, event: dict[str, Any], sessions: set[str]) -> None:
    props = event.get("properties") or {}
    if event.get("type") == "session.created":
        info = props.get("info") or {}
        if info.get("parentID") in sessions:
            sessions.add(str(info.get("id")))
    elif event.get("type") == "permission.asked" and props.get("sessionID") in sessions:
        client.post(f"/permission/{props['id']}/reply", json={"reply": "once"})
