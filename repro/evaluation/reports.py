"""Per-instance reports of an evaluation run, and the resumability rule built on them.

Layout inside a run directory (one folder per (instance, sample); the report is written last, atomically, so
its presence marks the sample finished)::

    instances/<instance_id>/sample-<i>/patch.diff     the working copy's diff after the harness ran
    instances/<instance_id>/sample-<i>/report.json    InstanceReport

**Resumability rule**: a rerun in the same run directory skips every (instance, sample) whose ``report.json``
exists (as SWE-bench skips instances with a ``report.json``). With ``retry_infra=True`` samples whose report is
an infrastructure failure (see ``repro.evaluation.metrics``) are run again and their report overwritten.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from repro.common.files import atomic_write_text
from repro.evaluation.metrics import OUTCOMES, is_infra_failure
from repro.protocols import GradeResult, HarnessResult
from repro.store import SqliteTraceStore
from repro.store.trace_records import CONTEXT_EXCEEDED
from repro.tasks.schema import Task

INSTANCES_DIR = "instances"
REPORT_FILE = "report.json"
PATCH_FILE = "patch.diff"
NOT_GRADED_REASON = "not graded (demonstration)"  # the reason of a demonstration's report (never graded)
LOG_TAIL_CHARS = 4000
_ROLLOUT_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]")


@dataclass
class Usage:
    """Model calls of one rollout as the trace store recorded them."""

    n_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    longest_prompt: int = 0  # prompt tokens of the rollout's longest call (RL's prompt-length penalty)
    context_refusals: int = 0  # calls refused as longer than the model's context (the harness may have recovered)
    context_exceeded_seq: int | None = None  # the rollout's last policy call, when it was such a refusal


def usage_from_store(store: SqliteTraceStore, rollout_id: str) -> Usage:
    calls = store.calls(rollout_id)
    prompts = [c.prompt_tokens or 0 for c in calls]
    policy = [c for c in calls if c.purpose == "policy"]
    ended = policy[-1].seq if policy and policy[-1].status == CONTEXT_EXCEEDED else None
    return Usage(len(calls), sum(prompts), sum(c.completion_tokens or 0 for c in calls), max(prompts, default=0),
                 sum(c.status == CONTEXT_EXCEEDED for c in calls), ended)


def patch_stats(patch: str) -> tuple[int, int, int]:
    """(bytes, lines added, lines removed) of a unified diff."""
    lines = patch.splitlines()
    added = sum(1 for line in lines if line.startswith("+") and not line.startswith("+++"))
    removed = sum(1 for line in lines if line.startswith("-") and not line.startswith("---"))
    return len(patch.encode()), added, removed


@dataclass
class InstanceReport:
    """What happened to one sample of one instance: harness ending, grader verdict, cost, patch size."""

    instance_id: str
    sample: int
    rollout_id: str
    outcome: str  # resolved / unresolved / error / timeout (the grader's word)
    reason: str = ""
    harness_status: str = ""  # finished / crashed / timeout
    harness_exit_status: str = ""
    harness_reason: str = ""
    n_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    longest_prompt: int = 0  # prompt tokens of the rollout's longest call (RL's prompt-length penalty)
    context_refusals: int = 0  # its calls refused as longer than the model's context
    context_exceeded_seq: int | None = None  # it ended on such a refusal (its last policy call): the outcome
    tests: dict[str, str] = field(default_factory=dict)
    fail_to_pass: list[str] = field(default_factory=list)
    pass_to_pass: list[str] = field(default_factory=list)
    patch_bytes: int = 0  # the size of the agent's patch
    patch_added: int = 0  # its added lines
    patch_removed: int = 0  # its removed lines
    harness_duration_s: float = 0.0  # the harness's run of this rollout
    grade_duration_s: float = 0.0  # the grader's test run
    started_at: float = 0.0  # epoch seconds: the sample was registered
    finished_at: float = 0.0  # epoch seconds: its report was written
    trajectory_path: str | None = None
    grade_log_tail: str = ""
    host: str = ""  # the sandbox host that ran it (fanout=ray: hostname:pid of its actor; empty: this process)

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {self.outcome!r}")

    @property
    def infra_failure(self) -> bool:
        return is_infra_failure(self)

    @property
    def context_exceeded(self) -> bool:
        """Unresolved after its last policy call was refused as too long: the model's outcome, not the machinery's."""
        return self.context_exceeded_seq is not None and self.outcome == "unresolved"

    @classmethod
    def build(cls, task: Task, sample: int, rollout_id: str, harness: HarnessResult, grade: GradeResult,
              patch: str, usage: Usage, started_at: float, finished_at: float | None = None) -> InstanceReport:
        """Assemble a report from the harness result, the grade and the patch."""
        size, added, removed = patch_stats(patch)
        return cls(
            instance_id=task.instance_id, sample=sample, rollout_id=rollout_id, outcome=grade.outcome,
            reason=grade.reason, harness_status=harness.status, harness_exit_status=harness.exit_status,
            harness_reason=harness.reason, n_calls=usage.n_calls, prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens, context_refusals=usage.context_refusals,
            context_exceeded_seq=usage.context_exceeded_seq, tests=dict(grade.tests),
            fail_to_pass=list(task.FAIL_TO_PASS), pass_to_pass=list(task.PASS_TO_PASS), patch_bytes=size,
            patch_added=added, patch_removed=removed,
            harness_duration_s=harness.duration_s, grade_duration_s=grade.duration_s, started_at=started_at,
            finished_at=time.time() if finished_at is None else finished_at,
            trajectory_path=harness.trajectory_path, grade_log_tail=grade.log_tail[-LOG_TAIL_CHARS:],
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InstanceReport:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def safe_name(instance_id: str) -> str:
    """A file-system-safe name for an instance id: unchanged when already safe (SWE-bench ids are), otherwise
    the unsafe characters replaced and a short hash of the id appended (so two ids never share a folder)."""
    safe = _UNSAFE.sub("_", instance_id)
    if safe == instance_id and instance_id and not instance_id.startswith("."):
        return safe
    safe = "_" + safe[1:] if safe.startswith(".") else safe
    return f"{safe}-{hashlib.sha256(instance_id.encode()).hexdigest()[:8]}"


def sample_dir(run_dir: Path, instance_id: str, sample: int) -> Path:
    return Path(run_dir) / INSTANCES_DIR / safe_name(instance_id) / f"sample-{sample}"


def rollout_id_for(run_name: str, instance_id: str, sample: int, attempt: int = 0) -> str:
    """A unique rollout id the proxy accepts (``[A-Za-z0-9_-]{1,128}``); ``attempt`` > 0 for reruns of an
    infrastructure failure. Over-long or unsafe ids are shortened and disambiguated by a hash."""
    raw = f"{run_name}--{instance_id}--s{sample}" + (f"-r{attempt}" if attempt else "")
    safe = _ROLLOUT_UNSAFE.sub("_", raw)
    if safe == raw and len(raw) <= 128:
        return raw
    digest = hashlib.sha256(raw.encode()).hexdigest()[:10]
    return f"{safe[:117]}-{digest}"


def next_rollout_id(store: SqliteTraceStore, run_name: str, instance_id: str, sample: int) -> str:
    """The first :func:`rollout_id_for` attempt not yet in the store (a rerun after a crash, or of an
    infrastructure failure, gets a fresh rollout; the earlier one stays in the store for inspection)."""
    attempt = 0
    while store.get_rollout(rollout_id_for(run_name, instance_id, sample, attempt)) is not None:
        attempt += 1
    return rollout_id_for(run_name, instance_id, sample, attempt)


def write_report(run_dir: Path, report: InstanceReport, patch: str) -> Path:
    """Write the patch, then the report (atomically; the report marks the sample finished)."""
    folder = sample_dir(run_dir, report.instance_id, report.sample)
    atomic_write_text(folder / PATCH_FILE, patch)
    path = folder / REPORT_FILE
    atomic_write_text(path, json.dumps(asdict(report), indent=2, sort_keys=True))
    return path


def read_patch(run_dir: Path, instance_id: str, sample: int) -> str:
    path = sample_dir(run_dir, instance_id, sample) / PATCH_FILE
    return path.read_text() if path.exists() else ""


def read_reports(run_dir: Path) -> list[InstanceReport]:
    """Every report of the run, sorted by (instance id, sample)."""
    reports = []
    for path in sorted((Path(run_dir) / INSTANCES_DIR).glob(f"*/sample-*/{REPORT_FILE}")):
        try:
            reports.append(InstanceReport.from_dict(json.loads(path.read_text())))
        except (json.JSONDecodeError, TypeError, ValueError) as exc:
            raise ValueError(f"{path} is not a valid instance report ({exc}); delete it to rerun that sample") from None
    return sorted(reports, key=lambda r: (r.instance_id, r.sample))


def finished_samples(run_dir: Path, retry_infra: bool = False) -> set[tuple[str, int]]:
    """(instance id, sample) pairs that a rerun skips (see the module docstring)."""
    return {(r.instance_id, r.sample) for r in read_reports(run_dir) if not (retry_infra and r.infra_failure)}


def pending_samples(run_dir: Path, instance_ids: list[str], k: int, retry_infra: bool = False) -> list[tuple[str, int]]:
    """What is left to run: every (instance, sample < k) without a final report, in instance order."""
    done = finished_samples(run_dir, retry_infra)
    return [(i, s) for i in instance_ids for s in range(k) if (i, s) not in done]
