"""Long-lived mini-SWE-agent worker: many rollouts in one interpreter, one thread per rollout.

Run by the isolated env's python (``python -I worker.py``); it imports the standard library and
``minisweagent`` only (never ``repro``). Each rollout is built the way ``mini`` (``minisweagent/run/mini.py``,
``main``) builds one, from the same ``-c`` config files and command-line options, then ``agent.run(task)``:
only the process is shared, so LiteLLM is imported once instead of once per rollout.

Protocol, one JSON object per line:

- stdin, one request per rollout: ``{"rollout_id", "config_files": [paths, merged in order],
  "cli": {mini.main's keyword options: model_name, environment_class, yolo, cost_limit, exit_immediately,
  output}, "workdir", "output_dir", "timeout_s", "diff_command", "startup_command"}``; EOF ends the worker.
  Container rollouts (``environment_class: docker``): ``startup_command`` runs through mini's own ``execute``
  before the agent starts (as its SWE-bench runner's ``env_startup_command``); ``diff_command`` after the agent
  ends, its output returned as ``diff``; then mini's ``cleanup`` removes the container.
- stdout: ``{"event": "ready", "pid", "mini_version", "import_s"}`` once, then per rollout
  ``{"event": "result", "rollout_id", "outcome": "returned" | "raised" | "timeout", "exit_status",
  "submission", "n_model_calls", "trajectory_path", "duration_s", "cpu_s", "error"[, "diff", "diff_error"]}``; a rollout
  whose thread outlived its timeout report sends ``{"event": "released", "rollout_id"}`` when it finally ends.

Process-wide state: the environment (``MSWEA_*``, ``LITELLM_*``, the dummy key) is set once by whoever starts
the worker; nothing here changes the cwd (mini's ``LocalEnvironment`` passes ``cwd=`` to each command).
File descriptor 0 becomes /dev/null and fd 1 a copy of stderr, as for the ``mini`` subprocess; requests and
results travel on private copies of the original descriptors. ``sys.stdout`` routes writes by thread, so each
rollout's console output (InteractiveAgent prints every message) lands in ``<output_dir>/stdout.log``.

Timeouts: a watchdog reports a rollout ``timeout`` once it runs past ``timeout_s``, kills its running command
(the command sessions whose processes work under its workdir) and lowers the agent's own
``wall_time_limit_seconds`` so mini stops at its next step with ``TimeExceeded``. A thread stuck inside a
model request ends when that request does; the pool restarts a worker that gathers too many such threads.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, TextIO

WATCH_INTERVAL_S = 0.2
_ERROR_TAIL_CHARS = 4000


class ThreadRoutedStream:
    """A text stream that writes to the file bound to the calling thread, else to ``default``."""

    encoding = "utf-8"
    errors = "replace"

    def __init__(self, default: TextIO) -> None:
        self._default = default
        self._local = threading.local()

    def bind(self, stream: TextIO | None) -> None:
        """Route the calling thread's writes to ``stream`` (None: back to the default)."""
        self._local.stream = stream

    def _target(self) -> TextIO:
        return getattr(self._local, "stream", None) or self._default

    def write(self, text: str) -> int:
        return self._target().write(text)

    def writelines(self, lines: list[str]) -> None:
        self._target().writelines(lines)

    def flush(self) -> None:
        self._target().flush()

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True


