"""The fork server (harness_adapters.fork_server / forked): runs a console entry point as forked children with a
subprocess's semantics (argv, cwd, stdin, logs, own session, exit codes, CPU time, timeouts), survives its own
death. The entry points here are the standard library's (``json.tool``, ``timeit``), run by this venv's python."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from harness_adapters.forked import ForkServer


@pytest.fixture
def json_tool(tmp_path: Path) -> Iterator[ForkServer]:
    server = ForkServer(Path(sys.executable), "json.tool:main", dict(os.environ), tmp_path / "server.log")
    yield server
    server.close()


@pytest.fixture
def timeit(tmp_path: Path) -> Iterator[ForkServer]:
    server = ForkServer(Path(sys.executable), "timeit:main", dict(os.environ), tmp_path / "server.log")
    yield server
    server.close()


def _out(tmp_path: Path, name: str) -> Path:
    out = tmp_path / name
    out.mkdir()
    return out


def test_a_run_gets_its_argv_stdin_and_log_files(json_tool: ForkServer, tmp_path: Path) -> None:
    source = tmp_path / "in.json"
    source.write_text('{"b": 1, "a": [2]}')
    out = _out(tmp_path, "ok")
    outcome = json_tool.run(["json.tool", "--sort-keys"], tmp_path, out, 30, stdin=source)
    assert (outcome.exit_code, outcome.timed_out) == (0, False)
    assert json.loads((out / "stdout.log").read_text()) == {"a": [2], "b": 1}
    text = (out / "stdout.log").read_text()
    assert text.index('"a"') < text.index('"b"')  # --sort-keys reached the entry point's argv
    bad = _out(tmp_path, "bad")
    outcome = json_tool.run(["json.tool", "--no-such-flag"], tmp_path, bad, 30)
    assert outcome.exit_code == 2 and "unrecognized arguments" in (bad / "stderr.log").read_text()
    assert json_tool.starts == 1 and json_tool.import_s is not None


def test_a_run_is_in_its_own_session_and_cwd(timeit: ForkServer, tmp_path: Path) -> None:
    work = _out(tmp_path, "work")
    probe = "import os; print(os.getcwd(), os.getsid(0) == os.getpid(), os.getppid() != 1, flush=True)"
    outcome = timeit.run(["timeit", "-n", "1", "-r", "1", "-s", probe, "pass"], work, work, 30)
    assert outcome.exit_code == 0
    cwd, own_session, _ = (work / "stdout.log").read_text().splitlines()[0].split()
    assert (cwd, own_session) == (str(work), "True")


def test_runs_in_parallel_threads_each_get_their_own_result(json_tool: ForkServer, tmp_path: Path) -> None:
    results: dict[int, int | None] = {}

    def one(i: int) -> None:
        source = tmp_path / f"in{i}.json"
        source.write_text(json.dumps({"i": i}) if i % 2 == 0 else "{broken")
        results[i] = json_tool.run(["json.tool"], tmp_path, _out(tmp_path, f"out{i}"), 60, stdin=source).exit_code

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {i: 0 if i % 2 == 0 else 1 for i in range(8)}
    assert all(json.loads((tmp_path / f"out{i}/stdout.log").read_text()) == {"i": i} for i in range(0, 8, 2))


def test_a_run_past_its_timeout_is_killed_with_its_children(timeit: ForkServer, tmp_path: Path) -> None:
    out = _out(tmp_path, "slow")
    # a duration no other test uses: another worker's test may run its own `sleep 300` meanwhile
    spawn = "import subprocess; subprocess.Popen(['sleep', '317']); import time; time.sleep(317)"
    outcome = timeit.run(["timeit", "-n", "1", "-r", "1", spawn], out, out, 2)
    assert outcome.timed_out and outcome.exit_code is None
    assert not [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "317"]]


def test_a_dead_server_fails_the_runs_in_flight_and_is_restarted(timeit: ForkServer, tmp_path: Path) -> None:
    errors: list[str] = []
    sleeper = threading.Thread(target=lambda: _expect_oserror(timeit, tmp_path, errors))
    sleeper.start()
    while not timeit._runs or not all(r.pid for r in timeit._runs.values()):
        threading.Event().wait(0.05)
    assert timeit._proc is not None
    timeit._proc.kill()
    sleeper.join(60)
    assert errors and "fork server exited" in errors[0]
    out = _out(tmp_path, "after")
    assert timeit.run(["timeit", "-n", "1", "-r", "1", "pass"], out, out, 30).exit_code == 0
    assert timeit.starts == 2


def _expect_oserror(server: ForkServer, tmp_path: Path, errors: list[str]) -> None:
    out = _out(tmp_path, "inflight")
    try:
        server.run(["timeit", "-n", "1", "-r", "1", "import time; time.sleep(120)"], out, out, 120)
    except OSError as exc:
        errors.append(str(exc))
