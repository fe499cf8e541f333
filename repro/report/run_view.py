"""An evaluation run at a glance: its samples grouped by outcome, with the reasons, from the per-instance
reports; rollouts the store has but no report covers are listed too (in flight, or lost)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from repro.evaluation.metrics import OUTCOMES
from repro.evaluation.records import InstanceReport
from repro.evaluation.summary import METRICS_FILE
from repro.store import SqliteTraceStore

_STYLES = {"resolved": "green", "unresolved": "yellow", "error": "red", "timeout": "red"}


def _reason(report: InstanceReport, limit: int = 100) -> str:
    parts = [report.reason]
    if report.harness_status and report.harness_status != "finished":
        parts.append(f"harness {report.harness_status}: {report.harness_reason}".rstrip(": "))
    text = "; ".join(p for p in parts if p).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def outcome_table(outcome: str, reports: list[InstanceReport]) -> Table:
    style = _STYLES.get(outcome, "")
    table = Table(title=f"[{style}]{outcome}[/{style}] ({len(reports)})", title_justify="left")
    for column in ("instance", "sample", "rollout", "harness", "calls", "tokens", "patch", "tests failing"):
        table.add_column(column, no_wrap=column != "instance")
    table.add_column("reason", overflow="fold")
    for r in reports:
        failing = sum(1 for t in r.fail_to_pass + r.pass_to_pass if r.tests.get(t) != "PASSED")
        harness = r.harness_status + (f"/{r.harness_exit_status}" if r.harness_exit_status else "")
        table.add_row(r.instance_id, str(r.sample), r.rollout_id, harness, str(r.n_calls),
                      f"{r.prompt_tokens}+{r.completion_tokens}", f"+{r.patch_added}/-{r.patch_removed}",
                      str(failing), _reason(r))
    return table


def headline(run_dir: Path, reports: list[InstanceReport]) -> Text:
    counts = Counter(r.outcome for r in reports)
    infra = sum(r.infra_failure for r in reports)
    text = f"{run_dir}: {len(reports)} samples · " + " · ".join(f"{o} {counts.get(o, 0)}" for o in OUTCOMES)
    text += f" · infrastructure failures {infra}"
    metrics_path = run_dir / METRICS_FILE
    if metrics_path.exists():
        metrics = json.loads(metrics_path.read_text())
        if metrics.get("kind") == "eval":
            text += (f"\nPass@1 {100 * metrics['pass_at_1']:.1f}% (strict {100 * metrics['strict_pass_at_1']:.1f}%)"
                     f" on {metrics['n_tasks']} tasks · fingerprint {metrics['fingerprint']}")
    return Text(text, style="bold")


def unreported_table(rollout_ids: list[str], store: SqliteTraceStore) -> Table:
    table = Table(title=f"no report ({len(rollout_ids)}): in flight, or the run stopped before grading",
                  title_justify="left")
    for column in ("rollout", "task", "status", "failure"):
        table.add_column(column)
    for rollout_id in rollout_ids:
        r = store.get_rollout(rollout_id)
        if r is not None:
            table.add_row(r.rollout_id, r.task_id, r.status, r.failure_reason or "")
    return table


def run_overview(run_dir: Path, reports: list[InstanceReport], store: SqliteTraceStore) -> list[RenderableType]:
    """Headline, one table per outcome present, and the rollouts without a report."""
    parts: list[RenderableType] = [headline(run_dir, reports)]
    for outcome in OUTCOMES:
        group = [r for r in reports if r.outcome == outcome]
        if group:
            parts.append(outcome_table(outcome, group))
    reported = {r.rollout_id for r in reports}
    unreported = [r.rollout_id for r in store.list_rollouts() if r.rollout_id not in reported]
    if unreported:
        parts.append(unreported_table(unreported, store))
    parts.append(Text(f"details: repro inspect {run_dir} <rollout or instance id>", style="dim"))
    return parts


def resolve_target(store: SqliteTraceStore, reports: list[InstanceReport], target: str) -> list[str]:
    """Rollout ids meant by ``target``: that rollout, or every sample's rollout of that instance."""
    if store.get_rollout(target) is not None:
        return [target]
    return [r.rollout_id for r in reports if r.instance_id == target]
