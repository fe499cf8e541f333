"""Frozen evaluation in the real harness, the trainer's counterpart: tasks -> workspaces -> harness rollouts
through the proxy (mode ``eval``, the spec's decoding and seeds) -> grading -> per-instance reports and
``preds.json``. Resumable: finished samples of a phase folder are skipped.

    evaluator = Evaluator(server, harness, sandbox, EvalConfig(k=1))
    result = evaluator.evaluate(tasks, run_dir / "eval_after", label="rl")  # result.pass_at_1, result.reports

Without a ``spec`` the evaluator freezes one from what it is given (the harness's identity and limits, the tasks,
the sandbox's settings, the decoding); experiments pass the spec they froze before the run.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.evaluation import (
    EvalSpec,
    HarnessSpec,
    InstanceReport,
    LimitsSpec,
    SamplingSpec,
    TaskSetSpec,
    pass_at_1,
    read_reports,
    write_preds,
)
from repro.protocols import Harness, Sandbox
from repro.rl.rollouts import GradeCache, RolloutOptions, RolloutRunner
from repro.sandbox.select import sandbox_spec
from repro.serving.stack import Stack
from repro.tasks.schema import Task

MODEL_NAME_PLACEHOLDER = "{served_model_name}"


@dataclass(frozen=True)
class EvalConfig(SamplingSpec):
    """The frozen part of an evaluation: decoding (:class:`~repro.evaluation.spec.SamplingSpec`'s fields), samples
    per task, concurrency; the model is chosen separately (``checkpoint``)."""

    max_tokens: int = 256
    experiment: str = "eval"
    k: int = 1
    concurrency: int = 4
    grading_threads: int = 2
    retry_infra: bool = False
    checkpoint: str | None = None  # a transformers checkpoint dir; None = the tiny model built from `model`
    extra_sampling: dict[str, Any] = field(default_factory=dict)
    layout: str = "rows"  # how `repro table` lays out this table: rows | matrix (harness x task distribution)

    @property
    def sampling(self) -> dict[str, Any]:
        """What every evaluation call is forced to (besides its seed)."""
        return {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens,
                **self.extra_sampling}


def with_model_name(identity: dict[str, Any], served_model_name: str | None) -> dict[str, Any]:
    """``identity`` with the ``{served_model_name}`` placeholder filled in: the name a harness is given decides what
    it shows the model (OpenCode picks its system prompt by it), so the spec records the actual name."""
    if served_model_name is None:
        return identity
    text = json.dumps(identity)
    return json.loads(text.replace(MODEL_NAME_PLACEHOLDER, served_model_name)) if MODEL_NAME_PLACEHOLDER in text \
        else identity


def build_spec(harness: Harness, name: str, tasks: list[Task], sandbox: Any, ev: EvalConfig,
               task_seed: int | None, served_model_name: str | None = None) -> EvalSpec:
    """The frozen spec of evaluating ``harness`` on the task set ``name`` in ``sandbox`` (a sandbox or its config)
    under ``ev``; ``task_seed``: the seed that drew the tasks (recorded)."""
    limits = harness.limits
    return EvalSpec(
        harness=HarnessSpec.from_identity(with_model_name(harness.identity(), served_model_name)),
        tasks=TaskSetSpec.from_tasks(name, tasks),
        sampling=SamplingSpec(ev.temperature, ev.top_p, ev.max_tokens, ev.seed),
        limits=LimitsSpec(limits.step_limit, limits.wall_time_limit_s),
        sandbox=sandbox_spec(sandbox_config(sandbox), tasks),
        k=ev.k, seeds={} if task_seed is None else {"tasks": task_seed},
    )


def sandbox_config(sandbox: Any) -> Any:
    """A sandbox's config (``LocalSandbox.config``, ``DockerSandbox.config``); a config is its own."""
    return getattr(sandbox, "config", sandbox)


@dataclass(frozen=True)
class EvalResult:
    """The reports of one evaluation phase and what they add up to."""

    reports: list[InstanceReport]
    phase_dir: Path
    spec: EvalSpec

    @property
    def resolved(self) -> int:
        return sum(r.outcome == "resolved" for r in self.reports)

    @property
    def infra_failures(self) -> int:
        return sum(r.infra_failure for r in self.reports)

    @property
    def pass_at_1(self) -> float:
        """Resolved share of the samples that measured the policy (infrastructure failures left out, as in the
        published tables)."""
        return pass_at_1(self.reports)


def eval_options(spec: EvalSpec, ev: EvalConfig) -> RolloutOptions:
    """The rollout options of a frozen evaluation: mode ``eval``, the spec's decoding, seeds and limits."""
    return RolloutOptions(
        mode="eval", k=ev.k, sampling=ev.sampling, seed_of=spec.sample_seed,
        concurrency=ev.concurrency, grading_threads=ev.grading_threads, retry_infra=ev.retry_infra,
        time_limit_s=spec.limits.time_limit_s, harness_name=spec.harness.name,
        harness_version=spec.harness.version, fingerprint=spec.fingerprint(),
    )


class Evaluator:
    """Runs a frozen evaluation with ``harness`` in ``sandbox`` against the model ``server`` serves, under
    ``config``; ``spec``: the spec frozen before the run (default: frozen from the harness, the tasks given to
    :meth:`evaluate` as ``task_set``, the sandbox and ``config``); calls are stored in ``store_path`` (default:
    ``traces.sqlite`` beside each phase folder); ``grades`` shares verdicts."""

    def __init__(self, server: Stack, harness: Harness, sandbox: Sandbox, config: EvalConfig | None = None, *,
                 spec: EvalSpec | None = None, task_set: str = "tasks", store_path: Path | None = None,
                 grades: GradeCache | None = None) -> None:
        self.server, self.harness, self.sandbox = server, harness, sandbox
        self.cfg, self.spec, self.task_set = config or EvalConfig(), spec, task_set
        self.store_path, self.grades = store_path, grades
        self.ran = 0  # samples the last evaluate() ran (the others were finished before)

    def spec_for(self, tasks: list[Task]) -> EvalSpec:
        """The frozen spec: the one given, else the one of these tasks (so each task set gets its own)."""
        if self.spec is not None:
            return self.spec
        return build_spec(self.harness, self.task_set, tasks, self.sandbox, self.cfg, None,
                          self.server.served_model_name)

    def evaluate(self, tasks: list[Task], phase_dir: Path, label: str = "policy") -> EvalResult:
        """Run the pending samples of ``phase_dir``; every report of the phase (``label`` names the model in
        ``preds.json``)."""
        phase_dir, spec = Path(phase_dir), self.spec_for(tasks)
        store = self.store_path or phase_dir.parent / "traces.sqlite"
        runner = RolloutRunner(phase_dir, store, eval_options(spec, self.cfg), tasks, self.server,
                               self.harness, self.sandbox, label, self.grades)
        try:
            self.ran = len(runner.run("eval samples"))
        finally:
            runner.close()
        reports = read_reports(phase_dir)
        write_preds(phase_dir, reports, label)
        return EvalResult(reports, phase_dir, spec)


def evaluate_or_refuse(evaluator: Evaluator, tasks: list[Task], phase_dir: Path, label: str) -> list[InstanceReport]:
    """``evaluator``'s reports of ``tasks`` in ``phase_dir``; SystemExit when every one is an infrastructure failure
    (:func:`refuse_if_all_infra`)."""
    reports = evaluator.evaluate(tasks, phase_dir, label).reports
    refuse_if_all_infra(reports, phase_dir)
    return reports


def refuse_if_all_infra(reports: list[InstanceReport], run_dir: Path) -> None:
    """SystemExit naming the reasons when every sample is an infrastructure failure: such a run measured nothing
    (a missing repository, interpreter or image), and a zero exit would hide it behind ``eval samples: 0/N``."""
    if not reports or not all(r.infra_failure for r in reports):
        return
    reasons = Counter(_failure_reason(r).split("\n")[0][:300] for r in reports)
    listed = "; ".join(f"{n} x {reason}" for reason, n in reasons.most_common(3))
    raise SystemExit(f"error: all {len(reports)} samples are infrastructure failures, so this run measured "
                     f"nothing: {listed} (reports in {run_dir})")


def _failure_reason(report: InstanceReport) -> str:
    """Why a sample is an infrastructure failure: the harness's reason when it crashed or timed out (the grade of
    what it left is beside the point), else the grader's."""
    if report.harness_status in ("crashed", "timeout") and report.harness_reason:
        return f"harness {report.harness_status}: {report.harness_reason}"
    return report.reason or report.harness_reason or report.outcome
