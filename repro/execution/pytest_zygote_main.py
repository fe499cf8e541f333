"""The pytest fork server's own program, run by the grading interpreter (standard library + pytest only: it never
imports ``repro``). See :mod:`repro.execution.pytest_server`.

It imports pytest once, then serves one request at a time, one JSON line each on stdin::

    {"cwd": ..., "env": {...}, "args": [...], "rlimits": [[resource, soft, hard], ...], "out": path}

For each it forks a child that starts a new session, applies the rlimits (``repro.execution.limits.rlimits``),
points stdin at ``/dev/null`` and stdout/stderr at ``out``, takes ``env`` as its whole environment, puts ``cwd``
first on ``sys.path`` (after pytest was imported, as ``pytest_runner.PYTEST_MAIN`` does) and exits with
``pytest.main(args)``'s code. It answers
``{"pid": pid}`` at once and ``{"status": code}`` when the child has ended (a negative code: killed by that signal).
"""

import json
import os
import resource
import sys

sys.path[:] = [p for p in sys.path if p not in ("", os.getcwd(), os.path.dirname(os.path.abspath(__file__)))]
import pytest  # noqa: E402  (imported before any working copy can shadow it)


def _child(request: dict) -> None:
    """In the forked child: never returns."""
    code = 70
    try:
        os.setsid()
        for kind, soft, hard in request["rlimits"]:
            resource.setrlimit(kind, (soft, hard))
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.closerange(3, 1024)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.dont_write_bytecode = bool(request["env"].get("PYTHONDONTWRITEBYTECODE"))
        sys.path.insert(0, os.getcwd())
        code = int(pytest.main(request["args"]))
    except SystemExit as exc:  # as the interpreter would exit
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:  # anything else: reported in the log, a non-zero exit
        print(f"pytest fork server: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _status(wait_status: int) -> int:
    return -os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else os.WEXITSTATUS(wait_status)


def _answer(payload: dict) -> None:
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()


def main() -> None:
    _answer({"ready": pytest.__version__})
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        _answer({"pid": pid})
        _, wait_status = os.waitpid(pid, 0)
        _answer({"status": _status(wait_status)})


if __name__ == "__main__":
    main()
