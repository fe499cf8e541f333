"""Streaming rollouts (``StreamingHarness.run_each``, ``RolloutRunner._run_stream``): the harness takes the next
rollout only when a slot frees up, every sample is reported once, in the pending order, whatever order they end
in; a workspace that cannot be made is an infrastructure failure of that sample alone; an error stops the stream."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness_adapters.processes import run_in_threads, stream_in_threads
from repro.common.progress import ProgressHandle
from repro.protocols import HarnessResult, HarnessRollout
from repro.proxy.client import ProxyClient
from repro.rl.rollouts import RolloutOptions, RolloutRunner
from repro.testing import FakeSandbox, FakeStreamingHarness


def rollout(rollout_id: str) -> HarnessRollout:
    return HarnessRollout(rollout_id, None, Path("/nonexistent") / rollout_id, "http://x", "m",  # type: ignore[arg-type]
                          Path("/nonexistent"), 1.0)


def test_the_stream_takes_a_rollout_only_when_a_slot_is_free() -> None:
    ended: list[str] = []
    in_flight_at_take: list[int] = []

    def source() -> Iterator[HarnessRollout]:
        for i in range(12):
            in_flight_at_take.append(i - len(ended))  # taken before this one and not yet handed back
            yield rollout(f"r{i}")

    def run_one(r: HarnessRollout) -> HarnessResult:
        threading.Event().wait(0.005 * (int(r.rollout_id[1:]) % 3))
        return HarnessResult(r.rollout_id, "finished")

    count = stream_in_threads(source(), 3, run_one, lambda r, res: ended.append(res.rollout_id), "t")
    assert count == 12 and sorted(ended) == sorted(f"r{i}" for i in range(12))
    assert max(in_flight_at_take) == 2  # the next one is taken only while fewer than 3 run


def test_run_in_threads_keeps_the_order_and_refuses_duplicate_ids() -> None:
    ids = [f"r{i}" for i in (5, 1, 4, 2)]
    results = run_in_threads([rollout(i) for i in ids], 2, lambda r: HarnessResult(r.rollout_id, "finished"), "t")
    assert [r.rollout_id for r in results] == ids
    with pytest.raises(ValueError, match="unique"):
        stream_in_threads(iter([rollout("a"), rollout("a")]), 2, lambda r: HarnessResult(r.rollout_id, "finished"),
                          lambda r, res: None, "t")


def test_an_error_in_a_rollout_stops_the_stream() -> None:
    def run_one(r: HarnessRollout) -> HarnessResult:
        if r.rollout_id == "r2":
            raise RuntimeError("harness broke")
        return HarnessResult(r.rollout_id, "finished")

    with pytest.raises(RuntimeError, match="harness broke"):
        stream_in_threads((rollout(f"r{i}") for i in range(6)), 2, run_one, lambda r, res: None, "t")


def streaming_runner(tmp_path: Path, ids: list[str], k: int, concurrency: int,
                     harness: Any) -> tuple[RolloutRunner, FakeSandbox]:
    """A runner whose registration, finishing and records are stubbed: what is left is the scheduling."""
    runner = RolloutRunner.__new__(RolloutRunner)
    runner.run_dir, runner.opts = tmp_path, RolloutOptions(k=k, concurrency=concurrency, grading_threads=2)
    runner.tasks = {i: SimpleNamespace(instance_id=i) for i in ids}
    runner.stack = SimpleNamespace(proxy_url="http://proxy", served_model_name="tiny",
                                   client=ProxyClient("http://proxy", "token"))
    runner.harness, runner.sandbox = harness, FakeSandbox()
    runner.pool = ThreadPoolExecutor(2)
    runner._register = lambda instance_id, sample: f"{instance_id}-{sample}"  # type: ignore[method-assign]

    def finish(task: Any, sample: int, workspace: Any, r: HarnessRollout, result: HarnessResult,
               started: float) -> Any:
        return SimpleNamespace(instance_id=task.instance_id, sample=sample, outcome="resolved", infra_failure=False)

    def infra(task: Any, sample: int, rollout_id: str, reason: str, started: float) -> Any:
        return SimpleNamespace(instance_id=task.instance_id, sample=sample, outcome="error", infra_failure=True,
                               reason=reason)

    runner._finish, runner._infra_failure = finish, infra  # type: ignore[method-assign]
    return runner, runner.sandbox


def test_the_runner_streams_every_sample_once_in_the_pending_order(tmp_path: Path) -> None:
    ids = ["b", "broken", "a", "c", "d"]
    harness = FakeStreamingHarness(delay_s=0.01)
    runner, box = streaming_runner(tmp_path, ids, k=3, concurrency=4, harness=harness)
    pending = [(i, s) for i in ids for s in range(3)]
    bar = ProgressHandle(len(pending), "t", console=SimpleNamespace(print=lambda *a: None), bar=None)  # type: ignore[arg-type]
    reports = runner._run_stream(pending, bar)
    runner.pool.shutdown()
    assert [(r.instance_id, r.sample) for r in reports] == pending
    assert [r.infra_failure for r in reports] == [i == "broken" for i, _ in pending]
    assert "repro tasks fetch" in reports[3].reason
    assert len(harness.seen) == 12 and len(box.made) == 12 and bar.done == 15
    assert 1 < harness.max_in_flight <= 4


def test_a_failing_workspace_step_stops_the_stream_with_its_error(tmp_path: Path) -> None:
    harness = FakeStreamingHarness(delay_s=0.0)
    runner, box = streaming_runner(tmp_path, ["a", "b", "c"], k=2, concurrency=2, harness=harness)

    def workspace(task: Any, rollout_id: str) -> Any:
        if task.instance_id == "b":
            raise OSError("disk full")
        return SimpleNamespace(path=Path("/nonexistent") / rollout_id, command_env={})

    box.workspace = workspace  # type: ignore[method-assign]
    bar = ProgressHandle(6, "t", console=SimpleNamespace(print=lambda *a: None), bar=None)  # type: ignore[arg-type]
    with pytest.raises(OSError, match="disk full"):
        runner._run_stream([(i, s) for i in "abc" for s in range(2)], bar)
    runner.pool.shutdown()
    assert {r.rollout_id for r in harness.seen} <= {"a-0", "a-1"}
