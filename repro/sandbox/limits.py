"""Running a command the way the local sandbox does: clean environment, resource limits, hard timeout."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# Only these variables reach sandboxed commands: no credentials, no proxies, no user config.
SAFE_ENV_KEYS = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")


@dataclass
class ResourceLimits:
    """Per-process limits for sandboxed commands (0 = unlimited)."""

    cpu_s: int = 300
    memory_mb: int = 4096
    file_size_mb: int = 256
    open_files: int = 1024


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


def _apply_limits(limits: ResourceLimits) -> None:
    pairs = [
        (resource.RLIMIT_AS, limits.memory_mb * 1024 * 1024),
        (resource.RLIMIT_FSIZE, limits.file_size_mb * 1024 * 1024),
        (resource.RLIMIT_NOFILE, limits.open_files),
    ]
    for kind, value in pairs:
        if value:
            resource.setrlimit(kind, (value, value))
    if limits.cpu_s:  # SIGXCPU at the limit (graders read it as a timeout), SIGKILL a second later
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a process killed by a limit leaves no core file behind


def run_limited(cmd: list[str], cwd: Path, env: dict[str, str], timeout_s: float, limits: ResourceLimits,
                stdin: str | None = None) -> CommandResult:
    """Run ``cmd`` in its own session with rlimits; on timeout the whole process group is killed."""
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=lambda: _apply_limits(limits),
    )
    try:
        out, _ = proc.communicate(input=stdin.encode() if stdin is not None else None, timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        timed_out = True
    return CommandResult(proc.returncode, out.decode("utf-8", "replace"), timed_out, time.monotonic() - started)