class Channel:
    """JSON lines to the pool, one writer at a time."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        line = json.dumps(message, default=str)
        with self._lock:
            self._stream.write(line + "\n")
            self._stream.flush()


def take_standard_streams() -> tuple[TextIO, TextIO, ThreadRoutedStream]:
    """Move requests/results onto private descriptors; fd 0 -> /dev/null, fd 1 -> stderr, route sys.stdout."""
    requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
    results = os.fdopen(os.dup(1), "w", encoding="utf-8")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)  # sys.stdin still wraps fd 0, which now reads /dev/null
    router = ThreadRoutedStream(sys.stderr)
    sys.stdout = router
    return requests, results, router


def build_agent(mini_cli: Any, config_files: list[str], cli: dict[str, Any]) -> tuple[Any, str]:
    """The agent and task exactly as ``minisweagent.run.mini.main`` builds them from ``-c`` files and options."""
    unset = mini_cli.UNSET
    configs = [mini_cli.get_config_from_spec(Path(path)) for path in config_files]
    output = cli.get("output")
    configs.append(
        {
            "run": {"task": cli.get("task") or unset},
            "agent": {
                "agent_class": cli.get("agent_class") or unset,
                "mode": "yolo" if cli.get("yolo") else unset,
                "cost_limit": cli["cost_limit"] if cli.get("cost_limit") is not None else unset,
                "confirm_exit": False if cli.get("exit_immediately") else unset,
                "output_path": Path(output) if output else unset,
            },
            "model": {"model_class": cli.get("model_class") or unset, "model_name": cli.get("model_name") or unset},
            "environment": {"environment_class": cli.get("environment_class") or unset},
        }
    )
    config = mini_cli.recursive_merge(*configs)
    task = config.get("run", {}).get("task", unset)
    if task is unset:
        raise ValueError("no task: the rollout config sets no run.task (mini would prompt for one)")
    model = mini_cli.get_model(config=config.get("model", {}))
    env = mini_cli.get_environment(config.get("environment", {}), default_type="local")
    agent = mini_cli.get_agent(model, env, config.get("agent", {}), default_type="interactive")
    return agent, task


class Rollout:
    """One request in flight: its deadline, its agent once built, whether the watchdog gave up on it."""

    def __init__(self, request: dict[str, Any]) -> None:
        self.request = request
        self.rollout_id = str(request["rollout_id"])
        self.output_dir = Path(request["output_dir"])
        self.config_files, self.cli = list(request["config_files"]), dict(request["cli"])
        self.started = time.monotonic()
        self.deadline = self.started + float(request["timeout_s"])
        self.agent: Any = None
        self.timed_out = False
        self.diff: str | None = None  # container rollouts: the patch taken inside the container before removal
        self.diff_error = ""

    def trajectory_path(self) -> str | None:
        output = self.cli.get("output")
        return output if output and Path(output).exists() else None

    def n_model_calls(self) -> int:
        return int(getattr(self.agent, "n_calls", 0) or 0)


class Worker:
    """Reads requests, runs each in a thread, watches deadlines, writes results."""

    def __init__(self, mini_cli: Any, channel: Channel, router: ThreadRoutedStream) -> None:
        self._mini = mini_cli
        self._channel = channel
        self._router = router
        self._lock = threading.Lock()
        self._running: dict[str, Rollout] = {}

    def serve(self, requests: TextIO) -> None:
        """Start one thread per request line until EOF, then stop every command still running."""
        threading.Thread(target=self._watch, name="watchdog", daemon=True).start()
        for line in requests:
            if line.strip():
                self._start(line)
        with self._lock:
            workdirs = [r.request.get("workdir", "") for r in self._running.values()]
        for workdir in workdirs:
            kill_commands_under(workdir)

    def _start(self, line: str) -> None:
        try:
            rollout = Rollout(json.loads(line))
        except (ValueError, KeyError, TypeError) as exc:
            self._channel.send({"event": "error", "error": f"bad request {line[:200]!r}: {exc}"})
            return
        with self._lock:
            self._running[rollout.rollout_id] = rollout
        threading.Thread(target=self._run, args=(rollout,), name=f"rollout-{rollout.rollout_id}", daemon=True).start()

    def _run(self, rollout: Rollout) -> None:
        """Thread body: run the agent, then report whatever happened (nothing escapes unreported)."""
        cpu_start = time.thread_time()
        outcome, error = "returned", ""
        try:
            self._run_agent(rollout)
        except BaseException:
            outcome, error = "raised", traceback.format_exc()[-_ERROR_TAIL_CHARS:]
            with contextlib.suppress(OSError):
                (rollout.output_dir / "stderr.log").write_text(error, encoding="utf-8")
        self._finish(rollout, outcome, error, time.thread_time() - cpu_start)

    def _run_agent(self, rollout: Rollout) -> None:
        """Build and run the agent with this thread's console output going to ``<output_dir>/stdout.log``."""
        rollout.output_dir.mkdir(parents=True, exist_ok=True)
        with open(rollout.output_dir / "stdout.log", "w", encoding="utf-8") as log:
            self._router.bind(log)
            try:
                agent, task = build_agent(self._mini, rollout.config_files, rollout.cli)
                rollout.agent = agent
                run_startup_command(agent.env, rollout.request.get("startup_command") or "",
                                    rollout.request.get("startup_timeout_s"))
                agent.run(task)
            finally:
                self._router.bind(None)
                take_diff_and_clean_up(rollout)
                getattr(getattr(rollout.agent, "env", None), "close_jail", lambda: None)()

    def _finish(self, rollout: Rollout, outcome: str, error: str, cpu_s: float) -> None:
        with self._lock:
            self._running.pop(rollout.rollout_id, None)
            if rollout.timed_out:
                self._channel.send({"event": "released", "rollout_id": rollout.rollout_id})
                return
            self._channel.send(self._result(rollout, outcome, error, cpu_s))

    def _result(self, rollout: Rollout, outcome: str, error: str, cpu_s: float) -> dict[str, Any]:
        last = rollout.agent.messages[-1] if rollout.agent is not None and rollout.agent.messages else {}
        extra = last.get("extra", {}) if outcome != "timeout" else {}
        diff = {"diff": rollout.diff, "diff_error": rollout.diff_error} if rollout.request.get("diff_command") else {}
        return diff | {
            "event": "result",
            "rollout_id": rollout.rollout_id,
            "outcome": outcome,
            "exit_status": str(extra.get("exit_status", "")),
            "submission": str(extra.get("submission", "")),
            "n_model_calls": rollout.n_model_calls(),
            "trajectory_path": rollout.trajectory_path(),
            "duration_s": round(time.monotonic() - rollout.started, 3),
            "cpu_s": round(cpu_s, 4),
            "error": error,
        }

    def _watch(self) -> None:
        """Watchdog loop: an error is logged and the loop goes on (the pool's deadline is the backstop)."""
        while True:
            time.sleep(WATCH_INTERVAL_S)
            try:
                self._expire(time.monotonic())
            except Exception:
                traceback.print_exc(file=sys.stderr)

    def _expire(self, now: float) -> None:
        with self._lock:
            overdue = [r for r in self._running.values() if not r.timed_out and now >= r.deadline]
            for rollout in overdue:
                rollout.timed_out = True
                self._channel.send(self._result(rollout, "timeout", "", 0.0))
        for rollout in overdue:
            stop_rollout(rollout)


