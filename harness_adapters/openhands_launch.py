"""How an OpenHands rollout's runner (``openhands_runner.py``) runs: its environment, its start (``launcher``) and
the cleanup of its tmux servers. Used by :mod:`harness_adapters.openhands`.

``launcher="exec"``: a fresh interpreter per rollout, ``<env>/bin/python -P openhands_runner.py <out>/spec.json``
(``-P``: the runner's folder holds the adapter's ``openhands.py``, which would shadow the SDK's package). Its
imports (the SDK, the tools, LiteLLM) cost ~5 CPU-s each time.

``launcher="fork"`` (the default): one fork server per harness (:mod:`harness_adapters.forked`), the env's Python
with :data:`RUNNER_PRELOAD` imported, forks a child per rollout that runs the runner script as ``__main__`` (by path:
its folder never goes on ``sys.path``), with the same argv, cwd, session, stdin and logs, the rollout's own
environment (the request's ``env``) and jail (the child enters it with ``jail_init.enter``, whose new root mounts the
jail's own ptys as the exec'd runner's jail does). The server is started with an environment of the same variables
and values as a rollout's, its HOME and ``TMUX_TMPDIR`` aside (state dir), because the SDK and LiteLLM read a few at
import time (``OPENHANDS_SUPPRESS_BANNER``, ``LITELLM_LOCAL_MODEL_COST_MAP``, the log settings). Of the SDK modules
that keep a path under HOME from import time, the critic's chat-template cache is preloaded but unused by the default
agent, and the provider-connection store is imported by each rollout itself (not preloaded: it sees the rollout's
HOME). Importing these starts no thread (``ForkServer.threads`` is 1), so the server forks a single-threaded process.
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path
from typing import Any

from harness_adapters.forked import ForkServer
from harness_adapters.processes import ProcessOutcome, isolated_env, kill_tree, run_in_session
from repro.common.lifecycle import Closing

RUNNER = Path(__file__).with_name("openhands_runner.py")
LAUNCHERS = ("fork", "exec")
# What the runner imports (openhands.sdk pulls in LiteLLM and the OpenAI SDK; the preset, the tools): a forked runner
# then costs ~0.55 CPU-s unjailed (its commands included), against ~0.75 with openhands.sdk alone and ~2.5 with
# LiteLLM alone; preloading what a rollout still imports (openai.resources, httpcore, h11, h2: ~0.15 CPU-s on their
# own) changed nothing measurable.
RUNNER_PRELOAD = ("openhands.sdk", "openhands.sdk.context.condenser", "openhands.sdk.workspace",
                  "openhands.tools.preset.default", "pydantic")


def build_process_env(*, home: Path, tmux_tmpdir: Path) -> dict[str, str]:
    """A clean environment: a few locale/PATH variables from the parent, nothing else (no secrets, no
    observability endpoints), an isolated HOME (OpenHands keeps ``~/.openhands`` there) and ``TMUX_TMPDIR``."""
    return isolated_env(home) | {
        "TMUX_TMPDIR": str(tmux_tmpdir),
        "OPENHANDS_SUPPRESS_BANNER": "1",
        "DO_NOT_TRACK": "1",
        "ANONYMIZED_TELEMETRY": "false",
    }


def kill_tmux_servers(tmux_tmpdir: Path, *, jailed: bool = False) -> int:
    """Kill every tmux server with a socket under ``tmux_tmpdir`` and its process tree; return how many ran.

    ``jailed``: the servers ran in the rollout's jail, in its PID namespace, and ended with it (the runner unlinks
    the sockets of servers that exited before it did): each socket left is a server that was still running and
    was killed with the jail. The pid a jailed server would report is the namespace's, never one to kill here: a
    server that still answers is told to ``kill-server`` instead."""
    killed = 0
    for socket in sorted(tmux_tmpdir.glob("tmux-*/*")):
        if not socket.is_socket():
            continue
        query = ["kill-server"] if jailed else ["display-message", "-p", "#{pid}"]
        try:
            out = subprocess.run(["tmux", "-S", str(socket), *query], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            out = None
        if jailed:
            killed += 1
        elif out is not None and out.returncode == 0 and out.stdout.strip().isdigit():
            kill_tree(int(out.stdout.strip()))
            killed += 1
    return killed


class RunnerLauncher(Closing):
    """Runs each rollout's runner command (``[python, "-P", RUNNER, spec]``) by ``launcher``: ``exec`` or ``fork``
    (one fork server for ``python``, made on first use, its HOME and log under the folder ``state()`` gives)."""

    def __init__(self, launcher: str, python: Path, state: Any) -> None:
        if launcher not in LAUNCHERS:
            raise ValueError(f"launcher must be one of {LAUNCHERS}, got {launcher!r}")
        self.launcher, self.python, self._state = launcher, python, state
        self._lock = threading.Lock()
        self._forks: ForkServer | None = None

    def run(self, cmd: list[str], workdir: Path, env: dict[str, str], output_dir: Path, timeout_s: float,
            jail: Any = None) -> ProcessOutcome:
        """``cmd`` to its end in ``workdir`` with ``env`` (in ``jail``, a :class:`repro.execution.jail.Jail`); a fork
        server that cannot start or dies crashes this rollout only (said in its ``stderr.log``; the next one
        restarts it)."""
        if self.launcher == "exec":
            return run_in_session(cmd, workdir, env, output_dir, timeout_s, jail=jail)
        spec = jail.reusable_spec() if jail is not None else None
        try:
            return self.fork_server().run(cmd[2:], workdir, output_dir, timeout_s, jail=spec, env=env)
        except OSError as exc:
            with open(output_dir / "stderr.log", "a", encoding="utf-8") as log:
                log.write(f"fork server: {exc}\n")
            return ProcessOutcome(exit_code=None, timed_out=False, duration_s=0.0, cpu_s=0.0)

    def fork_server(self) -> ForkServer:
        """The fork server (it starts on its first run): the runner script as its entry, the SDK preloaded, started
        in an environment like a rollout's."""
        with self._lock:
            if self._forks is None:
                state = Path(self._state())
                env = build_process_env(home=state / "home", tmux_tmpdir=state / "tmux")
                self._forks = ForkServer(self.python, str(RUNNER), env, state / "fork_server.log", RUNNER_PRELOAD)
            return self._forks

    def close(self) -> None:
        """Stop the fork server if one ran."""
        with self._lock:
            forks, self._forks = self._forks, None
        if forks is not None:
            forks.close()
