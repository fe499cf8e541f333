"""A fork server for a harness's console command: import it once, then fork one process per run.

Run by the harness env's python (``python -I fork_server.py ENTRY [PRELOAD ...]``); standard library only (never
``repro``). ``ENTRY`` is ``MODULE:FUNCTION`` (a console script's) or a script's path ending in ``.py``. It imports
``MODULE`` and the ``PRELOAD`` modules (what the command would import on its first model call: LiteLLM, ~3 CPU-s),
then serves requests. Each run is a child forked from this process that does what the console script's process
would: its own session, cwd, stdin/stdout/stderr files, ``sys.argv``, then ``sys.exit(FUNCTION())`` with the exit
code a console script would give; a script is run as ``__main__`` (``runpy.run_path``), as ``python -P SCRIPT``
would (its folder is not put on ``sys.path``). The environment is this process's own unless the request names one
(the caller starts the server with the environment each run needs where it is read at import time). Only imports
are shared: the child is a copy of a process that has run nothing but imports.

Protocol, one JSON object per line. stdin: ``{"id", "argv", "cwd", "stdin", "stdout", "stderr", "jail", "env"}``
(paths; stdin may be null: /dev/null; ``jail``, when set, puts the child in a rollout's jail first; ``env``, when
set, replaces the child's ``os.environ`` before that: what it and its subprocesses see from then on, while values
read at import time stay the server's); EOF stops the server. stdout: ``{"event": "ready", "pid", "import_s",
"threads", "environ"}`` once (``threads``: this process's, 1 when the imports started none; ``environ``: its
environment after them), then per request ``{"event": "started", "id", "pid"}`` (or ``{"event": "failed", "id",
"error"}``) and, when the child ends, ``{"event": "exit", "id", "pid", "exit_code", "cpu_s"}`` (``exit_code`` as
``subprocess`` gives it: minus the signal for a killed child). The server is single-threaded (a fork never copies a
lock held by another thread); SIGCHLD wakes its ``select`` through a wakeup pipe.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import importlib.util
import json
import os
import runpy
import select
import signal
import sys
import time
import traceback
from typing import Any


class Server:
    """The request loop: fork on each request line, report each child's exit."""

    def __init__(self, entry: Any, proto_in: int, proto_out: int) -> None:
        self.entry, self.proto_in, self.proto_out = entry, proto_in, proto_out
        self.pending = b""
        self.ids: dict[int, str] = {}
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)

    def send(self, message: dict[str, Any]) -> None:
        os.write(self.proto_out, (json.dumps(message) + "\n").encode())

    def serve(self) -> None:
        """Until stdin's EOF: start a child per request, report exits."""
        open_in = True
        while open_in or self.ids:
            readable, _, _ = select.select([self.wake_r, *([self.proto_in] if open_in else [])], [], [])
            if self.wake_r in readable:
                os.read(self.wake_r, 4096)
            if self.proto_in in readable:
                open_in = self.read_requests()
            self.reap()

    def read_requests(self) -> bool:
        chunk = os.read(self.proto_in, 65536)
        self.pending += chunk
        *lines, self.pending = self.pending.split(b"\n")
        for line in lines:
            if line.strip():
                self.start(json.loads(line))
        return bool(chunk)

    def start(self, request: dict[str, Any]) -> None:
        try:
            pid = os.fork()
        except OSError as exc:
            self.send({"event": "failed", "id": request["id"], "error": f"fork: {exc}"})
            return
        if pid == 0:
            self.run_child(request)
        self.ids[pid] = request["id"]
        self.send({"event": "started", "id": request["id"], "pid": pid})

    def reap(self) -> None:
        while self.ids:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            rid = self.ids.pop(pid, None)
            if rid is not None:
                self.send({"event": "exit", "id": rid, "pid": pid, "exit_code": os.waitstatus_to_exitcode(status),
                           "cpu_s": usage.ru_utime + usage.ru_stime})

    def run_child(self, request: dict[str, Any]) -> None:
        """In the forked child: become the command's process and run it; never returns."""
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd in (self.proto_in, self.proto_out, self.wake_r, self.wake_w):
                os.close(fd)
            os.setsid()
            redirect(request)
            if request.get("env") is not None:
                os.environ.clear()
                os.environ.update(request["env"])
            if request.get("jail"):
                os.chdir("/")  # the jail keeps the cwd, and the server's may not be in it
                enter_jail(request["jail"])
            os.chdir(request["cwd"])
            sys.argv = list(request["argv"])
            code = exit_code(self.entry)
        except BaseException:
            with contextlib.suppress(BaseException):
                traceback.print_exc()
        finally:
            with contextlib.suppress(BaseException):
                atexit._run_exitfuncs()
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(BaseException):
                    stream.flush()
            os._exit(code)


def redirect(request: dict[str, Any]) -> None:
    """fds 0, 1, 2 from the request's files, and fresh ``sys`` streams on them."""
    files = [(request.get("stdin") or os.devnull, os.O_RDONLY, 0),
             (request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 1),
             (request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 2)]
    for path, flags, target in files:
        fd = os.open(path, flags, 0o644)
        os.dup2(fd, target)
        os.close(fd)
    sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115


def enter_jail(jail: dict[str, str]) -> None:
    """Into the rollout's jail (``jail_init.enter`` of the file ``jail["init"]``, standard library only, with the
    reusable spec ``jail["spec"]``): this process then waits for its jailed child, which returns here."""
    spec = importlib.util.spec_from_file_location("repro_jail_init", jail["init"])
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {jail['init']}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.enter(jail["spec"])


def exit_code(entry: Any) -> int:
    """``sys.exit(entry())`` as the interpreter turns it into a process exit code."""
    try:
        result = entry()
    except SystemExit as exc:
        result = exc.code
    except BaseException:
        traceback.print_exc()
        return 1
    if result is None:
        return 0
    if isinstance(result, int):
        return result & 0xFF
    print(result, file=sys.stderr)
    return 1


def load(spec: str) -> Any:
    """The function ``MODULE:FUNCTION`` names, or one that runs the script ``spec`` (a ``.py`` path) as ``__main__``."""
    if spec.endswith(".py"):
        if not os.path.isfile(spec):
            raise FileNotFoundError(f"no script {spec}")
        return lambda: runpy.run_path(spec, run_name="__main__") and None
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def threads() -> int:
    """This process's threads, the interpreter's own included (a fork copies only the calling one): 1 is safe."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def main(argv: list[str]) -> None:
    proto_in, proto_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)  # whatever imports print goes to the server's log, never into the protocol
    started = time.monotonic()
    entry = load(argv[0])
    for module in argv[1:]:
        importlib.import_module(module)
    for stream in (sys.stdout, sys.stderr):  # else what imports printed would be copied into every child
        stream.flush()
    server = Server(entry, proto_in, proto_out)
    server.send({"event": "ready", "pid": os.getpid(), "import_s": round(time.monotonic() - started, 3),
                 "threads": threads(), "environ": dict(os.environ)})
    server.serve()


if __name__ == "__main__":
    main(sys.argv[1:])
