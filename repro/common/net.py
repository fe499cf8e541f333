"""Small networking helpers shared by the servers and tests."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_for_http(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    """Poll ``url`` until it answers 200; fail early if ``proc`` exits, or if the answer names another process
    (a JSON body whose ``pid`` is not ``proc``'s: the port was taken, and our server could not bind it)."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process {proc.args[:3]} exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    _check_answering_pid(url, resp.read(), proc)
                    return
        except (urllib.error.URLError, OSError) as exc:
            last_error = exc
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer within {timeout_s}s (last error: {last_error})")


def _check_answering_pid(url: str, body: bytes, proc: subprocess.Popen | None) -> None:
    """Raise when ``url`` is answered by a process other than ``proc`` (its body's ``pid``, where it has one)."""
    try:
        pid = json.loads(body).get("pid") if body else None
    except (ValueError, AttributeError):
        return
    if proc is not None and isinstance(pid, int) and pid != proc.pid:
        raise RuntimeError(f"{url} is answered by another process (pid {pid}), not the one just started "
                           f"(pid {proc.pid}): the port is taken; choose another (0 = a free port)")
