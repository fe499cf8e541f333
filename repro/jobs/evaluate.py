"""Frozen evaluation in the real harness: tasks -> workspaces -> harness rollouts through the proxy -> grading
-> per-instance reports, preds.json, metrics.json and the printed table. Resumable: finished samples of the
run directory are skipped (``run.dir=<existing run>``)."""

from __future__ import annotations

import logging
import resource
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from harness_adapters.registry import get_harness
from repro.evaluation import (
    Cost,
    EvalSpec,
    HarnessSpec,
    InstanceReport,
    LimitsSpec,
    SamplingSpec,
    SandboxSpec,
    TaskSetSpec,
    eval_metrics,
    next_rollout_id,
    pending_samples,
    read_reports,
    update_preds,
    usage_from_store,
    write_metrics,
    write_preds,
    write_report,
)
from repro.jobs.stack import CpuServingConfig, Stack, running_stack, tiny_model
from repro.protocols import GradeResult, HarnessResult, HarnessRollout
from repro.proxy import ProxyConfig
from repro.report.eval_table import run_markdown
from repro.report.progress import progress
from repro.sandbox.local import LocalSandbox, LocalSandboxConfig
from repro.sandbox.repos import RepoError
from repro.serving.tiny_model import TinyModelConfig
from repro.store import open_store
from repro.tasks.distributions import TaskDistributionConfig, build_distribution
from repro.tasks.loaders import load_tasks
from repro.tasks.schema import Task


@dataclass
class TaskFileConfig:
    """Tasks from a file or dataset (JSON / JSONL / HF datasets on disk) instead of a bundled distribution."""

    source: str
    split: str | None = None
    instance_ids: list[str] | None = None
    name: str = ""


@dataclass
class EvalConfig:
    """The frozen part of an evaluation: decoding, samples per task, limits; the model is chosen separately."""

    experiment: str = "eval"
    k: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    seed: int | None = 0
    concurrency: int = 4
    grading_threads: int = 2
    retry_infra: bool = False
    checkpoint: str | None = None  # a transformers checkpoint dir; None = the tiny model built from `model`
    extra_sampling: dict[str, Any] = field(default_factory=dict)


def load_task_set(tasks: TaskDistributionConfig | TaskFileConfig) -> tuple[str, list[Task]]:
    """The task set and its name (what the table calls the task distribution)."""
    if isinstance(tasks, TaskFileConfig):
        return tasks.name or Path(tasks.source).stem, load_tasks(tasks.source, tasks.split, tasks.instance_ids)
    families = "+".join(tasks.families)
    return f"bundled:{families}:{tasks.split}:{tasks.difficulty}:n{tasks.n_tasks}:s{tasks.seed}", \
        build_distribution(tasks)


def build_spec(harness_identity: dict[str, Any], name: str, tasks: list[Task], harness_cfg: Any,
               sandbox: LocalSandboxConfig, ev: EvalConfig, task_seed: int | None) -> EvalSpec:
    return EvalSpec(
        harness=HarnessSpec.from_identity(harness_identity),
        tasks=TaskSetSpec.from_tasks(name, tasks),
        sampling=SamplingSpec(ev.temperature, ev.top_p, ev.max_tokens, ev.seed),
        limits=LimitsSpec(harness_cfg.step_limit, float(harness_cfg.wall_time_limit_s)),
        sandbox=SandboxSpec("local", sandbox.test_timeout_s, sandbox.limits.cpu_s, sandbox.limits.memory_mb,
                            sandbox.limits.file_size_mb),
        k=ev.k, seeds={} if task_seed is None else {"tasks": task_seed},
    )


