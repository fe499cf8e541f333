"""Run samples of tasks in the real harness through the proxy, grade them, and write per-instance reports.

One runner serves every phase that needs rollouts: frozen evaluation (mode ``eval``), RL rollouts (mode
``train``, several samples per task = one GRPO group) and expert demonstrations (mode ``demo``, not graded).
Reports go to ``run_dir`` (the phase's folder); calls go to the proxy's store (``store_path``). Grading is
deterministic given (task, patch), so identical patches of one task are graded once (``GradeCache``).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from repro.common.lifecycle import Closing
from repro.common.progress import progress
from repro.evaluation import (
    InstanceReport,
    next_rollout_id,
    pending_samples,
    update_preds,
    usage_from_store,
    write_report,
)
from repro.evaluation.reports import NOT_GRADED_REASON
from repro.protocols import (
    GradeResult,
    Harness,
    HarnessResult,
    HarnessRollout,
    RemoteHarness,
    Sandbox,
    StreamingHarness,
    command_env,
    require_container_support,
)
from repro.sandbox.docker_engine import ImageMissing
from repro.sandbox.fanout import SampleJob, SampleOutcome, finish_sample
from repro.sandbox.repos import RepoError
from repro.serving.stack import Stack
from repro.store import open_store
from repro.tasks.schema import Task
from repro.train.reward import GradedRollout, RewardConfig, RewardFn, default_reward

NOT_GRADED = GradeResult("unresolved", NOT_GRADED_REASON)
# swebench's import (the sandbox's grading) turns on INFO logging for every logger; httpx would then log each
# registration and model call, drowning the progress lines
logging.getLogger("httpx").setLevel(logging.WARNING)


@dataclass
class RolloutOptions:
    """How one phase runs its samples."""

    mode: str = "eval"  # proxy rollout mode: eval | train | demo | probe
    k: int = 1  # samples per task
    sampling: dict[str, Any] = field(default_factory=dict)  # forced on every call of the rollout
    seed_of: Callable[[str, int], int | None] | None = None  # (instance id, sample) -> seed (None: unseeded)
    concurrency: int = 4
    grading_threads: int = 2
    retry_infra: bool = False
    grade: bool = True
    time_limit_s: float = 0.0
    harness_name: str = ""
    harness_version: str = ""
    fingerprint: str = ""
    write_preds: bool = True
    reward: RewardConfig | None = None  # RL's reward shaping (None: the verdict, 1.0 for resolved)
    reward_fn: RewardFn | None = None  # a reward hook (grade, rollout) -> reward; None: default_reward(reward)


class GradeCache:
    """Grades keyed by (instance id, sha256 of the patch): the tests of one task are deterministic."""

    def __init__(self) -> None:
        self._grades: dict[tuple[str, str], GradeResult] = {}
        self._lock = threading.Lock()
        self.hits = 0

    def get(self, instance_id: str, patch: str) -> GradeResult | None:
        with self._lock:
            grade = self._grades.get((instance_id, _sha(patch)))
            self.hits += grade is not None
            return grade

    def put(self, instance_id: str, patch: str, grade: GradeResult) -> None:
        if grade.outcome in ("resolved", "unresolved"):  # never cache an infrastructure error
            with self._lock:
                self._grades[(instance_id, _sha(patch))] = grade


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class _Raise:
    """What the prefetch thread hands on when it fails: the harness's thread raises ``exc``."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_END = object()  # the prefetch thread's last item


def _drain(ready: queue.Queue[Any]) -> Iterator[HarnessRollout]:
    """The prepared rollouts in order, until the prefetch thread's ``_END`` (its exception raised here)."""
    while True:
        item = ready.get()
        if item is _END:
            return
        if isinstance(item, _Raise):
            raise item.exc
        yield item


