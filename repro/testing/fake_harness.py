"""Fakes of the harness and sandbox contracts (:mod:`repro.protocols`) for unit tests of what drives them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from harness_adapters.processes import stream_in_threads
from repro.protocols import GradeResult, HarnessBase, HarnessLimits, HarnessResult, HarnessRollout
from repro.sandbox.repos import RepoError


class FakeHarness(HarnessBase):
    """A ``Harness`` for unit tests of what drives one (no process, no model call): each rollout finishes at once;
    the rollouts it ran are kept in ``seen``."""

    name = "fake"
    version = "0"
    cfg: Any

    def __init__(self, cfg: Any = None) -> None:
        self.cfg = cfg
        self.limits = HarnessLimits.of(cfg)
        self.seen: list[HarnessRollout] = []
        self.closed = False

    def run(self, rollouts: list[HarnessRollout], concurrency: int) -> list[HarnessResult]:
        self.seen += rollouts
        return [HarnessResult(r.rollout_id, "finished") for r in rollouts]

    def close(self) -> None:
        self.closed = True


class FakeWorkspace:
    """A :class:`FakeSandbox` workspace: no files; its diff names it; ``cleaned`` once cleaned up."""

    def __init__(self, name: str) -> None:
        self.path, self.name, self.cleaned = Path("/nowhere") / name, name, False

    def diff(self) -> str:
        return f"patch of {self.name}"

    def cleanup(self) -> None:
        self.cleaned = True


class FakeSandbox:
    """A sandbox for unit tests of what drives one: a workspace per rollout (kept in ``made``), except for the task
    ``broken``, whose repository is missing; tasks named ``good...`` grade resolved, others unresolved."""

    def __init__(self) -> None:
        self.made: list[FakeWorkspace] = []

    def workspace(self, task: Any, rollout_id: str) -> FakeWorkspace:
        if task.instance_id == "broken":
            raise RepoError("no repository for broken: run `repro tasks fetch`")
        self.made.append(FakeWorkspace(rollout_id))
        return self.made[-1]

    def grade(self, task: Any, workspace: FakeWorkspace) -> GradeResult:
        return GradeResult("resolved" if task.instance_id.startswith("good") else "unresolved", workspace.name)


class FakeStreamingHarness(FakeHarness):
    """:class:`FakeHarness` with ``run_each`` (``repro.protocols.StreamingHarness``): each rollout takes
    ``delay_s`` on a thread; ``max_in_flight`` is the most that ran at once."""

    def __init__(self, cfg: Any = None, delay_s: float = 0.01) -> None:
        super().__init__(cfg)
        self.delay_s, self.in_flight, self.max_in_flight = delay_s, 0, 0
        self._lock = threading.Lock()

    def _run_one(self, rollout: HarnessRollout) -> HarnessResult:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.seen.append(rollout)
        time.sleep(self.delay_s)
        with self._lock:
            self.in_flight -= 1
        return HarnessResult(rollout.rollout_id, "finished")

    def run_each(self, rollouts: Iterable[HarnessRollout], concurrency: int,
                 on_result: Callable[[HarnessRollout, HarnessResult], None]) -> int:
        return stream_in_threads(rollouts, concurrency, self._run_one, on_result, "fake")
