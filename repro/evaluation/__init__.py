"""Frozen evaluation: the spec and its fingerprint, Pass@1 / pass@k with intervals, paired tests, run records."""

from repro.evaluation.metrics import MetricsConfig, Summary, is_infra_failure, pass_at_1, pass_at_k, summarize
from repro.evaluation.paired import mcnemar_exact, paired_bootstrap, sign_flip_test
from repro.evaluation.preds import update_preds, write_preds
from repro.evaluation.reports import (
    InstanceReport,
    Usage,
    finished_samples,
    next_rollout_id,
    pending_samples,
    read_reports,
    rollout_id_for,
    usage_from_store,
    write_report,
)
from repro.evaluation.spec import (
    EvalSpec,
    HarnessSpec,
    LimitsSpec,
    SamplingSpec,
    SandboxSpec,
    TaskSetSpec,
    fingerprint_of,
    sha256_files,
    tasks_sha256,
)
from repro.evaluation.summary import Cost, eval_metrics, write_metrics

__all__ = [
    "Cost",
    "EvalSpec",
    "HarnessSpec",
    "InstanceReport",
    "LimitsSpec",
    "MetricsConfig",
    "SamplingSpec",
    "SandboxSpec",
    "Summary",
    "TaskSetSpec",
    "Usage",
    "eval_metrics",
    "fingerprint_of",
    "finished_samples",
    "is_infra_failure",
    "mcnemar_exact",
    "next_rollout_id",
    "paired_bootstrap",
    "pass_at_1",
    "pass_at_k",
    "pending_samples",
    "read_reports",
    "rollout_id_for",
    "sha256_files",
    "sign_flip_test",
    "summarize",
    "tasks_sha256",
    "update_preds",
    "usage_from_store",
    "write_metrics",
    "write_preds",
    "write_report",
]
