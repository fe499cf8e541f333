"""The few contracts between the parts of repro. Implementations are chosen by name (see ``registry``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, Self, runtime_checkable

from repro.tasks.schema import Task

Outcome = Literal["resolved", "unresolved", "error", "timeout"]


@dataclass
class GradeResult:
    """What the grader found: ``resolved`` iff every FAIL_TO_PASS passes and every PASS_TO_PASS still passes.

    ``error`` / ``timeout`` are infrastructure outcomes (the grader could not build a trustworthy test run: a
    repository, base commit or interpreter missing, ``test_patch`` not applying; or the tests ran out of time) and
    are counted apart from ``unresolved``. A patch that does not apply is ``unresolved``: the agent produced it.
    """

    outcome: Outcome
    reason: str = ""
    tests: dict[str, str] = field(default_factory=dict)  # test id -> PASSED / FAILED / ERROR / SKIPPED / MISSING
    duration_s: float = 0.0
    log_tail: str = ""


class Workspace(Protocol):
    """A fresh working copy of a task's repository at ``base_commit``, for one rollout."""

    path: Path

    def diff(self) -> str:
        """The patch the agent produced: the working copy against ``base_commit`` (new files included)."""

    def cleanup(self) -> None: ...


class Sandbox(Protocol):
    """Makes workspaces and grades patches in them."""

    def workspace(self, task: Task, rollout_id: str) -> Workspace: ...

    def grade(self, task: Task, workspace: Workspace) -> GradeResult: ...


@dataclass
class ContainerSpec:
    """Where a harness acts when the sandbox is a container engine: the harness starts one container from
    ``image`` with ``run_args`` (limits, network off, the run's labels) through its own environment class, works in
    ``cwd``, runs ``startup_command`` (if any; bounded by ``startup_timeout_s``, else by the command timeout) before
    the agent starts, as its SWE-bench runner does, and before removing it prints the rollout's patch with
    ``diff_command``."""

    image: str
    cwd: str
    run_args: list[str]
    diff_command: str
    command_timeout_s: float = 60.0
    startup_command: str = ""
    startup_timeout_s: float | None = None


@dataclass
class HarnessRollout:
    """One rollout for a harness to run: the task text, where to work, where the model is."""

    rollout_id: str
    task: Task
    workdir: Path
    base_url: str  # the proxy's /rollouts/{rollout_id}/v1
    model_name: str
    output_dir: Path
    timeout_s: float
    container: ContainerSpec | None = None  # set: act inside this container (workdir is then a path in it)
    env: dict[str, str] = field(default_factory=dict)  # for the agent's commands, from the sandbox (see command_env)


def require_container_support(harness: Any, sandbox: Any, harness_name: str) -> None:
    """A container sandbox needs a harness that acts inside containers; others would run on the host."""
    if getattr(sandbox, "gives_containers", False) and not getattr(harness, "acts_in_containers", False):
        raise ValueError(f"sandbox=docker needs a harness that acts inside the task's container, and "
                         f"{harness_name or type(harness).__name__} does not at its pinned version (README, harness "
                         f"table); use harness=mini_swe_agent (2.4.6) or harness=mini_swe_agent_v1 (1.17.5), or "
                         f"sandbox=local")


def command_env(workspace: Any) -> dict[str, str]:
    """What a workspace asks of the agent's command environment (a local one: ``PATH`` led by the task's
    interpreter, so ``python`` is the one its tests are graded with, not whatever the host has first on its PATH;
    a container brings its own)."""
    return dict(getattr(workspace, "command_env", None) or {})


