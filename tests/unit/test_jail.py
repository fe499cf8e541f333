"""The jail's building blocks on this machine: a jail held for a rollout (:meth:`Jail.hold`, mini-SWE-agent 2.x's
commands entering it with ``nsenter``) keeps its ``/tmp``, HOME and working copy (at a fixed place) across commands,
runs each with the caller's environment, and another rollout's jail and the host's ``/tmp`` stay out of sight;
``jail_init.enter`` jails a forked process (1.x's fork server); pseudo-terminals exist inside; ``jail_available``
tries a whole jail. Controls: the same reads succeed outside the jail."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from repro.execution.jail import INIT, Jail, jail_available

pytestmark = pytest.mark.skipif(jail_available() is not None, reason=f"no jail here: {jail_available()}")


def _sh(prefix: list[str], command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``command`` as mini's local environment runs it behind the jail's prefix (``shell=True``)."""
    return subprocess.run(shlex.join([*prefix, "/bin/sh", "-c", command]), shell=True, cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


def test_a_held_jail_keeps_its_tmp_and_home_and_sees_nothing_else(tmp_path: Path) -> None:
    host_secret = tmp_path / "host-secret.txt"
    host_secret.write_text("gold")
    work, other_work, home = tmp_path / "work", tmp_path / "other", str(tmp_path / "shared-home")
    work.mkdir()
    other_work.mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": home, "MARK": "from-the-caller"}
    with Jail(read_write=[], moved={str(work): "/testbed"}, private=[home]) as jail, \
            Jail(read_write=[], moved={str(other_work): "/testbed"}, private=[home]) as other:
        prefix, other_prefix = jail.hold(work), other.hold(other_work)
        first = _sh(prefix, "echo kept > /tmp/note; echo mine > ~/h; echo edit > file.txt; pwd; echo $MARK", work, env)
        second = _sh(prefix, f"cat /tmp/note ~/h; cat {host_secret} 2>&1; ls {other_work} {work} 2>&1", work, env)
        foreign = _sh(other_prefix, "cat /tmp/note ~/h file.txt 2>&1; echo $$", other_work, env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.split() == ["/testbed", "from-the-caller"]  # a fixed place, the caller's environment
    assert (work / "file.txt").read_text() == "edit\n"  # the working copy is shared with the host
    assert second.stdout.splitlines()[:2] == ["kept", "mine"]  # /tmp and HOME kept across commands
    assert second.stdout.count("No such file") == 3 and "gold" not in second.stdout  # no host path is there
    assert not {"kept", "mine", "edit"} & set(foreign.stdout.split())  # another rollout's jail: its own
    assert int(foreign.stdout.split()[-1]) > 1  # a PID namespace of its own (its init is 1)
    assert not (Path(home) / "h").exists() and host_secret.read_text() == "gold"
    control = subprocess.run(["cat", str(host_secret)], capture_output=True, text=True)  # outside: readable
    assert control.stdout == "gold"


ENTER = """
import importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location("jail_init", sys.argv[1])
module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
module.enter(sys.argv[2])
import pty
seen = {"pid": os.getpid(), "cwd": os.getcwd(), "secret": os.path.exists(sys.argv[3]), "pty": len(pty.openpty())}
open("seen.json", "w").write(json.dumps(seen))
"""


def test_enter_jails_a_running_process_and_returns_in_pid_1(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("gold")
    work = tmp_path / "work"
    work.mkdir()
    with Jail(read_write=[str(work)]) as jail:
        done = subprocess.run([sys.executable, "-c", ENTER, str(INIT), str(jail.reusable_spec()), str(secret)],
                              cwd=work, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads((work / "seen.json").read_text()) == {"pid": 1, "cwd": str(work), "secret": False, "pty": 2}


def test_enter_passes_on_how_the_jailed_process_ended(tmp_path: Path) -> None:
    """Killed from the host (as a harness's timeout kills it), the jailed process's end is its parent's: -9."""
    head = ENTER.split("import pty")[0]
    with Jail(read_write=[str(tmp_path)]) as jail:
        spec = str(jail.reusable_spec())
        exited = subprocess.run([sys.executable, "-c", f"{head}\nsys.exit(7)", str(INIT), spec, "x"], cwd=tmp_path,
                                timeout=60)
        sleeper = subprocess.Popen([sys.executable, "-c", f"{head}\nimport time\ntime.sleep(60)", str(INIT), spec,
                                    "x"], cwd=tmp_path)
        deadline = time.monotonic() + 30
        while not (jailed := psutil.Process(sleeper.pid).children()) and time.monotonic() < deadline:
            time.sleep(0.05)
        jailed[0].kill()
        assert (exited.returncode, sleeper.wait(timeout=30)) == (7, -9)


def test_a_machine_that_allows_namespaces_but_refuses_the_jails_mounts_has_no_jail(tmp_path: Path,
                                                                                   monkeypatch) -> None:
    """``jail_available`` tries a whole jail, not only ``unshare``: where the mounts are refused (as under AppArmor's
    user-namespace restriction) it names the error. Control: the real init comes up here."""
    import repro.execution.jail as jail_module

    assert jail_module._trial_jail() is None
    refusing = tmp_path / "init.py"
    refusing.write_text("import sys; sys.stderr.write('mount none -> /: Operation not permitted\\n'); sys.exit(1)\n")
    monkeypatch.setattr(jail_module, "INIT", refusing)
    assert jail_module._trial_jail() == "a trial jail failed (exit 1): mount none -> /: Operation not permitted"


def test_a_closed_jail_leaves_no_relay_thread_or_socket_behind(tmp_path: Path) -> None:
    """Thousands of rollouts a run, each with a jail: closing one stops its relay thread and closes every socket of
    the connections it relayed (before, each left its accept thread and sockets, and a long run ran out of room)."""
    import os
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    threading.Thread(target=lambda: [server.accept()[0].close() for _ in range(6)], daemon=True).start()

    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = fds()
    for _ in range(3):
        with Jail(read_write=[str(tmp_path)], proxy_url=f"http://127.0.0.1:{port}") as jail:
            assert jail.relay is not None
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:  # one relayed connection
                client.connect(jail.relay.path)
                assert client.recv(1) == b""  # the upstream closed: the relay ends the connection
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (fds() > before
                                           or any(t.name == "jail-relay" for t in threading.enumerate())):
        time.sleep(0.05)
    assert not [t.name for t in threading.enumerate() if t.name == "jail-relay"]
    assert fds() <= before
    server.close()
