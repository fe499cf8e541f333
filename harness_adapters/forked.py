"""Run a harness's console command as a child of a fork server (:mod:`harness_adapters.fork_server`) instead of a
fresh interpreter: the same process semantics as :func:`harness_adapters.processes.run_in_session` (own session,
cwd, stdin, ``stdout.log`` / ``stderr.log``, timeout kills the whole tree, exit code and CPU seconds), without
paying the command's imports on every run (mini-SWE-agent 1.x: ~3 CPU-s of LiteLLM a rollout on this machine).

:class:`ForkServer` is thread-safe (one rollout per thread); it starts the server on first use and again after
the server died (a run in flight then fails with ``OSError``, which the adapter reports as a crashed rollout).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from harness_adapters.processes import ProcessOutcome, kill_group, kill_tree
from repro.common.lifecycle import Closing
from repro.execution.jail import INIT

SERVER_SCRIPT = Path(__file__).with_name("fork_server.py")
READY_TIMEOUT_S = 120.0
START_TIMEOUT_S = 60.0
EXIT_AFTER_KILL_S = 30.0


@dataclass
class _Run:
    """One request's progress, filled in by the reader thread."""

    started: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)
    pid: int | None = None
    exit_code: int | None = None
    cpu_s: float = 0.0
    error: str = ""


class ForkServer(Closing):
    """A fork server for ``entry`` (``module:function``, or a script's ``.py`` path) in ``python``'s env, started
    with ``env``."""

    def __init__(self, python: Path, entry: str, env: dict[str, str], log_path: Path,
                 preload: tuple[str, ...] = ()) -> None:
        self.python, self.entry, self.env, self.log_path, self.preload = python, entry, env, log_path, preload
        self._lock = threading.Lock()
        self._runs: dict[str, _Run] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self.import_s: float | None = None
        self.threads: int | None = None  # the server's when it was ready (1: nothing but the main thread to fork)
        # What the server's interpreter set in its environment itself (PEP 538's LC_CTYPE where no locale variable
        # is set, imports that set variables): an exec'd one given the same locale variables would, so ``env`` gets it
        self.startup_env: dict[str, str] = {}
        self.starts = 0

    def run(self, argv: list[str], cwd: Path, output_dir: Path, timeout_s: float, *,
            stdin: Path | None = None, jail: Path | None = None, env: dict[str, str] | None = None) -> ProcessOutcome:
        """``argv`` as a forked child (inside the jail of the reusable spec ``jail``: see
        :func:`repro.execution.jail_init.enter`; with ``env`` as its environment instead of the server's, plus
        :attr:`startup_env`); as :func:`run_in_session`, ``exit_code`` is None after a timeout."""
        started, rid, run = time.monotonic(), uuid.uuid4().hex, _Run()
        request = {"id": rid, "argv": argv, "cwd": str(cwd), "stdin": str(stdin) if stdin else None,
                   "stdout": str(output_dir / "stdout.log"), "stderr": str(output_dir / "stderr.log"),
                   "jail": {"init": str(INIT), "spec": str(jail)} if jail else None}
        with self._lock:
            proc = self._ensure_server()
            if env is not None:
                request["env"] = dict(env) | {k: v for k, v in self.startup_env.items() if k not in env}  # its order
            self._runs[rid] = run
            _write_line(proc.stdin, request)
        try:
            if not run.started.wait(START_TIMEOUT_S) or run.pid is None:
                raise OSError(run.error or f"the fork server did not start the run within {START_TIMEOUT_S:.0f} s")
            timed_out = not run.ended.wait(max(timeout_s, 0.0))
            if timed_out:
                kill_tree(run.pid)
                run.ended.wait(EXIT_AFTER_KILL_S)
            elif run.exit_code is None:  # ended by the server's death: its exit code is lost
                kill_tree(run.pid)
                raise OSError(run.error)
            kill_group(run.pid)  # stragglers left in the run's own session
        finally:
            with self._lock:
                self._runs.pop(rid, None)
        return ProcessOutcome(exit_code=None if timed_out else run.exit_code, timed_out=timed_out,
                              duration_s=time.monotonic() - started, cpu_s=run.cpu_s)

    def _ensure_server(self) -> subprocess.Popen[bytes]:
        """The running server (started, or restarted after it died); called with the lock held."""
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            proc = subprocess.Popen([str(self.python), "-I", str(SERVER_SCRIPT), self.entry, *self.preload],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=self.env,
                                    start_new_session=True)
        assert proc.stdout is not None
        ready = _read_ready(proc, self.log_path)
        self.import_s, self.threads = ready.get("import_s"), ready.get("threads")
        self.startup_env = {k: v for k, v in (ready.get("environ") or {}).items() if self.env.get(k) != v}
        self._proc, self.starts = proc, self.starts + 1
        threading.Thread(target=self._read_events, args=(proc,), name="fork-server-events", daemon=True).start()
        return proc

    def _read_events(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            event = json.loads(line)
            with self._lock:
                run = self._runs.get(event.get("id", ""))
            if run is not None:
                _apply(run, event)
        with self._lock:  # the server is gone: every run still waiting on it fails
            orphans = list(self._runs.values())
        for run in orphans:
            run.error = run.error or f"the fork server exited (code {proc.wait()}; log {self.log_path})"
            run.started.set()
            run.ended.set()

    def close(self) -> None:
        """Stop the server (EOF on its stdin; killed if it does not exit)."""
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
            proc.wait()


def _apply(run: _Run, event: dict[str, Any]) -> None:
    kind = event.get("event")
    if kind == "started":
        run.pid = int(event["pid"])
        run.started.set()
    elif kind == "failed":
        run.error = str(event.get("error"))
        run.started.set()
    elif kind == "exit":
        run.exit_code, run.cpu_s = int(event["exit_code"]), float(event["cpu_s"])
        run.ended.set()


def _write_line(stream: IO[bytes] | None, message: dict[str, Any]) -> None:
    assert stream is not None
    stream.write((json.dumps(message) + "\n").encode())
    stream.flush()


def _read_ready(proc: subprocess.Popen[bytes], log_path: Path) -> dict[str, Any]:
    """The server's first line; an error naming its log when it dies or stays silent."""
    assert proc.stdout is not None
    result: dict[str, Any] = {}
    reader = threading.Thread(target=lambda: result.update(line=proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(READY_TIMEOUT_S)
    line = result.get("line") or b""
    if not line:
        kill_group(proc.pid)
        raise OSError(f"the fork server did not start (log: {log_path})")
    return json.loads(line)
