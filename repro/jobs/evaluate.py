"""Frozen evaluation in the real harness: tasks -> workspaces -> harness rollouts through the proxy -> grading
-> per-instance reports, preds.json, metrics.json and the printed table. Resumable: finished samples of the
run directory are skipped (``run.dir=<existing run>``)."""

from __future__ import annotations

import json
import logging
import resource
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.evaluation import (
    Cost,
    EvalSpec,
    HarnessSpec,
    InstanceReport,
    LimitsSpec,
    SamplingSpec,
    TaskSetSpec,
    eval_metrics,
    read_reports,
    write_metrics,
    write_preds,
)
from repro.fanout import FanoutConfig, harness_for
from repro.jobs.rollouts import GradeCache, RolloutOptions, RolloutRunner
from repro.jobs.stack import CpuServingConfig, EndpointServingConfig, Stack, running_stack
from repro.proxy import ProxyConfig
from repro.report.eval_table import run_markdown
from repro.sandbox.local import LocalSandbox, LocalSandboxConfig
from repro.sandbox.select import make_sandbox, sandbox_spec
from repro.tasks.distributions import TaskDistributionConfig, build_distribution
from repro.tasks.loaders import load_tasks
from repro.tasks.schema import Task
from repro.tinymodel.model import TinyModelConfig
from repro.tinymodel.recipe import tiny_model


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
    layout: str = "rows"  # how `repro table` lays out this table: rows | matrix (harness x task distribution)


def load_task_set(tasks: TaskDistributionConfig | TaskFileConfig) -> tuple[str, list[Task]]:
    """The task set and its name (what the table calls the task distribution)."""
    if isinstance(tasks, TaskFileConfig):
        return tasks.name or Path(tasks.source).stem, load_tasks(tasks.source, tasks.split, tasks.instance_ids)
    families = "+".join(tasks.families)
    return f"bundled:{families}:{tasks.split}:{tasks.difficulty}:n{tasks.n_tasks}:s{tasks.seed}", \
        build_distribution(tasks)


MODEL_NAME_PLACEHOLDER = "{served_model_name}"


def with_model_name(identity: dict[str, Any], served_model_name: str | None) -> dict[str, Any]:
    """``identity`` with the ``{served_model_name}`` placeholder filled in: the name a harness is given decides what
    it shows the model (OpenCode picks its system prompt by it), so the spec records the actual name."""
    if served_model_name is None:
        return identity
    text = json.dumps(identity)
    return json.loads(text.replace(MODEL_NAME_PLACEHOLDER, served_model_name)) if MODEL_NAME_PLACEHOLDER in text \
        else identity


def build_spec(harness_identity: dict[str, Any], name: str, tasks: list[Task], harness_cfg: Any,
               sandbox: LocalSandboxConfig, ev: EvalConfig, task_seed: int | None,
               served_model_name: str | None = None) -> EvalSpec:
    return EvalSpec(
        harness=HarnessSpec.from_identity(with_model_name(harness_identity, served_model_name)),
        tasks=TaskSetSpec.from_tasks(name, tasks),
        sampling=SamplingSpec(ev.temperature, ev.top_p, ev.max_tokens, ev.seed),
        limits=LimitsSpec(int(getattr(harness_cfg, "step_limit", 0) or 0),
                          float(getattr(harness_cfg, "wall_time_limit_s", 0) or 0)),
        sandbox=sandbox_spec(sandbox, tasks),
        k=ev.k, seeds={} if task_seed is None else {"tasks": task_seed},
    )


def _cpu_seconds() -> float:
    """CPU of this process and every child it has reaped (servers, harness workers, graders)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def eval_options(spec: EvalSpec, ev: EvalConfig) -> RolloutOptions:
    """The rollout options of a frozen evaluation: mode ``eval``, the spec's decoding, seeds and limits."""
    sampling = {"temperature": ev.temperature, "top_p": ev.top_p, "max_tokens": ev.max_tokens, **ev.extra_sampling}
    return RolloutOptions(
        mode="eval", k=ev.k, sampling=sampling, seed_of=spec.sample_seed,
        concurrency=ev.concurrency, grading_threads=ev.grading_threads, retry_infra=ev.retry_infra,
        time_limit_s=spec.limits.time_limit_s, harness_name=spec.harness.name,
        harness_version=spec.harness.version, fingerprint=spec.fingerprint(),
    )


