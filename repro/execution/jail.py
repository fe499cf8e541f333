"""A rollout's jail on the host: its harness process and every command the agent runs see the rollout's working copy
and output folder, the harness's own environment read-only, the system's directories read-only, a private ``/tmp``
and ``/proc``, and nothing else of the file system (no other workspace, task file, cache, run folder or home); its
network is a loopback of its own where only the proxy's port answers, relayed to the proxy (:class:`ProxyRelay`).

Built with the kernel's namespaces through ``unshare`` (util-linux: user, mount, PID, network, IPC, UTS) and
:mod:`repro.execution.jail_init` inside; no daemon, no root needed where unprivileged user namespaces are allowed.
:func:`jail_available` says whether this machine allows it (else the run records ``isolation: none``).
"""

from __future__ import annotations

import contextlib
import functools
import marshal
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from repro.common.lifecycle import Closing
from repro.execution.jail_init import hold, inside, serve_relay

INIT = Path(__file__).with_name("jail_init.py")
NAMESPACES = ["--user", "--map-root-user", "--mount", "--pid", "--net", "--ipc", "--uts", "--fork", "--kill-child"]


@functools.cache
def jail_available() -> str | None:
    """None when a jail can be built here, else why not (one line)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return "no `unshare` (util-linux) on PATH"
    try:
        done = subprocess.run([unshare, *NAMESPACES, "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare failed: {exc}"
    if done.returncode != 0:
        return f"user namespaces are not allowed here ({done.stderr.strip()[:200]})"
    return _trial_jail()


def _trial_jail() -> str | None:
    """None when a whole jail comes up (its mounts, ``pivot_root``, loopback: a kernel or security module may allow
    the namespaces and refuse these, e.g. AppArmor's userns restriction), else its error."""
    work = Path(tempfile.mkdtemp(prefix="repro-jail-trial-"))
    try:
        with Jail(read_write=[str(work)]) as jail:
            done = subprocess.run(jail.command(["/bin/sh", "-c", "test -w ."], work, {"PATH": os.defpath}),
                                  capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"a trial jail failed: {exc}"
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return f"a trial jail failed (exit {done.returncode}): {lines[-1][:200] if lines else 'no output'}"
    return None


@functools.cache
def interpreter_paths(python: str = sys.executable) -> tuple[str, ...]:
    """What a Python interpreter needs to run: its environment's folder and its base installation."""
    exe = Path(python)
    prefix = exe.parent.parent
    paths = {str(prefix)}
    try:
        out = subprocess.run([python, "-I", "-c", "import sys; print(sys.base_prefix); print(sys.prefix)"],
                             capture_output=True, text=True, timeout=30).stdout.split()
        paths.update(out)
    except (OSError, subprocess.TimeoutExpired):
        pass
    paths.add(str(exe.resolve().parent.parent))
    return tuple(sorted(paths))  # cached: asked for every jailed command, it runs the interpreter once


def _answers(url: str) -> bool:
    """Whether something listens at ``url``'s address now (else the jail gets no relay: a call is refused inside
    it as it would be outside, rather than accepted and dropped)."""
    parts = urlsplit(url)
    try:
        socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80), timeout=5).close()
    except OSError:
        return False
    return True