@dataclass
class HarnessResult:
    """How a harness run ended (not whether the task was solved: that is the grader's job)."""

    rollout_id: str
    status: Literal["finished", "crashed", "timeout"]
    reason: str = ""
    exit_status: str = ""  # the harness's own word (e.g. mini-SWE-agent's Submitted / LimitsExceeded)
    n_model_calls: int = 0
    duration_s: float = 0.0
    trajectory_path: str | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HarnessLimits:
    """A harness's own limits, recorded in the frozen spec: model calls per rollout and wall time (0: none)."""

    step_limit: int = 0
    wall_time_limit_s: float = 0.0

    @classmethod
    def of(cls, cfg: Any) -> HarnessLimits:
        """The limits a harness config carries (``step_limit``, ``wall_time_limit_s``; absent or None: 0)."""
        return cls(int(getattr(cfg, "step_limit", 0) or 0), float(getattr(cfg, "wall_time_limit_s", 0) or 0))


@runtime_checkable
class Harness(Protocol):
    """An unchanged agent harness, installed at a pinned version, driven headless; used as a context manager
    (``with get_harness(...) as harness``), which closes it on exit. :class:`HarnessBase` gives the defaults of
    everything but :meth:`run`."""

    name: str
    version: str
    loop_kind: str  # "proxy": the real harness through the proxy; "rebuilt": a loop rebuilt inside the trainer

    @property
    def limits(self) -> HarnessLimits:
        """Its step and wall-time limits (recorded in the frozen spec)."""

    def identity(self) -> dict[str, Any]:
        """Name, version, hashes of its config/prompt files and wire-relevant package versions."""

    def run(self, rollouts: list[HarnessRollout], concurrency: int) -> list[HarnessResult]:
        """Run rollouts (concurrently, in long-lived workers); one result per rollout, in order."""

    def close(self) -> None:
        """Stop its workers and processes and drop its temporary state; it is not used afterwards."""

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc: object) -> None: ...


@runtime_checkable
class StreamingHarness(Harness, Protocol):
    """A harness that also runs a stream (every adapter here): ``run_each`` takes the next rollout from
    ``rollouts`` only when fewer than ``concurrency`` are in flight (so an iterator may prepare each rollout's
    workspace just in time) and hands each result to ``on_result`` as soon as it ends, on the calling thread.
    :class:`repro.rl.rollouts.RolloutRunner` uses it to keep ``concurrency`` rollouts running all the time,
    instead of batches that wait for their slowest rollout and leave the model server idle while the next batch's
    workspaces are made and the last one's graded."""

    def run_each(self, rollouts: Iterable[HarnessRollout], concurrency: int,
                 on_result: Callable[[HarnessRollout, HarnessResult], None]) -> int:
        """Run the stream; returns how many rollouts ran."""


@runtime_checkable
class RemoteHarness(Protocol):
    """A harness whose whole samples (workspace -> harness -> patch -> grade) run on other hosts
    (``fanout=ray``: :class:`repro.sandbox.fanout.RayFanout`); the driver registers, records and rewards them."""

    name: str
    version: str
    loop_kind: str

    @property
    def limits(self) -> HarnessLimits: ...

    def identity(self) -> dict[str, Any]: ...

    def base_url(self, client: Any, rollout_id: str) -> str:
        """The rollout's base URL as the hosts reach the proxy."""

    def run_samples(self, jobs: list[Any], concurrency: int) -> list[Any]:
        """Run ``jobs`` (``SampleJob``) on the hosts; one ``SampleOutcome`` per job, in order."""

    def close(self) -> None: ...


class HarnessBase:
    """The defaults of a harness of your own: subclass it, set ``name`` and ``version``, implement :meth:`run`
    (and, for limits in the frozen spec, set ``limits``)."""

    name: ClassVar[str] = "my-harness"
    version: ClassVar[str] = "0"
    loop_kind: ClassVar[str] = "proxy"
    limits: HarnessLimits = HarnessLimits()

    def identity(self) -> dict[str, Any]:
        """Name and version (add what the model sees: prompt hashes, settings)."""
        return {"name": self.name, "version": self.version}

    def run(self, rollouts: list[HarnessRollout], concurrency: int) -> list[HarnessResult]:
        raise NotImplementedError(f"{type(self).__name__}.run: run each rollout against its base_url")

    def close(self) -> None:
        """Nothing to stop by default."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
