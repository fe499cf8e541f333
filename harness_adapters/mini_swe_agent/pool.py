"""The ``Harness`` contract for mini-SWE-agent: rollouts run concurrently in long-lived worker processes.

Each worker is ``<isolated env>/bin/python -I worker.py``, started with the same clean
environment as the ``mini`` subprocess (``build_process_env``) and fed one JSON line per rollout; it builds
each rollout from the same ``-c`` files and command-line options as ``mini`` would (see the worker's
docstring), so the harness behaves the same while LiteLLM is imported once per worker, not once per rollout.

Per rollout this side writes ``<output_dir>/config/repro-mswea-rollout.yaml`` (task, endpoint, workdir) and,
after the run, ``<output_dir>/harness_run.json``; the worker writes the trajectory and ``stdout.log``. The
patch is not the harness's business: the caller diffs the workspace afterwards.

Failure handling: the worker reports ``timeout`` itself (watchdog); if it stays silent ``grace_s`` past a
rollout's timeout it is killed (that rollout ``timeout``, its other rollouts ``crashed``). A worker that exits
turns its in-flight rollouts into ``crashed`` with the exit code and the last line of its log, and is
restarted on demand. A worker holding more than ``max_abandoned`` threads that outlived their timeout gets
no new rollouts and is restarted once idle. A worker that cannot start (no ``ready`` line within
``startup_timeout_s``) raises ``WorkerStartError`` with its log tail; rollouts of that run still in flight
elsewhere are abandoned with their workers, so a later run starts clean.
"""

from __future__ import annotations

import contextlib
import json
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness_adapters.isolation import commands_jail, resolve_isolation
from harness_adapters.mini_swe_agent.adapter import (
    NAME,
    RESULT_NAME,
    TRAJECTORY_NAME,
    MiniSweAgentConfig,
    build_process_env,
    ensure_mini_swe_agent_env,
    is_v1,
    write_harness_config,
)
from harness_adapters.mini_swe_agent.wire import result_from_worker, worker_request
from harness_adapters.processes import (
    check_batch,
    check_concurrency,
    kill_processes_under,
    last_line,
    tail,
    unique_rollouts,
)
from harness_adapters.worker_process import Event, WorkerProcess, WorkerStartError
from repro.common.venvs import HarnessEnv
from repro.execution.jail import INIT, Jail
from repro.protocols import HarnessLimits, HarnessResult, HarnessRollout

__all__ = ["WORKER_SCRIPT", "MiniSweAgentHarness", "WorkerStartError"]

WORKER_SCRIPT = Path(__file__).with_name("worker.py")
_POLL_S = 0.5
Verdict = tuple[str, str]  # (status, reason)


@dataclass
class _InFlight:
    index: int
    rollout: HarnessRollout
    sent: float
    deadline: float


@dataclass
class _Worker:
    """One worker process in a slot, its in-flight rollouts and its threads abandoned after a timeout."""

    slot: int
    process: WorkerProcess
    in_flight: dict[str, _InFlight] = field(default_factory=dict)
    abandoned: set[str] = field(default_factory=set)

    @property
    def pid(self) -> int:
        return self.process.pid


class _Source:
    """The rollouts of one streaming run, taken one at a time, numbered in order (ids checked unique); ``peek``
    pulls the next one from the iterator without taking it, so no worker is started for a stream that has ended."""

    def __init__(self, rollouts: Iterable[HarnessRollout]) -> None:
        self._rollouts = unique_rollouts(rollouts)
        self._next: tuple[int, HarnessRollout] | None = None
        self.by_index: dict[int, HarnessRollout] = {}
        self.count, self.exhausted = 0, False

    def peek(self) -> tuple[int, HarnessRollout] | None:
        """The next ``(index, rollout)`` (pulled from the iterator once), or None (and ``exhausted``) at the end."""
        if self._next is None and not self.exhausted:
            rollout = next(self._rollouts, None)
            if rollout is None:
                self.exhausted = True
                return None
            self._next, self.count = (self.count, rollout), self.count + 1
        return self._next

    def take(self) -> tuple[int, HarnessRollout]:
        """The item :meth:`peek` returned, now in flight."""
        item, self._next = self._next, None
        if item is None:
            raise RuntimeError("take() without a peeked rollout")
        self.by_index[item[0]] = item[1]
        return item