def _batches(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class RolloutRunner(Closing):
    """Runs the pending samples of one phase folder (resumable: finished reports are skipped)."""

    def __init__(self, run_dir: Path, store_path: Path, opts: RolloutOptions, tasks: list[Task], stack: Stack,
                 harness: Harness | RemoteHarness, sandbox: Sandbox, model_name: str,
                 grade_cache: GradeCache | None = None) -> None:
        self.run_dir, self.store_path, self.opts, self.stack = Path(run_dir), Path(store_path), opts, stack
        self.tasks = {t.instance_id: t for t in tasks}
        self.harness, self.sandbox, self.model_name = harness, sandbox, model_name
        require_container_support(harness, sandbox, opts.harness_name)
        self.grade_cache = grade_cache
        self.store = open_store(self.store_path)
        self.http = httpx.Client(timeout=30.0)  # one keep-alive connection to the proxy for every registration
        self._local = threading.local()  # one store connection per grading thread
        self._opened: list[Any] = []
        self.pool = ThreadPoolExecutor(max(1, opts.grading_threads), thread_name_prefix="grading")

    def run(self, label: str = "samples") -> list[InstanceReport]:
        """Run every pending sample; return the reports written now."""
        pending = pending_samples(self.run_dir, list(self.tasks), self.opts.k, self.opts.retry_infra)
        reports: list[InstanceReport] = []
        with progress(len(pending), label) as bar:
            if isinstance(self.harness, StreamingHarness):
                return self._run_stream(pending, bar)
            for batch in _batches(pending, max(1, self.opts.concurrency * 2)):
                batch_reports = self._run_batch(batch)
                reports += batch_reports
                bar.advance(len(batch_reports), note=self._tally(reports))
        return reports

    def _run_stream(self, pending: list[tuple[str, int]], bar: Any) -> list[InstanceReport]:
        """Every pending sample with ``concurrency`` rollouts in flight all the time (``StreamingHarness``): a
        prefetch thread registers each sample and makes its workspace ahead of need, the harness takes them as
        slots free up, and each finished rollout is graded and recorded on the grading pool at once. Reports come
        back in ``pending``'s order."""
        ready: queue.Queue[Any] = queue.Queue(maxsize=max(1, self.opts.concurrency))
        stop, prepared, failed = threading.Event(), {}, []
        feeder = threading.Thread(target=self._prefetch, args=(pending, ready, stop, prepared, failed),
                                  name="rollout-prefetch", daemon=True)
        futures: list[Future[InstanceReport]] = []
        done: list[InstanceReport] = []
        lock = threading.Lock()

        def advance(future: Future[InstanceReport]) -> None:
            if future.exception() is None:
                with lock:
                    done.append(future.result())
                    note = self._tally(done)
                bar.advance(1, note=note)

        def on_result(rollout: HarnessRollout, result: HarnessResult) -> None:
            task, sample, workspace, started = prepared.pop(rollout.rollout_id)
            future = self.pool.submit(self._finish, task, sample, workspace, rollout, result, started)
            future.add_done_callback(advance)
            futures.append(future)

        feeder.start()
        try:
            self.harness.run_each(_drain(ready), self.opts.concurrency, on_result)
        finally:
            stop.set()
            feeder.join()
        reports = [future.result() for future in futures]
        for failure in failed:
            reports.append(self._infra_failure(*failure))
            bar.advance(1, note=self._tally(reports))
        order = {key: i for i, key in enumerate(pending)}
        return sorted(reports, key=lambda r: order[(r.instance_id, r.sample)])

    def _prefetch(self, pending: list[tuple[str, int]], ready: queue.Queue[Any], stop: threading.Event,
                  prepared: dict[str, Any], failed: list[Any]) -> None:
        """Register each sample and make its workspace, in order, at most ``concurrency`` ahead of the harness;
        ends the stream with ``_END`` (or the exception that stopped it)."""
        try:
            for instance_id, sample in pending:
                item = self._prepare(instance_id, sample, prepared, failed)
                while item is not None and not stop.is_set():
                    with contextlib.suppress(queue.Full):
                        ready.put(item, timeout=0.2)
                        break
                if stop.is_set():
                    return
        except BaseException as exc:  # handed to the harness's thread, which raises it
            ready.put(_Raise(exc))
            return
        ready.put(_END)

    def _prepare(self, instance_id: str, sample: int, prepared: dict[str, Any], failed: list[Any],
                 started: float | None = None) -> HarnessRollout | None:
        """The sample registered and its workspace made: its rollout (kept in ``prepared`` by id with its task,
        sample, workspace and ``started``: now, unless given), or None (a workspace that could not be made is an
        infrastructure failure, kept in ``failed``)."""
        started = time.time() if started is None else started
        rollout_id = self._register(instance_id, sample)
        task = self.tasks[instance_id]
        try:
            workspace = self.sandbox.workspace(task, rollout_id)
        except (RepoError, ImageMissing) as exc:
            failed.append((task, sample, rollout_id, str(exc), started))
            return None
        rollout = self._rollout(task, rollout_id, workspace)
        prepared[rollout_id] = (task, sample, workspace, started)
        return rollout

    def _rollout(self, task: Task, rollout_id: str, workspace: Any) -> HarnessRollout:
        base_url = self.stack.client.base_url(rollout_id)
        return HarnessRollout(rollout_id, task, workspace.path, base_url, self.stack.served_model_name,
                              self.run_dir / "harness" / rollout_id, self._timeout_s(),
                              container=getattr(workspace, "container_spec", None), env=command_env(workspace))

    def _tally(self, reports: list[InstanceReport]) -> str:
        """``done, 11 resolved, 1 infra failure`` (ungraded phases: ``done``)."""
        parts = ["done"]
        if self.opts.grade:
            parts.append(f"{sum(r.outcome == 'resolved' for r in reports)} resolved")
        infra = sum(r.infra_failure for r in reports)
        if infra:
            parts.append(f"{infra} infra failure{'s' if infra > 1 else ''}")
        return ", ".join(parts)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.http.close()
        for store in self._opened:
            store.close()
        self.store.close()

    def _thread_store(self) -> Any:
        store = getattr(self._local, "store", None)
        if store is None:
            store = self._local.store = open_store(self.store_path)
            self._opened.append(store)
        return store

    def _sampling(self, instance_id: str, sample: int) -> dict[str, Any]:
        sampling = dict(self.opts.sampling)
        seed = self.opts.seed_of(instance_id, sample) if self.opts.seed_of is not None else None
        if seed is not None:
            sampling["seed"] = seed
        return sampling

    def _register(self, instance_id: str, sample: int) -> str:
        rollout_id = next_rollout_id(self.store, self.run_dir.name, instance_id, sample)
        self.stack.client.register(
            self.http, rollout_id=rollout_id, run_id=self.run_dir.name, task_id=instance_id, group_id=instance_id,
            loop_kind=self.harness.loop_kind, harness=self.opts.harness_name,
            harness_version=self.opts.harness_version, mode=self.opts.mode,
            metadata={"sample": sample, "sampling": self._sampling(instance_id, sample),
                      "fingerprint": self.opts.fingerprint})
        return rollout_id

    def _run_batch(self, batch: list[tuple[str, int]]) -> list[InstanceReport]:
        started = time.time()
        if isinstance(self.harness, RemoteHarness):  # fanout=ray: whole samples run on the sandbox hosts
            return self._run_remote(batch, started)
        prepared: dict[str, Any] = {}
        failed: list[Any] = []
        rollouts = [r for instance_id, sample in batch
                    if (r := self._prepare(instance_id, sample, prepared, failed, started)) is not None]
        results = self.harness.run(rollouts, self.opts.concurrency) if rollouts else []
        jobs = [(*prepared[r.rollout_id][:3], r, result) for r, result in zip(rollouts, results, strict=True)]
        reports = list(self.pool.map(lambda job: self._finish(*job, started), jobs))
        reports += [self._infra_failure(*f) for f in failed]
        return reports

    def _run_remote(self, batch: list[tuple[str, int]], started: float) -> list[InstanceReport]:
        """Register here, run workspace -> harness -> grade on the hosts, record here (store, reports, rewards)."""
        jobs = []
        for instance_id, sample in batch:
            rollout_id = self._register(instance_id, sample)
            jobs.append(SampleJob(self.tasks[instance_id], sample, rollout_id,
                                  self.harness.base_url(self.stack.client, rollout_id), self.stack.served_model_name,
                                  self.run_dir / "harness" / rollout_id, self._timeout_s(), self.opts.grade))
        outcomes = self.harness.run_samples(jobs, self.opts.concurrency)

        def record(item: tuple[SampleJob, SampleOutcome]) -> InstanceReport:
            job, outcome = item
            if outcome.result.rollout_id != job.rollout_id:  # the hosts' answers must come back in job order
                raise RuntimeError(f"fan-out returned rollout {outcome.result.rollout_id} for {job.rollout_id}")
            return self._record(job.task, job.sample, job.rollout_id, outcome.result, outcome.grade, outcome.patch,
                                started, host=outcome.host)

        return list(self.pool.map(record, zip(jobs, outcomes, strict=True)))

    def _timeout_s(self) -> float:
        limit = self.opts.time_limit_s
        return (limit if limit > 0 else 600.0) + 60.0

    def _grade(self, task: Task, workspace: Any, patch: str) -> GradeResult:
        if not self.opts.grade:
            return NOT_GRADED
        cached = self.grade_cache.get(task.instance_id, patch) if self.grade_cache else None
        if cached is not None:
            return cached
        grade = self.sandbox.grade(task, workspace)
        if self.grade_cache is not None:
            self.grade_cache.put(task.instance_id, patch, grade)
        return grade

    def _finish(self, task: Task, sample: int, workspace: Any, rollout: HarnessRollout, result: HarnessResult,
                started: float) -> InstanceReport:
        grade, patch = finish_sample(workspace, result, lambda p: self._grade(task, workspace, p))
        return self._record(task, sample, rollout.rollout_id, result, grade, patch, started)

    def _reward(self, grade: GradeResult, rollout: GradedRollout) -> float:
        """The hook's reward (``opts.reward_fn``), or the default: the verdict as 1.0 / 0.0, or the shaped reward of
        ``opts.reward`` (``repro.train.reward``)."""
        reward_fn = self.opts.reward_fn or default_reward(self.opts.reward)
        return float(reward_fn(grade, rollout))

    def _infra_failure(self, task: Task, sample: int, rollout_id: str, reason: str, started: float) -> InstanceReport:
        result = HarnessResult(rollout_id, "crashed", reason=f"workspace could not be made: {reason}")
        return self._record(task, sample, rollout_id, result, GradeResult("error", reason), "", started)

    def _record(self, task: Task, sample: int, rollout_id: str, result: HarnessResult, grade: GradeResult,
                patch: str, started: float, host: str = "") -> InstanceReport:
        store = self._thread_store()
        usage = usage_from_store(store, rollout_id)
        report = InstanceReport.build(task, sample, rollout_id, result, grade, patch, usage, started)
        report.host = host
        infra = report.infra_failure
        reward = None if infra or not self.opts.grade else self._reward(
            grade, GradedRollout(task, sample, rollout_id, patch, result, usage.n_calls, usage.longest_prompt))
        ended = {"context_exceeded_seq": usage.context_exceeded_seq} if usage.context_exceeded_seq is not None else None
        store.finish_rollout(rollout_id, "failed" if infra else "finished", reward=reward,
                             failure_reason=(grade.reason or result.reason) if infra else None, metadata=ended)
        write_report(self.run_dir, report, patch)
        if sample == 0 and self.opts.write_preds:
            update_preds(self.run_dir, task.instance_id, self.model_name, patch, sample)
        return report
