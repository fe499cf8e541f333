"""``metrics.json`` of kind ``"eval"``: one run's numbers with their spec, fingerprint, cost and provenance.

``repro table`` builds results/ only from these files, so everything a table row shows is in here.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from repro.common.files import atomic_write_text
from repro.evaluation.metrics import OUTCOMES, MetricsConfig, Summary, summarize
from repro.evaluation.reports import InstanceReport
from repro.evaluation.spec import EvalSpec

METRICS_FILE = "metrics.json"
SCHEMA_VERSION = 1


@dataclass
class Cost:
    """Compute spent, per phase (e.g. ``{"serving": 0.4, "harness": 0.1, "grading": 0.05}``), in hours."""

    cpu_h: dict[str, float] = field(default_factory=dict)
    gpu_h: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"cpu_h": dict(self.cpu_h), "gpu_h": dict(self.gpu_h), "cpu_h_total": sum(self.cpu_h.values()),
                "gpu_h_total": sum(self.gpu_h.values())}


def default_k_values(k: int) -> list[int]:
    """1, powers of two below k, and k."""
    values = {1, k}
    power = 2
    while power < k:
        values.add(power)
        power *= 2
    return sorted(values)


def _infra_list(reports: list[InstanceReport]) -> list[dict[str, Any]]:
    return [{"instance_id": r.instance_id, "sample": r.sample, "rollout_id": r.rollout_id, "outcome": r.outcome,
             "harness_status": r.harness_status, "reason": r.reason or r.harness_reason}
            for r in reports if r.infra_failure]


def _counts(reports: list[InstanceReport]) -> dict[str, int]:
    by_outcome = Counter(r.outcome for r in reports)
    counts = {o: by_outcome.get(o, 0) for o in OUTCOMES}
    counts["harness_crashed"] = sum(r.harness_status == "crashed" for r in reports)
    counts["infra_failures"] = sum(r.infra_failure for r in reports)
    counts["context_exceeded"] = sum(r.context_exceeded for r in reports)  # unresolved, ended on a refusal
    counts["context_refusals"] = sum(r.context_refusals for r in reports)  # refused calls, recovered or not
    return counts


def _check_reports(reports: list[InstanceReport], spec: EvalSpec) -> list[list[Any]]:
    """Reports must belong to the spec; returns the (instance, sample) pairs still missing."""
    allowed = set(spec.tasks.instance_ids)
    stray = sorted({r.instance_id for r in reports if r.instance_id not in allowed or r.sample >= spec.k})
    if stray:
        raise ValueError(f"reports for instances/samples outside the eval spec: {stray[:5]} "
                         f"({len(stray)} in all); was the run directory reused with another spec?")
    have = {(r.instance_id, r.sample) for r in reports}
    return [[i, s] for i in spec.tasks.instance_ids for s in range(spec.k) if (i, s) not in have]


def _summary_fields(summary: Summary, config: MetricsConfig) -> dict[str, Any]:
    ci = summary.wilson if config.ci_method == "wilson" else summary.bootstrap
    return {
        "n_tasks": summary.n_tasks, "n_tasks_total": summary.n_tasks_total,
        "pass_at_1": summary.pass_at_1, "strict_pass_at_1": summary.strict_pass_at_1,
        "ci": {"method": config.ci_method, "confidence": config.confidence, "low": ci[0], "high": ci[1]},
        "wilson": list(summary.wilson), "bootstrap": list(summary.bootstrap),
        "pass_at_k": {str(k): v for k, v in summary.pass_at_k.items()},
        "pass_at_k_tasks": {str(k): v for k, v in summary.pass_at_k_tasks.items()},
        "excluded_tasks": summary.excluded_tasks, "per_task": summary.per_task,
    }


def calls_histogram(calls: Iterable[int]) -> dict[str, int]:
    """Rollouts by their number of model calls (``{"1": n, "3": m, ...}``, in call order)."""
    return {str(n): c for n, c in sorted(Counter(calls).items())}


def eval_metrics(reports: Iterable[InstanceReport], spec: EvalSpec, experiment: str, model: str, *,
                 table: str | None = None, cost: Cost | None = None, started_at: float = 0.0,
                 durations_s: dict[str, float] | None = None, config: MetricsConfig | None = None,
                 extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The metrics.json content for one run. ``table`` names the comparison the row belongs to (default: the
    experiment); ``model`` says what was evaluated (checkpoint name / hash)."""
    reports = sorted(reports, key=lambda r: (r.instance_id, r.sample))
    config = config or MetricsConfig()
    missing = _check_reports(reports, spec)
    summary = summarize(reports, default_k_values(spec.k), config)
    return {
        "kind": "eval", "schema_version": SCHEMA_VERSION, "experiment": experiment, "table": table or experiment,
        "model": model, "fingerprint": spec.fingerprint(), "spec": spec.to_dict(), "harness": spec.label(),
        "task_distribution": spec.tasks.name, "k": spec.k, "n_samples": len(reports),
        **_summary_fields(summary, config),
        "counts": _counts(reports), "infra_failures": _infra_list(reports),
        "calls_histogram": calls_histogram(r.n_calls for r in reports),
        "complete": not missing, "missing_samples": missing,
        "cost": (cost or Cost()).to_dict(), "metrics_config": asdict(config),
        "started_at": started_at, "finished_at": time.time(), "durations_s": dict(durations_s or {}),
        "extra": dict(extra or {}),
    }


def write_metrics(run_dir: Path, metrics: dict[str, Any]) -> Path:
    path = Path(run_dir) / METRICS_FILE
    atomic_write_text(path, json.dumps(metrics, indent=2, sort_keys=True))
    return path
