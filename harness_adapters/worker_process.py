"""A long-lived helper process that speaks JSON lines: ready handshake, reader thread, EOF to stop.

Harness-agnostic: the mini-SWE-agent pool uses it; other harness workers can too. The child writes its
stderr to a log file, runs in its own session (so its whole tree can be killed) and must print one
``{"event": "ready", ...}`` line before anything else.
"""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import threading
from pathlib import Path
from typing import Any

from harness_adapters.processes import kill_tree, tail, wait_for_exit
from repro.common.waiting import readable

Event = tuple["WorkerProcess", dict[str, Any] | None]  # None: the worker's output ended (it exited)


class WorkerStartError(RuntimeError):
    """A worker process did not come up."""


class WorkerProcess:
    """One worker: started and ready on construction; every line it prints goes to ``events``."""

    def __init__(
        self,
        cmd: list[str],
        *,
        cwd: Path,
        env: dict[str, str],
        log_path: Path,
        events: queue.Queue[Event],
        startup_timeout_s: float,
    ) -> None:
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                cmd,
                cwd=cwd,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
            )
        self.ready = self._read_ready(startup_timeout_s)
        if self.ready.get("event") != "ready":
            self.stop(polite=False)
            raise WorkerStartError(f"worker did not start ({self.ready}); log {log_path}:\n{tail(log_path, 2000)}")
        self._events = events
        self._reader = threading.Thread(target=self._read_events, name=f"worker-{self.pid}-reader", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        """True while the process has not exited."""
        return self.proc.poll() is None

    def send(self, message: dict[str, Any]) -> bool:
        """Write one JSON line; False when the worker is gone (its EOF event follows)."""
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
            return True
        except (OSError, ValueError):
            return False

    def stop(self, *, polite: bool) -> None:
        """End the worker: EOF and up to 5 s to exit when ``polite``, then SIGKILL its tree and reap it."""
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        if polite:
            wait_for_exit(self.pid, 5.0)
        kill_tree(self.pid)
        self.proc.wait()
        reader = getattr(self, "_reader", None)
        if reader is not None and reader is not threading.current_thread():
            reader.join(timeout=5.0)

    def _read_ready(self, timeout_s: float) -> dict[str, Any]:
        if not readable(self.proc.stdout, timeout_s):
            return {"error": f"no ready line within {timeout_s:g} s"}
        line = self.proc.stdout.readline()
        try:
            return json.loads(line)
        except ValueError:
            return {"error": f"unreadable first line {line[:200]!r}"}

    def _read_events(self) -> None:
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self._events.put((self, json.loads(line)))
        self._events.put((self, None))