class _ResultSink(dict[int, HarnessResult]):
    """Where the scheduler records a result (``sink[index] = result``): handed on at once to ``on_result``."""

    def __init__(self, source: _Source, on_result: Callable[[HarnessRollout, HarnessResult], None]) -> None:
        super().__init__()
        self._source, self._on_result = source, on_result

    def __setitem__(self, index: int, result: HarnessResult) -> None:
        self._on_result(self._source.by_index.pop(index), result)


class MiniSweAgentHarness:
    """mini-SWE-agent ``cfg.version`` driven headless through ``workers`` long-lived worker processes."""

    name = NAME
    loop_kind = "proxy"
    acts_in_containers = True  # a rollout with a ContainerSpec runs in mini's own DockerEnvironment
    cfg: MiniSweAgentConfig
    version: str

    @property
    def limits(self) -> HarnessLimits:
        """Its config's step and wall-time limits."""
        return HarnessLimits.of(self.cfg)

    def __init__(
        self,
        cfg: MiniSweAgentConfig | None = None,
        workers: int = 1,
        *,
        env: HarnessEnv | None = None,
        state_dir: Path | None = None,
        grace_s: float = 30.0,
        startup_timeout_s: float = 180.0,
        max_abandoned: int = 8,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.cfg = cfg or MiniSweAgentConfig()
        if is_v1(self.cfg.version):
            raise ValueError(f"mini-SWE-agent {self.cfg.version} has the 1.x CLI: use MiniSweAgentV1Harness")
        self._env = env or ensure_mini_swe_agent_env(self.cfg.version)
        self._own_state = state_dir is None
        self._state = Path(state_dir or tempfile.mkdtemp(prefix="repro-mswea-")).resolve()
        self._config_dir = self._state / "config"
        self._identity = write_harness_config(self._env, self.cfg, self._config_dir)
        self.version = self._identity.version
        self._proc_env = build_process_env(self.cfg, home=self._state / "home", config_dir=self._config_dir)
        self._isolation = resolve_isolation(self.cfg.isolation)  # sandbox=local rollouts; containers are their own
        self._jails: dict[str, Jail] = {}
        self._grace_s, self._startup_timeout_s, self._max_abandoned = grace_s, startup_timeout_s, max_abandoned
        self._slots: list[_Worker | None] = [None] * workers
        self._events: queue.Queue[Event] = queue.Queue()
        self._lock = threading.Lock()
        self.n_worker_starts = 0

    def identity(self) -> dict[str, Any]:
        """Same identity as the subprocess adapter: name, version, config hashes, litellm/openai versions, and
        whether its local commands run jailed."""
        return asdict(self._identity) | {"isolation": self._isolation}

    def worker_pids(self) -> list[int]:
        """Pids of the worker processes now running."""
        return [w.pid for w in self._slots if w is not None and w.process.alive()]

    def start(self) -> None:
        """Start every worker that is not running (run() does this on demand)."""
        for slot, worker in enumerate(self._slots):
            if worker is None:
                self._slots[slot] = self._spawn(slot)

    def run(self, rollouts: list[HarnessRollout], concurrency: int) -> list[HarnessResult]:
        """Run ``rollouts`` with at most ``concurrency`` in flight; one result per rollout, in order."""
        check_batch(rollouts, concurrency)
        results: dict[str, HarnessResult] = {}
        self.run_each(rollouts, concurrency, lambda r, result: results.__setitem__(r.rollout_id, result))
        return [results[r.rollout_id] for r in rollouts]

    def run_each(self, rollouts: Iterable[HarnessRollout], concurrency: int,
                 on_result: Callable[[HarnessRollout, HarnessResult], None]) -> int:
        """Streaming :meth:`run` (``repro.protocols.StreamingHarness``): the next rollout is taken from
        ``rollouts`` (lazily) whenever fewer than ``concurrency`` are in flight, and ``on_result`` gets each result
        on this thread as soon as it ends. Returns how many ran."""
        check_concurrency(concurrency)
        with self._lock:
            source = _Source(rollouts)
            sink = _ResultSink(source, on_result)
            self._drain_events()
            try:
                while True:
                    self._fill(source, concurrency)
                    if source.exhausted and not self._n_in_flight():
                        return source.count
                    self._pump(sink)
            except BaseException:
                self._abort()
                raise

    def close(self) -> None:
        """Stop the workers (EOF, then SIGKILL for stragglers) and drop the state dir if it was temporary."""
        with self._lock:
            for slot, worker in enumerate(self._slots):
                if worker is not None:
                    worker.process.stop(polite=True)
                    self._slots[slot] = None
        if self._own_state:
            shutil.rmtree(self._state, ignore_errors=True)

    def __enter__(self) -> MiniSweAgentHarness:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- scheduling -------------------------------------------------------------------------------------

    def _n_in_flight(self) -> int:
        return sum(len(w.in_flight) for w in self._slots if w is not None)

    def _fill(self, source: _Source, concurrency: int) -> None:
        while self._n_in_flight() < concurrency and source.peek() is not None:
            worker = self._pick_worker()
            if worker is None:
                return
            self._send(worker, *source.take())

    def _pick_worker(self) -> _Worker | None:
        """The usable worker with the fewest rollouts in flight, (re)starting idle dead or draining ones."""
        for slot, worker in enumerate(self._slots):
            if worker is not None and not worker.in_flight and (self._draining(worker) or not worker.process.alive()):
                worker.process.stop(polite=False)
                worker = self._slots[slot] = None
            if worker is None:
                self._slots[slot] = self._spawn(slot)
        usable = [w for w in self._slots if w is not None and not self._draining(w) and w.process.alive()]
        return min(usable, key=lambda w: len(w.in_flight)) if usable else None

    def _draining(self, worker: _Worker) -> bool:
        return len(worker.abandoned) > self._max_abandoned

    def _send(self, worker: _Worker, index: int, rollout: HarnessRollout) -> None:
        request = worker_request(rollout, self._env, self._config_dir, self._jail(rollout))
        now = time.monotonic()
        worker.in_flight[rollout.rollout_id] = _InFlight(index, rollout, now, now + rollout.timeout_s + self._grace_s)
        worker.process.send(request)  # if the worker is gone, its EOF event marks this rollout crashed

    def _jail(self, rollout: HarnessRollout) -> dict[str, Any] | None:
        """How ``rollout``'s commands reach their jail (``jailed``: jail_init's path and the jail's
        command line, started at the first command), None unjailed or in a container."""
        if self._isolation != "jail" or rollout.container is not None:
            return None
        jail = commands_jail(rollout, self._proc_env | dict(rollout.env or {})).__enter__()
        self._jails[rollout.rollout_id] = jail
        return {"init": str(INIT), "launch": jail.launch(Path(rollout.workdir))}

    def _release_jail(self, rollout_id: str) -> None:
        jail = self._jails.pop(rollout_id, None)
        if jail is not None:
            jail.__exit__(None, None, None)

    def _abort(self) -> None:
        """A run failed midway: stop the workers that still hold its rollouts, so no later run inherits them."""
        for slot, worker in enumerate(self._slots):
            if worker is not None and worker.in_flight:
                worker.process.stop(polite=False)
                for rollout_id in worker.in_flight:
                    self._release_jail(rollout_id)
                worker.in_flight.clear()
                self._slots[slot] = None

    # -- events ---------------------------------------------------------------------------------------------

    def _pump(self, results: dict[int, HarnessResult]) -> None:
        """Handle the next worker event (or none within a poll interval), then enforce the backstop deadlines."""
        with contextlib.suppress(queue.Empty):
            self._handle(self._events.get(timeout=_POLL_S), results)
        self._expire(results)

    def _drain_events(self) -> None:
        """Handle what arrived between runs (threads released after a timeout, workers that died idle)."""
        with contextlib.suppress(queue.Empty):
            while True:
                self._handle(self._events.get_nowait(), {})

    def _handle(self, event: Event, results: dict[int, HarnessResult]) -> None:
        process, message = event
        worker = next((w for w in self._slots if w is not None and w.process is process), None)
        if worker is None:
            return  # from a worker already replaced
        if message is None:
            self._on_exit(worker, results)
        else:
            self._on_message(worker, message, results)

    def _on_message(self, worker: _Worker, message: dict[str, Any], results: dict[int, HarnessResult]) -> None:
        event, rollout_id = message.get("event"), str(message.get("rollout_id", ""))
        if event == "released":
            worker.abandoned.discard(rollout_id)
        elif event == "result" and rollout_id in worker.in_flight:
            flight = worker.in_flight.pop(rollout_id)
            if message.get("outcome") == "timeout":
                worker.abandoned.add(rollout_id)
            self._record(results, flight, result_from_worker(flight.rollout, message, worker.pid))

    def _on_exit(self, worker: _Worker, results: dict[int, HarnessResult]) -> None:
        """The worker's output ended: it died. Its rollouts crash with the reason; the slot restarts on demand."""
        worker.process.stop(polite=False)
        reason = f"harness worker pid {worker.pid} exited with code {worker.process.proc.returncode}"
        if line := last_line(tail(worker.process.log_path)):
            reason = f"{reason}: {line}"
        self._fail_all(worker, results, {rollout_id: ("crashed", reason) for rollout_id in worker.in_flight})

    def _expire(self, results: dict[int, HarnessResult]) -> None:
        """Kill a worker that stayed silent ``grace_s`` past a rollout's timeout."""
        now = time.monotonic()
        for worker in list(self._slots):
            if worker is None:
                continue
            late = {rid for rid, flight in worker.in_flight.items() if now >= flight.deadline}
            if not late:
                continue
            worker.process.stop(polite=False)
            killed = ("crashed", f"harness worker pid {worker.pid} killed: it stopped reporting on {sorted(late)}")
            verdicts = {
                rollout_id: (
                    ("timeout", f"no report {self._grace_s:g} s after the {f.rollout.timeout_s:g} s timeout")
                    if rollout_id in late
                    else killed
                )
                for rollout_id, f in worker.in_flight.items()
            }
            self._fail_all(worker, results, verdicts)

    def _fail_all(self, worker: _Worker, results: dict[int, HarnessResult], verdicts: dict[str, Verdict]) -> None:
        """Give every rollout in flight on a dead worker its (status, reason); kill the commands it orphaned."""
        kill_processes_under([Path(flight.rollout.workdir) for flight in worker.in_flight.values()
                              if flight.rollout.container is None])  # containers: removed by the sandbox
        for rollout_id, flight in worker.in_flight.items():
            status, reason = verdicts[rollout_id]
            result = HarnessResult(
                rollout_id=flight.rollout.rollout_id,
                status=status,
                reason=reason,
                duration_s=round(time.monotonic() - flight.sent, 3),
                trajectory_path=_existing(Path(flight.rollout.output_dir) / TRAJECTORY_NAME),
                info={"worker_pid": worker.pid, "worker_log": str(worker.process.log_path)},
            )
            self._record(results, flight, result)
        worker.in_flight.clear()
        if self._slots[worker.slot] is worker:
            self._slots[worker.slot] = None

    def _record(self, results: dict[int, HarnessResult], flight: _InFlight, result: HarnessResult) -> None:
        self._release_jail(flight.rollout.rollout_id)
        results[flight.index] = result
        record = asdict(result) | {"identity": self.identity()}
        (Path(flight.rollout.output_dir) / RESULT_NAME).write_text(json.dumps(record, indent=2, default=str) + "\n")

    # -- processes ------------------------------------------------------------------------------------------

    def _spawn(self, slot: int) -> _Worker:
        """Start a worker process in ``slot`` and wait for its ``ready`` line."""
        self.n_worker_starts += 1
        process = WorkerProcess(
            [str(self._env.python), "-I", str(WORKER_SCRIPT)],
            cwd=self._state,
            env=self._proc_env,
            log_path=self._state / "workers" / f"worker-{slot}-{self.n_worker_starts}.log",
            events=self._events,
            startup_timeout_s=self._startup_timeout_s,
        )
        return _Worker(slot, process)


def _existing(path: Path) -> str | None:
    return str(path) if path.exists() else None
