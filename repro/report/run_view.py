"""A run at a glance: a summary by phase, rollout mode and outcome (rollouts, calls, tokens), then the selected
rollouts, one table per outcome, each cut at ``limit`` rows with a line saying how many were left out."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from repro.evaluation.reports import InstanceReport
from repro.evaluation.summary import METRICS_FILE
from repro.report.rollout_index import OUTCOME_CLASSES, RolloutEntry
from repro.store import open_store

DEFAULT_LIMIT = 20
_STYLES = {"resolved": "green", "unresolved": "yellow", "infra-failure": "red", "no-report": "magenta"}
_TITLES = {"infra-failure": "infrastructure failures (grader error or timeout, or the harness crashed)",
           "not-graded": "not graded (demonstrations)",
           "no-report": "no report: in flight, the run stopped before grading, or not a graded phase"}


@dataclass(frozen=True)
class Selection:
    """What the user asked to see: phases, outcomes (empty: all) and rows per table (0: all)."""

    phases: tuple[str, ...] = ()
    outcomes: tuple[str, ...] = ()
    limit: int = DEFAULT_LIMIT

    def flags(self) -> str:
        return " ".join([*(f"--phase {p}" for p in self.phases), *(f"--outcome {o}" for o in self.outcomes)])


def _reason(report: InstanceReport, limit: int = 100) -> str:
    parts = [report.reason]
    if report.harness_status and report.harness_status != "finished":
        parts.append(f"harness {report.harness_status}: {report.harness_reason}".rstrip(": "))
    text = "; ".join(p for p in parts if p).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _tokens(prompt: int, completion: int) -> str:
    return f"{prompt}+{completion}"


def summary_table(entries: list[RolloutEntry]) -> Table:
    """Rollouts, calls and tokens per (phase, mode, outcome), phases in the order they ran, and a total row."""
    table = Table(title="summary by phase, rollout mode and outcome", title_justify="left")
    for column in ("phase", "mode", "outcome", "rollouts", "calls", "calls/rollout", "prompt tokens",
                   "completion tokens"):
        table.add_column(column, justify="right" if column not in ("phase", "mode", "outcome") else "left")
    groups: dict[tuple[str, str, str], list[RolloutEntry]] = {}
    for e in entries:
        groups.setdefault((e.phase, e.mode, e.outcome), []).append(e)
    phase_order = {p: i for i, p in enumerate(dict.fromkeys(e.phase for e in entries))}
    keys = sorted(groups, key=lambda k: (phase_order[k[0]], k[1], OUTCOME_CLASSES.index(k[2])))
    for key in keys:
        table.add_row(*key, *_totals(groups[key]), style=_STYLES.get(key[2], ""))
    table.add_row("all", "", "", *_totals(entries), style="bold", end_section=True)
    return table


def _totals(entries: list[RolloutEntry]) -> tuple[str, ...]:
    calls = sum(e.calls for e in entries)
    return (str(len(entries)), str(calls), f"{calls / len(entries):.2f}" if entries else "-",
            str(sum(e.prompt_tokens for e in entries)), str(sum(e.completion_tokens for e in entries)))


def reported_table(title: str, entries: list[RolloutEntry]) -> Table:
    """Rollouts with a report: the grader's verdict, harness ending, cost, patch size, failing tests, reason."""
    table = Table(title=title, title_justify="left")
    for column in ("phase", "rollout", "verdict", "harness", "calls", "tokens", "patch", "failing"):
        table.add_column(column, no_wrap=column != "rollout", overflow="fold")
    table.add_column("reason", overflow="fold", ratio=1)
    for e in entries:
        r = e.report
        assert r is not None
        graded = e.outcome != "not-graded"
        failing = sum(1 for t in r.fail_to_pass + r.pass_to_pass if r.tests.get(t) != "PASSED")
        harness = r.harness_status + (f"/{r.harness_exit_status}" if r.harness_exit_status else "")
        table.add_row(e.folder, r.rollout_id, r.outcome if graded else "-", harness, str(e.calls),
                      _tokens(e.prompt_tokens, e.completion_tokens), f"+{r.patch_added}/-{r.patch_removed}",
                      str(failing) if graded else "-", _reason(r) if graded else "")
    return table


