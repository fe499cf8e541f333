"""OpenHands' isolation setting without its env: the config's check, the resolved mode in the identity, the runner's
jail flag, and the tmux cleanup of a jailed rollout (never by the pid a server reports: it would be the jail's)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import harness_adapters.openhands as oh
import harness_adapters.openhands_launch as launch
import harness_adapters.openhands_runner as runner
from harness_adapters.isolation import resolve_isolation
from harness_adapters.openhands import OpenHandsConfig, OpenHandsHarness
from repro.common.venvs import HarnessEnv
from repro.protocols import HarnessRollout
from repro.tasks.schema import Task


def test_config_checks_isolation() -> None:
    assert OpenHandsConfig().isolation == "auto"
    with pytest.raises(ValueError, match=r"harness\.isolation must be one of auto, jail, none"):
        OpenHandsConfig(isolation="docker")


def test_identity_records_the_resolved_mode_and_the_spec_the_jail(tmp_path: Path) -> None:
    root = tmp_path / "env"
    (root / "lib" / "python3.12" / "site-packages").mkdir(parents=True)
    env = HarnessEnv("openhands", "1.58.2", root, root / "bin" / "python", root / "bin")
    for mode in ("auto", "none"):
        harness = OpenHandsHarness(OpenHandsConfig(isolation=mode), env=env)
        assert harness.identity()["settings"]["isolation"] == resolve_isolation(mode)
    assert str(root) in harness.read_only()
    task = Task(instance_id="t", repo="o/r", base_commit="0" * 40, problem_statement="Fix it.")
    rollout = HarnessRollout("r1", task, tmp_path / "work", "http://127.0.0.1:9/rollouts/r1/v1", "tiny",
                             tmp_path / "out", 60.0)
    assert harness.rollout_spec(rollout)["jail"] is False
    assert harness.rollout_spec(rollout, jailed=True)["jail"] is True


@pytest.fixture
def tmux_dir() -> Iterator[Path]:
    if shutil.which("tmux") is None:
        pytest.skip("needs tmux")
    path = Path(tempfile.mkdtemp(prefix="oh-tmux-t-", dir="/tmp"))
    try:
        yield path
    finally:
        for socket in path.glob("tmux-*/*"):
            subprocess.run(["tmux", "-S", str(socket), "kill-server"], capture_output=True, timeout=10)
        shutil.rmtree(path, ignore_errors=True)


def _server(tmux_dir: Path, command: str) -> Path:
    env = os.environ | {"TMUX_TMPDIR": str(tmux_dir)}
    subprocess.run(["tmux", "new-session", "-d", "-s", "s", command], env=env, check=True, timeout=10)
    return next(tmux_dir.glob("tmux-*/default"))


def _answers(socket: Path) -> bool:
    return subprocess.run(["tmux", "-S", str(socket), "list-sessions"], capture_output=True, timeout=10).returncode == 0


def test_jailed_cleanup_counts_sockets_and_kills_through_the_socket(tmux_dir: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    socket = _server(tmux_dir, "sleep 300")
    monkeypatch.setattr(launch, "kill_tree", lambda pid: pytest.fail(f"killed pid {pid}: a jailed pid is the jail's"))
    assert oh.kill_tmux_servers(tmux_dir, jailed=True) == 1
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _answers(socket):
        time.sleep(0.05)
    assert not _answers(socket)
    assert oh.kill_tmux_servers(tmux_dir, jailed=True) == 1  # a socket left: a server the jail's end killed


def test_runner_unlinks_the_sockets_of_servers_that_exited(tmux_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMUX_TMPDIR", str(tmux_dir))
    live = _server(tmux_dir, "sleep 300")
    gone = live.with_name("gone")
    subprocess.run(["tmux", "-S", str(gone), "new-session", "-d", "-s", "g", "sleep 300"], check=True, timeout=10)
    subprocess.run(["tmux", "-S", str(gone), "kill-server"], check=True, timeout=10)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _answers(gone):
        time.sleep(0.05)
    assert gone.is_socket() and live.is_socket()  # tmux leaves its socket when it exits
    assert runner.unlink_dead_tmux_sockets() == 1
    assert not gone.exists() and live.is_socket()