def stop_rollout(rollout: Rollout) -> None:
    """Make mini end at its next step (its own wall-time limit) and kill the command it is running (in a
    container: remove the container, which ends the command with it)."""
    if rollout.agent is not None:
        rollout.agent.config.wall_time_limit_seconds = max(1, int(float(rollout.request["timeout_s"])))
        if rollout.request.get("diff_command"):
            with contextlib.suppress(Exception):
                rollout.agent.env.cleanup()
    kill_commands_under(rollout.request.get("workdir", ""))


def run_startup_command(env: Any, command: str, timeout_s: float | None = None) -> None:
    """The container's start-up command before the agent's first step, as mini's SWE-bench runner runs its
    ``run.env_startup_command`` (``get_sb_environment``): through the environment (bounded by ``timeout_s``, else
    by the environment's command timeout), a failure raises."""
    if not command:
        return
    output = env.execute({"command": command}, timeout=int(timeout_s) if timeout_s else None)
    if output.get("returncode") != 0:
        raise RuntimeError(f"Error executing startup command: {output}")


def take_diff_and_clean_up(rollout: Rollout) -> None:
    """Container rollouts: print the patch inside the container (the request's ``diff_command``, through mini's
    own ``execute``), then have mini remove its container. Nothing here may raise."""
    command = rollout.request.get("diff_command")
    env = getattr(rollout.agent, "env", None)
    if not command or env is None:
        return
    try:
        if not rollout.timed_out:
            output = env.execute({"command": command})
            if output.get("returncode") == 0:
                rollout.diff = output.get("output", "")
            else:
                rollout.diff_error = f"exit {output.get('returncode')}: {str(output.get('output', ''))[-500:]}"
    except BaseException as exc:  # Submitted would need a first line no diff has; anything else is reported
        rollout.diff_error = f"{type(exc).__name__}: {exc}"[-500:]
    finally:
        with contextlib.suppress(Exception):
            env.cleanup()


def kill_commands_under(workdir: str) -> None:
    """SIGKILL each command session of this process that has a process working under ``workdir``."""
    if not workdir:
        return
    root = os.path.realpath(workdir)
    sessions = _child_sessions()
    for session, members in sessions.items():
        if any(_works_under(pid, root) for pid in members):
            try:
                os.killpg(session, signal.SIGKILL)
            except OSError:
                continue


def _child_sessions() -> dict[int, list[int]]:
    """Session id -> member pids, for the sessions led by direct children of this process."""
    stats = {pid: stat for pid in _pids() if (stat := _stat(pid)) is not None}
    leaders = {pid for pid, (ppid, session) in stats.items() if ppid == os.getpid() and session == pid}
    members: dict[int, list[int]] = {leader: [] for leader in leaders}
    for pid, (_, session) in stats.items():
        if session in members:
            members[session].append(pid)
    return members


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, session) from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return int(fields[1]), int(fields[3])
    except (OSError, IndexError, ValueError):
        return None


def _works_under(pid: int, root: str) -> bool:
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return False
    return cwd == root or cwd.startswith(root.rstrip("/") + "/")


def _warm_imports() -> None:
    """Import what ``get_model`` / ``get_agent`` would import on first use (LiteLLM: seconds), once, up front."""
    import minisweagent.agents.interactive
    import minisweagent.environments.docker
    import minisweagent.environments.local
    import minisweagent.models.litellm_model
    import minisweagent.models.litellm_textbased_model  # noqa: F401


def register_jailed_environment() -> None:
    """Load ``jailed.py`` (beside this file) as ``repro_mswea_jailed``, so that mini's own
    ``get_environment`` finds the class a jailed rollout's ``environment_class`` names."""
    path = Path(__file__).with_name("jailed.py")
    spec = importlib.util.spec_from_file_location("repro_mswea_jailed", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["repro_mswea_jailed"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]


def main() -> None:
    """Take the standard streams, import mini once, announce readiness, serve until EOF."""
    requests, results, router = take_standard_streams()
    channel = Channel(results)
    started = time.monotonic()
    import minisweagent
    from minisweagent.run import mini as mini_cli

    _warm_imports()
    register_jailed_environment()
    mini_cli.configure_if_first_time()
    channel.send(
        {
            "event": "ready",
            "pid": os.getpid(),
            "mini_version": minisweagent.__version__,
            "import_s": round(time.monotonic() - started, 3),
        }
    )
    Worker(mini_cli, channel, router).serve(requests)
    sys.stderr.flush()
    os._exit(0)  # threads abandoned after a timeout must not keep the process alive


if __name__ == "__main__":
    main()
