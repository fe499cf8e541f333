"""Running a command the way the local sandbox does: clean environment, resource limits, hard timeout."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

# Only these variables reach sandboxed commands: no credentials, no proxies, no user config.
SAFE_ENV_KEYS = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")


@dataclass
class ResourceLimits:
    """Per-process limits for sandboxed commands and graded tests, the one home of their values (0 = unlimited); the
    local sandbox's config holds one, the frozen spec records one (``repro.sandbox.config``)."""

    cpu_s: int = 300  # RLIMIT_CPU: SIGXCPU at the limit, SIGKILL a second later
    memory_mb: int = 4096  # RLIMIT_AS
    file_size_mb: int = 256  # RLIMIT_FSIZE
    open_files: int = 1024  # RLIMIT_NOFILE


@dataclass
class CommandResult:
    exit_code: int
    output: str
    timed_out: bool
    duration_s: float


def clean_env(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """A minimal environment: safe keys from ours, a private HOME, no bytecode files, fixed hash seed."""
    env = {k: os.environ[k] for k in SAFE_ENV_KEYS if k in os.environ}
    env.update(HOME=str(home), PYTHONDONTWRITEBYTECODE="1", PYTHONHASHSEED="0", PYTHONUNBUFFERED="1",
               PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")  # third-party pytest plugins stay out of graded runs
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    python_bin = str(Path(sys.executable).parent)
    if python_bin not in env["PATH"].split(os.pathsep):
        env["PATH"] = python_bin + os.pathsep + env["PATH"]
    env.update(extra or {})
    return env


def rlimits(limits: ResourceLimits) -> list[tuple[int, int, int]]:
    """``(resource, soft, hard)`` for ``setrlimit``: what a sandboxed process gets (the pytest fork server's children
    apply the same list, sent to them as numbers)."""
    pairs = [(resource.RLIMIT_AS, limits.memory_mb * 1024 * 1024),
             (resource.RLIMIT_FSIZE, limits.file_size_mb * 1024 * 1024),
             (resource.RLIMIT_NOFILE, limits.open_files)]
    triples = [(kind, value, value) for kind, value in pairs if value]
    if limits.cpu_s:  # SIGXCPU at the limit (graders read it as a timeout), SIGKILL a second later
        triples.append((resource.RLIMIT_CPU, limits.cpu_s, limits.cpu_s + 1))
    return [*triples, (resource.RLIMIT_CORE, 0, 0)]  # a process killed by a limit leaves no core file behind


def _apply_limits(limits: ResourceLimits) -> None:
    for kind, soft, hard in rlimits(limits):
        resource.setrlimit(kind, (soft, hard))


def run_limited(cmd: list[str], cwd: Path, env: dict[str, str], timeout_s: float, limits: ResourceLimits,
                stdin: str | None = None) -> CommandResult:
    """Run ``cmd`` in its own session with rlimits, for at most ``timeout_s``.

    Whatever it leaves behind is killed when it ends, on every exit (normal, timeout, error): every process of its
    session, background ones included. Output is read until the command itself has exited (a background process
    that keeps the pipe open cannot hold the result back), and every wait is bounded."""
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=lambda: _apply_limits(limits),
    )
    chunks: list[bytes] = []
    reader = threading.Thread(target=_read_all, args=(proc.stdout, chunks), daemon=True)
    reader.start()
    timed_out = False
    try:
        if stdin is not None:
            _feed(proc, stdin)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
    finally:
        kill_session(proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=_KILL_WAIT_S)
        reader.join(timeout=_KILL_WAIT_S)  # the pipe closes once the session is gone
    output = b"".join(chunks).decode("utf-8", "replace")
    return CommandResult(proc.returncode if proc.returncode is not None else -signal.SIGKILL, output, timed_out,
                         time.monotonic() - started)


_KILL_WAIT_S = 5.0


def _read_all(stream: IO[bytes], chunks: list[bytes]) -> None:
    with contextlib.suppress(OSError, ValueError):
        while piece := stream.read1(65536):
            chunks.append(piece)


def _feed(proc: subprocess.Popen, stdin: str) -> None:
    with contextlib.suppress(BrokenPipeError, OSError):
        proc.stdin.write(stdin.encode())
        proc.stdin.close()


def kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` (the leader included): its process group, and processes that
    moved to another group of the same session. A process that started a new session of its own escapes."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(sid, signal.SIGKILL)
    for pid in _session_members(sid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _session_members(sid: int) -> list[int]:
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp session ...
        if len(fields) > 3 and int(fields[3]) == sid:
            members.append(int(entry.name))
    return members
