"""The pytest fork server (repro/execution/pytest_server.py): a forked run is the run a fresh process gives (same
statuses, exit code, environment, limits, timeout), nothing of one run reaches the next, and a dead server costs
nothing but speed."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from repro.execution import pytest_server
from repro.execution.limits import ResourceLimits
from repro.execution.pytest_runner import run_pytest
from repro.sandbox.grading_env import default_grading_python

TESTS = {
    "test_mix.py": "import os\n\ndef test_pass():\n    assert 1 + 1 == 2\n\ndef test_fail():\n    assert 1 == 2\n\n"
                   "def test_env():\n    assert os.environ['HOME'] != '/root' and 'SECRET_API_KEY' not in os.environ\n",
    "test_error.py": "import pytest\n\n@pytest.fixture\ndef broken():\n    raise RuntimeError('x')\n\n"
                     "def test_uses(broken):\n    pass\n",
    "test_leak.py": "import json\n\ndef test_set():\n    json.LEAKED = 1\n\ndef test_seen():\n"
                    "    assert not hasattr(json, 'LEAKED_BEFORE')\n    json.LEAKED_BEFORE = 1\n",
}


@pytest.fixture(scope="module")
def python() -> str:
    return default_grading_python()


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    for name, text in TESTS.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "pytest.py").write_text("raise SystemExit('a working copy replaced the test runner')\n")
    return tmp_path


@pytest.mark.parametrize("ids", [["test_mix.py"], ["test_error.py"], ["test_leak.py"], ["missing.py"]])
def test_a_forked_run_is_a_fresh_run(repo: Path, python: str, ids: list[str], monkeypatch) -> None:
    monkeypatch.setenv("SECRET_API_KEY", "sk-not-for-tests")
    fresh = run_pytest(repo, ids, 60, python=python, forked=False)
    forked = run_pytest(repo, ids, 60, python=python, forked=True)
    again = run_pytest(repo, ids, 60, python=python, forked=True)  # a second run sees nothing of the first
    assert fresh.statuses == forked.statuses == again.statuses
    assert fresh.exit_code == forked.exit_code == again.exit_code
    if ids == ["test_mix.py"]:
        assert forked.statuses == {"test_mix.py::test_pass": "PASSED", "test_mix.py::test_fail": "FAILED",
                                   "test_mix.py::test_env": "PASSED"}


def test_a_timed_out_run_is_killed_with_its_background_processes(tmp_path: Path, python: str) -> None:
    marker = tmp_path / "alive"
    (tmp_path / "test_slow.py").write_text(
        "import subprocess, sys, time\n\ndef test_slow():\n"
        f"    subprocess.Popen(['sh', '-c', 'while true; do touch {marker}; sleep 0.1; done'])\n"
        "    time.sleep(60)\n")
    started = time.monotonic()
    run = run_pytest(tmp_path, ["test_slow.py"], 2, python=python, forked=True)
    assert run.timed_out and time.monotonic() - started < 30
    marker.unlink(missing_ok=True)
    time.sleep(0.5)
    assert not marker.exists(), "a background process of the timed-out run survived"
    (tmp_path / "test_ok.py").write_text("def test_ok():\n    pass\n")
    assert run_pytest(tmp_path, ["test_ok.py"], 60, python=python, forked=True).statuses == \
        {"test_ok.py::test_ok": "PASSED"}  # the server serves the next run


def test_limits_apply_to_a_forked_run(tmp_path: Path, python: str) -> None:
    (tmp_path / "test_mem.py").write_text("def test_mem():\n    b = bytearray(900 * 1024 * 1024)\n")
    limited = run_pytest(tmp_path, ["test_mem.py"], 60, ResourceLimits(memory_mb=512), python, forked=True)
    assert limited.statuses == {"test_mem.py::test_mem": "FAILED"} and "MemoryError" in limited.log


def test_a_dead_server_is_replaced(tmp_path: Path, python: str) -> None:
    (tmp_path / "test_ok.py").write_text("def test_ok():\n    pass\n")
    assert run_pytest(tmp_path, ["test_ok.py"], 60, python=python, forked=True).exit_code == 0
    servers = [s for s in pytest_server.POOL._all if s.python == python]
    assert servers, "the run did not go through a fork server"
    for server in servers:
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(timeout=10)
    for _ in range(len(servers) + 1):  # each dead server fails once (fresh process), then is replaced
        run = run_pytest(tmp_path, ["test_ok.py"], 60, python=python, forked=True)
        assert run.statuses == {"test_ok.py::test_ok": "PASSED"}
    assert all(s.proc.poll() is None for s in pytest_server.POOL._all if s.python == python)


def test_an_interpreter_without_pytest_falls_back_to_the_fresh_process(tmp_path: Path) -> None:
    import sys

    (tmp_path / "test_ok.py").write_text("def test_ok():\n    pass\n")
    bare = tmp_path / "bare"
    import subprocess

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    run = run_pytest(tmp_path, ["test_ok.py"], 60, python=str(bare / "bin" / "python"), forked=True)
    assert run.exit_code == 1 and "No module named 'pytest'" in run.log


def test_a_forked_copy_of_the_caller_uses_servers_of_its_own(tmp_path: Path, python: str) -> None:
    (tmp_path / "test_ok.py").write_text("def test_ok():\n    pass\n")
    assert run_pytest(tmp_path, ["test_ok.py"], 60, python=python, forked=True).exit_code == 0
    parents = [s.proc.pid for s in pytest_server.POOL._all]
    pid = os.fork()
    if pid == 0:  # the child: its own server, and its exit leaves the parent's alive
        code = run_pytest(tmp_path, ["test_ok.py"], 60, python=python, forked=True).exit_code
        mine = [s.proc.pid for s in pytest_server.POOL._all]
        pytest_server.POOL.close()
        os._exit(0 if code == 0 and mine and not set(mine) & set(parents) else 1)
    deadline = time.monotonic() + 60  # bounded: a forked child of a threaded process must not hang the suite
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked caller did not finish within 60 s")
    assert os.waitstatus_to_exitcode(done[1]) == 0
    assert all(s.proc.poll() is None for s in pytest_server.POOL._all)
    assert run_pytest(tmp_path, ["test_ok.py"], 60, python=python, forked=True).exit_code == 0