def run_frozen_eval(phase_dir: Path, store_path: Path, spec: EvalSpec, ev: EvalConfig, tasks: list[Task],
                    stack: Stack, agent: Any, box: LocalSandbox, model_name: str,
                    grade_cache: GradeCache | None = None) -> tuple[list[InstanceReport], int]:
    """Run the pending samples of ``phase_dir`` under ``spec``; (every report of the phase, samples run now)."""
    runner = RolloutRunner(phase_dir, store_path, eval_options(spec, ev), tasks, stack, agent, box, model_name,
                           grade_cache)
    try:
        ran = len(runner.run("eval samples"))
    finally:
        runner.close()
    reports = read_reports(phase_dir)
    write_preds(phase_dir, reports, model_name)
    return reports, ran


def evaluate_job(model: TinyModelConfig, serving: CpuServingConfig, proxy: ProxyConfig, harness: Any,
                 tasks: TaskDistributionConfig | TaskFileConfig, sandbox: LocalSandboxConfig, eval: EvalConfig,
                 harness_name: str | None, run_dir: Path, fanout: FanoutConfig | None = None) -> dict[str, Any]:
    """Evaluate the model under a frozen spec in the real harness; writes the run records and prints the table."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # swebench's import turns on INFO logging globally
    run_dir, started, cpu0 = Path(run_dir), time.time(), _cpu_seconds()
    name, task_list = load_task_set(tasks)
    with harness_for(harness_name, harness, sandbox, fanout) as agent:
        spec = build_spec(agent.identity(), name, task_list, agent.cfg, sandbox,
                          eval, getattr(tasks, "seed", None), serving.served_model_name)
        model_dir, model_name = (Path(), serving.served_model_name) if isinstance(serving, EndpointServingConfig) \
            else eval_model(model, eval, task_list)
        with running_stack(model_dir, serving, proxy, run_dir) as stack:
            box = make_sandbox(sandbox)
            try:
                reports, ran = run_frozen_eval(run_dir, run_dir / "traces.sqlite", spec, eval, task_list, stack,
                                               agent, box, model_name)
            finally:
                box.close()
    cost = Cost(cpu_h={"evaluation": (_cpu_seconds() - cpu0) / 3600})
    metrics = eval_metrics(reports, spec, eval.experiment, model_name, cost=cost, started_at=started,
                           durations_s={"evaluation": time.time() - started}, extra={"samples_run_now": ran})
    metrics["run_dir"], metrics["layout"] = str(run_dir), eval.layout
    write_metrics(run_dir, metrics)
    print(run_markdown(metrics), flush=True)
    refuse_if_all_infra(reports, run_dir)
    return metrics


def refuse_if_all_infra(reports: list[InstanceReport], run_dir: Path) -> None:
    """SystemExit naming the reasons when every sample is an infrastructure failure: such a run measured nothing
    (a missing repository, interpreter or image), and a zero exit would hide it behind ``eval samples: 0/N``."""
    if not reports or not all(r.infra_failure for r in reports):
        return
    reasons = Counter((r.reason or r.harness_reason or r.outcome).split("\n")[0][:300] for r in reports)
    listed = "; ".join(f"{n} x {reason}" for reason, n in reasons.most_common(3))
    raise SystemExit(f"error: all {len(reports)} samples are infrastructure failures, so this run measured "
                     f"nothing: {listed} (reports in {run_dir})")


def eval_model(model: TinyModelConfig, ev: EvalConfig, tasks: list[Task]) -> tuple[Path, str]:
    """The checkpoint to evaluate (``eval.checkpoint``, else the tiny offline model) and its name."""
    if ev.checkpoint:
        path = Path(ev.checkpoint).expanduser()
        if not (path / "config.json").exists():
            raise SystemExit(f"checkpoint {path} has no config.json: pass a transformers checkpoint directory "
                             f"(e.g. one written by `repro build-model --out DIR`)")
        return path, path.name
    corpus = [t.problem_statement for t in tasks[:200]]
    path, _ = tiny_model(model, corpus)
    return path, path.name
