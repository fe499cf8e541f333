"""A sandbox host's side of fanout=ray (repro.sandbox.fanout.execute_samples), with fakes: samples come back in job
order,
a workspace that cannot be made is an infrastructure outcome in its own slot, ungraded jobs are not graded."""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.sandbox.fanout import FanoutConfig, SampleJob, execute_samples
from repro.tasks.schema import Task
from repro.testing import FakeHarness, FakeSandbox


def job(instance_id: str, rollout_id: str, grade: bool = True) -> SampleJob:
    return SampleJob(Task(instance_id, "o/r", "0" * 40, "text"), 0, rollout_id, "http://proxy", "m", Path("/out"),
                     60.0, grade)


def test_outcomes_in_job_order_with_infrastructure_failures_in_place() -> None:
    box = FakeSandbox()
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
