"""The fork server (harness_adapters.fork_server / forked): runs a console entry point as forked children with a
subprocess's semantics (argv, cwd, stdin, logs, own session, exit codes, CPU time, timeouts), survives its own
death. The entry points here are the standard library's (``json.tool``, ``timeit``), run by this venv's python."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from harness_adapters.forked import ForkServer
from repro.execution.jail import Jail, jail_available


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


SCRIPT = """import json, os, subprocess, sys
print(json.dumps({"name": __name__, "argv": sys.argv, "own_dir_on_path": os.path.dirname(__file__) in sys.path,
                  "environ": dict(os.environ), "child_env": subprocess.run(["env"], capture_output=True,
                                                                            text=True).stdout}))
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "bin" / "probe_script.py"
    path.parent.mkdir()
    path.write_text(SCRIPT)
    return path


def _report(out: Path) -> dict:
    return json.loads((out / "stdout.log").read_text())


def test_a_script_entry_runs_as_main_with_its_argv(script: Path, tmp_path: Path) -> None:
    """A ``.py`` entry runs as ``python -P SCRIPT`` would: ``__main__``, its argv, its folder not on sys.path."""
    with ForkServer(Path(sys.executable), str(script), dict(os.environ), tmp_path / "server.log") as server:
        out = _out(tmp_path, "run")
        outcome = server.run([str(script), "3"], tmp_path, out, 30)
    assert outcome.exit_code == 3
    report = _report(out)
    assert (report["name"], report["argv"], report["own_dir_on_path"]) == ("__main__", [str(script), "3"], False)
    with pytest.raises(OSError, match="did not start"), \
            ForkServer(Path(sys.executable), str(tmp_path / "missing.py"), dict(os.environ), tmp_path / "m.log") as bad:
        bad.run([str(script), "0"], tmp_path, _out(tmp_path, "missing"), 30)
    assert "no script" in (tmp_path / "m.log").read_text()


@pytest.mark.parametrize("lang", ["C.UTF-8", None])
def test_a_run_gets_the_environment_an_exec_would(script: Path, tmp_path: Path, lang: str | None) -> None:
    """With ``env``, the child (and what it starts) sees what a fresh interpreter started with that environment
    sees: the request's variables, none of the server's, plus what the interpreter sets itself (without a locale
    variable, PEP 538's ``LC_CTYPE``); without, the server's own."""
    base = {"PATH": os.defpath} | ({"LANG": lang} if lang else {})
    server_env, run_env = base | {"SERVER_ONLY": "1", "HOME": "/server"}, base | {"RUN_ONLY": "2", "HOME": "/run"}
    with ForkServer(Path(sys.executable), str(script), server_env, tmp_path / "server.log") as server:
        forked, plain = _out(tmp_path, "env"), _out(tmp_path, "plain")
        assert server.run([str(script), "0"], tmp_path, forked, 30, env=run_env).exit_code == 0
        assert server.run([str(script), "0"], tmp_path, plain, 30).exit_code == 0
    exec_out = _out(tmp_path, "exec")
    with open(exec_out / "stdout.log", "w") as handle:
        subprocess.run([sys.executable, "-P", str(script), "0"], env=run_env, stdout=handle, check=True, timeout=30)
    expected = _report(exec_out)
    report = _report(forked)
    assert report["environ"] == expected["environ"] and report["child_env"] == expected["child_env"]
    assert ("LC_CTYPE" in report["environ"]) == (lang is None)  # the interpreter's own, when it coerces the locale
    assert _report(plain)["environ"]["SERVER_ONLY"] == "1" and "RUN_ONLY" not in _report(plain)["environ"]


@pytest.mark.skipif(jail_available() is not None, reason="needs a jail")
def test_a_jailed_run_does_not_need_the_servers_cwd(script: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's cwd (the harness's) need not exist in the rollout's jail: the child enters it from ``/``."""
    elsewhere, work = _out(tmp_path, "elsewhere"), _out(tmp_path, "work")
    monkeypatch.chdir(elsewhere)
    with ForkServer(Path(sys.executable), str(script), dict(os.environ), tmp_path / "server.log") as server, \
            Jail(read_write=[str(work)], read_only=[str(script.parent)]) as jail:
        outcome = server.run([str(script), "0"], work, work, 30, jail=jail.reusable_spec())
    assert outcome.exit_code == 0, (work / "stderr.log").read_text()
    assert not elsewhere.joinpath("stdout.log").exists() and _report(work)["argv"] == [str(script), "0"]
