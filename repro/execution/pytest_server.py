"""Graded pytest runs forked from a warm interpreter instead of started afresh.

A fresh ``python -c <pytest main>`` spends ~0.2-0.3 s of CPU importing pytest before it runs a test; in the CPU
miniature that import was most of a rollout's grading cost. A fork server (:mod:`repro.execution.pytest_zygote_main`,
run by the grading interpreter) imports pytest once and forks a child per run. The child is what ``run_limited``
would have started: a new session, the same rlimits, the given environment only (the server itself starts with a
clean one: no credentials, fixed hash seed), the working copy first on ``sys.path`` after pytest was imported, the
same arguments; the same hard timeout, after which (and after every run) the child's whole session is killed.
Nothing of one run is left in the server, which never imports tested code.

One server per concurrent caller (a pool, grown on demand); a server that dies is replaced, and a run it could not
serve falls back to a fresh process, so the fork server is only ever a speed-up.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from repro.common.lifecycle import Closing
from repro.common.waiting import readable
from repro.execution.limits import CommandResult, ResourceLimits, clean_env, kill_session, rlimits

ZYGOTE = Path(__file__).with_name("pytest_zygote_main.py")
START_TIMEOUT_S = 60.0
_REPLY_TIMEOUT_S = 10.0


class ServerGone(OSError):
    """The fork server died or answered out of protocol (the caller falls back to a fresh process)."""


class PytestServer(Closing):
    """One fork server process of ``python``; serves one run at a time."""

    def __init__(self, python: str) -> None:
        self.python = python
        self.home = tempfile.mkdtemp(prefix="repro-pytest-server-")
        self.proc = subprocess.Popen([python, str(ZYGOTE)], cwd=self.home, env=clean_env(Path(self.home)),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        self._buffer = b""
        try:
            self.version = self._reply(START_TIMEOUT_S).get("ready")
        except ServerGone:
            self.version = None
        if self.version is None:  # no pytest there, or it hangs: the caller's fresh process says why
            self.close()
            raise ServerGone(f"the pytest fork server of {python} did not start")

    def _reply(self, timeout_s: float) -> dict[str, Any]:
        """The next JSON line from the server, within ``timeout_s`` (``{}`` on timeout)."""
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not readable(fd, left):
                return {}
            chunk = os.read(fd, 65536)
            if not chunk:
                raise ServerGone("the pytest fork server exited")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError as exc:
            raise ServerGone(f"the pytest fork server answered {line[:200]!r}") from exc

    def run(self, args: list[str], cwd: Path, env: dict[str, str], timeout_s: float,
            limits: ResourceLimits) -> CommandResult:
        """``pytest.main(args)`` in a forked child, as ``run_limited`` would run ``python -c <main> args``."""
        started = time.monotonic()
        with tempfile.NamedTemporaryFile(prefix="repro-pytest-", suffix=".log", delete=False) as handle:
            out = handle.name
        try:
            request = {"cwd": str(cwd), "env": env, "args": args, "out": out,
                       "rlimits": rlimits(limits)}
            try:
                self.proc.stdin.write((json.dumps(request) + "\n").encode())
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError) as exc:
                raise ServerGone(f"the pytest fork server is gone: {exc}") from exc
            pid = self._reply(_REPLY_TIMEOUT_S).get("pid")
            if not isinstance(pid, int):
                raise ServerGone("the pytest fork server did not fork")
            status, timed_out = self._wait(pid, timeout_s)
            output = Path(out).read_bytes().decode("utf-8", "replace")
        finally:
            with contextlib.suppress(OSError):
                os.unlink(out)
        return CommandResult(status, output, timed_out, time.monotonic() - started)

    def _wait(self, pid: int, timeout_s: float) -> tuple[int, bool]:
        """(exit status, timed out); the child's session is killed in any case, as ``run_limited`` does."""
        reply = self._reply(timeout_s)
        timed_out = "status" not in reply
        kill_session(pid)
        if timed_out:
            reply = self._reply(_REPLY_TIMEOUT_S)
        if not isinstance(reply.get("status"), int):
            raise ServerGone(f"the pytest fork server lost child {pid}")
        return reply["status"], timed_out

    def close(self) -> None:
        kill_session(self.proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        shutil.rmtree(self.home, ignore_errors=True)


class ServerPool(Closing):
    """Idle servers per interpreter; a caller takes one (or starts one) and gives it back after its run."""

    def __init__(self) -> None:
        self._idle: dict[str, list[PytestServer]] = {}
        self._all: list[PytestServer] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def run(self, python: str, args: list[str], cwd: Path, env: dict[str, str], timeout_s: float,
            limits: ResourceLimits) -> CommandResult:
        """Run on an idle server of ``python`` (started if none); :class:`ServerGone` if it failed (and is gone)."""
        server = self._take(python)
        try:
            result = server.run(args, cwd, env, timeout_s, limits)
        except ServerGone:
            self._discard(server)
            raise
        with self._lock:
            self._idle.setdefault(python, []).append(server)
        return result

    def _take(self, python: str) -> PytestServer:
        if os.getpid() != self._pid:  # a forked copy of this process: its parent's servers are not its own
            self._idle, self._all, self._lock, self._pid = {}, [], threading.Lock(), os.getpid()
        with self._lock:
            idle = self._idle.get(python)
            if idle:
                return idle.pop()
        server = PytestServer(python)
        with self._lock:
            self._all.append(server)
        return server

    def _discard(self, server: PytestServer) -> None:
        server.close()
        with self._lock:
            if server in self._all:
                self._all.remove(server)

    def close(self) -> None:
        if os.getpid() != self._pid:  # at exit of a forked copy: the servers are its parent's
            return
        with self._lock:
            servers, self._all, self._idle = self._all, [], {}
        for server in servers:
            server.close()


POOL = ServerPool()
atexit.register(POOL.close)