def _cpu_seconds() -> float:
    """CPU of this process and every child it has reaped (servers, harness workers, graders)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _batches(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class Evaluator:
    """Runs the pending samples of one run directory under one spec."""

    def __init__(self, run_dir: Path, spec: EvalSpec, ev: EvalConfig, tasks: list[Task], stack: Stack,
                 harness: Any, sandbox: LocalSandbox, model_name: str) -> None:
        self.run_dir, self.spec, self.ev, self.stack = run_dir, spec, ev, stack
        self.tasks = {t.instance_id: t for t in tasks}
        self.harness, self.sandbox, self.model_name = harness, sandbox, model_name
        self.store = open_store(run_dir / "traces.sqlite")

    def run(self) -> int:
        pending = pending_samples(self.run_dir, list(self.tasks), self.ev.k, self.ev.retry_infra)
        with progress(len(pending), "samples") as bar:
            for batch in _batches(pending, max(1, self.ev.concurrency * 2)):
                for report in self._run_batch(batch):
                    bar.advance(note=report.outcome)
        return len(pending)

    def _register(self, instance_id: str, sample: int) -> str:
        rollout_id = next_rollout_id(self.store, self.run_dir.name, instance_id, sample)
        sampling = {"temperature": self.ev.temperature, "top_p": self.ev.top_p, "max_tokens": self.ev.max_tokens,
                    **self.ev.extra_sampling}
        seed = self.spec.sample_seed(sample)
        if seed is not None:
            sampling["seed"] = seed
        httpx.post(f"{self.stack.proxy_url}/rollouts", json={
            "rollout_id": rollout_id, "run_id": self.run_dir.name, "task_id": instance_id, "group_id": instance_id,
            "harness": self.spec.harness.name, "harness_version": self.spec.harness.version, "mode": "eval",
            "metadata": {"sample": sample, "sampling": sampling, "fingerprint": self.spec.fingerprint()},
        }).raise_for_status()
        return rollout_id

    def _run_batch(self, batch: list[tuple[str, int]]) -> list[InstanceReport]:
        started = time.time()
        prepared, failed = [], []
        for instance_id, sample in batch:
            rollout_id = self._register(instance_id, sample)
            task = self.tasks[instance_id]
            try:
                workspace = self.sandbox.workspace(task, rollout_id)
            except RepoError as exc:
                failed.append((task, sample, rollout_id, str(exc)))
                continue
            base_url = f"{self.stack.proxy_url}/rollouts/{rollout_id}/v1"
            rollout = HarnessRollout(rollout_id, task, workspace.path, base_url, self.stack.served_model_name,
                                     self.run_dir / "harness" / rollout_id, self._timeout_s())
            prepared.append((task, sample, workspace, rollout))
        results = self.harness.run([p[3] for p in prepared], self.ev.concurrency) if prepared else []
        with ThreadPoolExecutor(self.ev.grading_threads) as pool:
            reports = list(pool.map(lambda args: self._finish(*args, started), [
                (task, sample, ws, rollout, result) for (task, sample, ws, rollout), result in zip(prepared, results,
                                                                                                 strict=True)]))
        reports += [self._infra_failure(*f, started) for f in failed]
        return reports

    def _timeout_s(self) -> float:
        limit = self.spec.limits.time_limit_s
        return (limit if limit > 0 else 600.0) + 60.0

    def _finish(self, task: Task, sample: int, workspace: Any, rollout: HarnessRollout, result: HarnessResult,
                started: float) -> InstanceReport:
        patch = workspace.diff()
        grade = self.sandbox.grade(task, workspace)
        workspace.cleanup()
        return self._record(task, sample, rollout.rollout_id, result, grade, patch, started)

    def _infra_failure(self, task: Task, sample: int, rollout_id: str, reason: str, started: float) -> InstanceReport:
        result = HarnessResult(rollout_id, "crashed", reason=f"workspace could not be made: {reason}")
        return self._record(task, sample, rollout_id, result, GradeResult("error", reason), "", started)

    def _record(self, task: Task, sample: int, rollout_id: str, result: HarnessResult, grade: GradeResult,
                patch: str, started: float) -> InstanceReport:
        store = open_store(self.run_dir / "traces.sqlite")  # one connection per grading thread
        report = InstanceReport.build(task, sample, rollout_id, result, grade, patch,
                                      usage_from_store(store, rollout_id), started)
        infra = report.infra_failure
        store.finish_rollout(rollout_id, "failed" if infra else "finished",
                             reward=None if infra else float(grade.outcome == "resolved"),
                             failure_reason=(grade.reason or result.reason) if infra else None)
        store.close()
        write_report(self.run_dir, report, patch)
        if sample == 0:
            update_preds(self.run_dir, task.instance_id, self.model_name, patch, sample)
        return report


def evaluate_job(model: TinyModelConfig, serving: CpuServingConfig, proxy: ProxyConfig, harness: Any,
                 tasks: TaskDistributionConfig | TaskFileConfig, sandbox: LocalSandboxConfig, eval: EvalConfig,
                 harness_name: str, run_dir: Path) -> dict[str, Any]:
    """Evaluate the model under a frozen spec in the real harness; writes the run records and prints the table."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # swebench's import turns on INFO logging globally
    run_dir, started, cpu0 = Path(run_dir), time.time(), _cpu_seconds()
    name, task_list = load_task_set(tasks)
    with get_harness(harness_name, harness, workers=1) as agent:
        spec = build_spec(agent.identity(), name, task_list, agent.cfg, sandbox,
                          eval, getattr(tasks, "seed", None))
        model_dir, model_name = _model(model, eval, task_list)
        with running_stack(model_dir, serving, proxy, run_dir) as stack:
            box = LocalSandbox(sandbox)
            try:
                ran = Evaluator(run_dir, spec, eval, task_list, stack, agent, box, model_name).run()
            finally:
                box.close()
    reports = read_reports(run_dir)
    write_preds(run_dir, reports, model_name)
    cost = Cost(cpu_h={"evaluation": (_cpu_seconds() - cpu0) / 3600})
    metrics = eval_metrics(reports, spec, eval.experiment, model_name, cost=cost, started_at=started,
                           durations_s={"evaluation": time.time() - started}, extra={"samples_run_now": ran})
    metrics["run_dir"] = str(run_dir)
    write_metrics(run_dir, metrics)
    print(run_markdown(metrics), flush=True)
    return metrics


def _model(model: TinyModelConfig, ev: EvalConfig, tasks: list[Task]) -> tuple[Path, str]:
    if ev.checkpoint:
        path = Path(ev.checkpoint).expanduser()
        if not (path / "config.json").exists():
            raise SystemExit(f"checkpoint {path} has no config.json: pass a transformers checkpoint directory "
                             f"(e.g. one written by `repro build-model --out DIR`)")
        return path, path.name
    corpus = [t.problem_statement for t in tasks[:200]]
    path, _ = tiny_model(model, corpus)
    return path, path.name
