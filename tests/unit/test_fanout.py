"""A sandbox host's side of fanout=ray (repro.fanout.execute_samples), with fakes: samples come back in job order,
a workspace that cannot be made is an infrastructure outcome in its own slot, ungraded jobs are not graded."""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.fanout import FanoutConfig, SampleJob, execute_samples
from repro.protocols import GradeResult
from repro.sandbox.repos import RepoError
from repro.tasks.schema import Task
from repro.testing import FakeHarness


class FakeWorkspace:
    def __init__(self, name: str) -> None:
        self.path, self.name, self.cleaned = Path("/nowhere") / name, name, False

    def diff(self) -> str:
        return f"patch of {self.name}"

    def cleanup(self) -> None:
        self.cleaned = True


class FakeBox:
    def __init__(self) -> None:
        self.made: list[FakeWorkspace] = []

    def workspace(self, task: Task, rollout_id: str) -> FakeWorkspace:
        if task.instance_id == "broken":
            raise RepoError("no repository for broken")
        self.made.append(FakeWorkspace(rollout_id))
        return self.made[-1]

    def grade(self, task: Task, workspace: FakeWorkspace) -> GradeResult:
        return GradeResult("resolved" if task.instance_id.startswith("good") else "unresolved", workspace.name)


def job(instance_id: str, rollout_id: str, grade: bool = True) -> SampleJob:
    return SampleJob(Task(instance_id, "o/r", "0" * 40, "text"), 0, rollout_id, "http://proxy", "m", Path("/out"),
                     60.0, grade)


def test_outcomes_in_job_order_with_infrastructure_failures_in_place() -> None:
    box = FakeBox()
    jobs = [job("good-1", "r1"), job("broken", "r2"), job("bad-3", "r3"), job("good-4", "r4", grade=False)]
    outcomes = execute_samples(FakeHarness(), box, jobs, concurrency=2)
    assert [o.result.rollout_id for o in outcomes] == ["r1", "r2", "r3", "r4"]
    assert [o.grade.outcome for o in outcomes] == ["resolved", "error", "unresolved", "unresolved"]
    assert outcomes[1].result.status == "crashed" and "no repository" in outcomes[1].grade.reason
    assert outcomes[3].grade.reason.startswith("not graded")
    assert [o.patch for o in outcomes] == ["patch of r1", "", "patch of r3", "patch of r4"]
    assert all(w.cleaned for w in box.made) and all(o.host for o in outcomes)


def test_fanout_settings_are_checked() -> None:
    with pytest.raises(ValueError, match=r"fanout\.kind"):
        FanoutConfig(kind="dask")
    with pytest.raises(ValueError, match=r"fanout\.hosts"):
        FanoutConfig(kind="ray", hosts=0)