class ProxyRelay(Closing):
    """A Unix socket that forwards each connection to the proxy's TCP address and nowhere else: the jail's only
    way out."""

    def __init__(self, proxy_url: str, folder: Path) -> None:
        parts = urlsplit(proxy_url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.path = str(folder / "proxy.sock")
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen(64)
        threading.Thread(target=serve_relay, args=(self.server, self._connect), daemon=True, name="jail-relay").start()

    def _connect(self) -> socket.socket:
        upstream = socket.create_connection((self.host, self.port), timeout=10)
        upstream.settimeout(None)
        return upstream

    def close(self) -> None:
        """Stop accepting: the shutdown wakes the thread blocked in ``accept`` (a close alone leaves it there,
        holding its socket), then close."""
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()


@dataclass
class Jail:
    """One rollout's jail: ``read_write`` (its working copy, output folder), ``read_only`` (the harness's
    environment), ``proxy_url`` (the only address its network reaches; None: no network at all), ``private``
    (paths that exist in it as empty folders of its own, such as the HOME its environment names)."""

    read_write: list[str]
    read_only: list[str] = field(default_factory=list)
    proxy_url: str | None = None
    private: list[str] = field(default_factory=list)
    moved: dict[str, str] = field(default_factory=dict)  # host folder -> where it is in the jail (read-write)

    def __enter__(self) -> Jail:
        self.folder = Path(tempfile.mkdtemp(prefix="repro-jail-"))
        (self.folder / "root").mkdir()
        self.relay = ProxyRelay(self.proxy_url, self.folder) if self.proxy_url and _answers(self.proxy_url) else None
        self._holder: subprocess.Popen[str] | None = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._holder is not None:
            self._holder.kill()  # unshare's --kill-child ends the jail's PID 1, and with it everything inside
            self._holder.wait()
        if self.relay is not None:
            self.relay.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def hold(self, cwd: Path) -> list[str]:
        """Keep one jail up for the rollout (:func:`repro.execution.jail_init.hold`, ended with this object) and
        return the prefix that runs a command inside it, in ``cwd`` as the jail sees it."""
        self._holder, prefix = hold(self.launch(cwd), str(cwd))
        return prefix

    def launch(self, cwd: Path) -> list[str]:
        """The command line that starts this jail in ``cwd`` up to ``--`` (what it runs comes after)."""
        return self.command([], cwd, {"PATH": os.defpath})

    def _inside(self, path: Path | str) -> str:
        """Where the host ``path`` is in the jail (a moved folder's new place, else the same path)."""
        return inside({"moved": self._moved()}, str(Path(path).resolve()))

    def _moved(self) -> dict[str, str]:
        return {str(Path(source).resolve()): target for source, target in self.moved.items()}

    def command(self, cmd: list[str], cwd: Path, env: dict[str, str]) -> list[str]:
        """``cmd`` as it runs in the jail (``cwd`` and ``env`` inside it; ``/tmp`` a tmpfs of its own)."""
        spec = self._spec() | {"cwd": self._inside(cwd), "env": env}
        return [*self._launch(spec), *cmd]

    def reusable_spec(self) -> Path:
        """A spec that jails whatever process uses it with that process's cwd and environment, ``/tmp`` and the
        private folders kept from one use to the next (:func:`repro.execution.jail_init.enter`, which jails a forked
        process; or ``unshare ... jail_init.py SPEC -- CMD``)."""
        tmp = self.folder / "tmp"
        tmp.mkdir(exist_ok=True)
        spec = self._spec() | {"reusable": True}
        spec["private"]["/tmp"] = str(tmp)
        return self._write_spec(spec)

    def _spec(self) -> dict:
        spec = {"root": str(self.folder / "root"), "read_only": [*interpreter_paths(), *self.read_only],
                "read_write": [str(Path(p).resolve()) for p in self.read_write], "private": {},
                "moved": self._moved()}
        for index, path in enumerate(self.private):
            source = self.folder / "private" / str(index)
            source.mkdir(parents=True, exist_ok=True)
            spec["private"][str(Path(path))] = str(source)
        if self.relay is not None:
            spec |= {"relay_socket": self.relay.path, "relay_port": self.relay.port}
            spec["read_write"].append(self.relay.path)
        return spec

    def _write_spec(self, spec: dict) -> Path:
        spec_file = self.folder / f"spec-{os.urandom(6).hex()}.marshal"
        spec_file.write_bytes(marshal.dumps(spec))  # read by jail_init without importing json
        return spec_file

    def _launch(self, spec: dict) -> list[str]:
        return [shutil.which("unshare") or "unshare", *NAMESPACES, sys.executable, "-I", "-S", str(INIT),
                str(self._write_spec(spec)), "--"]