def unreported_table(title: str, entries: list[RolloutEntry]) -> Table:
    """Rollouts only a trace store knows: task, harness, status, reward, calls, prefix drift, failure."""
    table = Table(title=title, title_justify="left")
    for column in ("phase", "rollout", "task", "harness", "mode", "status", "reward", "calls", "tokens",
                   "prefix extends", "failure"):
        table.add_column(column, overflow="fold")
    by_store: dict[Path, list[RolloutEntry]] = {}
    for e in entries:
        if e.store is not None and e.rollout is not None:
            by_store.setdefault(e.store, []).append(e)
    for path, group in by_store.items():
        store = open_store(path)
        try:
            for e in group:
                r, drift = e.rollout, store.drift_summary(e.rollout_id)
                assert r is not None
                extends = f"{drift.extending}/{drift.comparable}" if drift.comparable else "-"
                table.add_row(e.phase, r.rollout_id, r.task_id, f"{r.harness}@{r.harness_version}".strip("@"), r.mode,
                              r.status, "-" if r.reward is None else f"{r.reward:g}", str(e.calls),
                              _tokens(e.prompt_tokens, e.completion_tokens), extends, r.failure_reason or "")
        finally:
            store.close()
    return table


def headline(run_dir: Path, entries: list[RolloutEntry]) -> Text:
    counts = Counter(e.outcome for e in entries)
    phases = len({e.phase for e in entries})
    text = (f"{run_dir}\n{len(entries)} rollouts in {phases} phase{'s' * (phases != 1)} · "
            + " · ".join(f"{o} {counts[o]}" for o in OUTCOME_CLASSES if counts[o] or o != "not-graded"))
    metrics_path = run_dir / METRICS_FILE
    if metrics_path.exists():
        metrics = json.loads(metrics_path.read_text())
        if metrics.get("kind") == "eval":
            text += (f"\nPass@1 {100 * metrics['pass_at_1']:.1f}% (strict {100 * metrics['strict_pass_at_1']:.1f}%)"
                     f" on {metrics['n_tasks']} tasks · fingerprint {metrics['fingerprint']}")
    return Text(text, style="bold")


def outcome_tables(run_dir: Path, selected: list[RolloutEntry], selection: Selection) -> list[RenderableType]:
    """One table per outcome present in ``selected``, each cut at ``selection.limit`` rows."""
    parts: list[RenderableType] = []
    for outcome in OUTCOME_CLASSES:
        group = [e for e in selected if e.outcome == outcome]
        if not group:
            continue
        shown = group[: selection.limit] if selection.limit > 0 else group
        style = _STYLES.get(outcome, "")
        title = f"[{style}]{_TITLES.get(outcome, outcome)}[/{style}] ({len(group)})" if style else \
            f"{_TITLES.get(outcome, outcome)} ({len(group)})"
        table = unreported_table if outcome == "no-report" else reported_table
        parts.append(table(title, shown))
        if len(shown) < len(group):
            flags = " ".join([*(f"--phase {p}" for p in selection.phases), f"--outcome {outcome}", "--limit 0"])
            parts.append(Text(f"… {len(group) - len(shown)} more {outcome} not shown: repro inspect {run_dir} {flags}"
                              " (or --phase PHASE to narrow, --limit N for more rows)", style="dim"))
    return parts


def run_overview(run_dir: Path, entries: list[RolloutEntry], selected: list[RolloutEntry],
                 selection: Selection) -> list[RenderableType]:
    """Headline and summary of the whole run, then the selected rollouts' tables."""
    parts: list[RenderableType] = [headline(run_dir, entries), summary_table(entries)]
    if selection.phases or selection.outcomes:
        parts.append(Text(f"selected ({selection.flags()}): {len(selected)} of {len(entries)} rollouts", style="bold"))
    if not selected:
        parts.append(Text("no rollout matches; the summary above lists the phases and outcomes", style="yellow"))
    parts.extend(outcome_tables(run_dir, selected, selection))
    parts.append(Text(f"details: repro inspect {run_dir} <rollout or instance id>; filters: --phase PHASE "
                      f"--outcome {'|'.join(OUTCOME_CLASSES)} --limit N (0: all)", style="dim"))
    return parts


def resolve_target(entries: list[RolloutEntry], target: str) -> list[RolloutEntry]:
    """The entries meant by ``target``: that rollout, or every sample's rollout of that instance (any phase)."""
    exact = [e for e in entries if e.rollout_id == target]
    return exact or [e for e in entries if e.report is not None and e.report.instance_id == target]
