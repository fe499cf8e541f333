"""Every rollout a run directory holds, one entry each: its phase, rollout mode, outcome class and cost.

The run's trace stores and phase folders are what ``repro.report.run_layout`` finds. An entry's **phase** is its
report's folder relative to the run, RL and validation step folders folded into their parent (``rl/step_003`` ->
``rl``); a rollout without a report takes the folder of its store. Its **outcome** is one of
:data:`OUTCOME_CLASSES`: infrastructure failures (grader error or timeout, or a crashed harness:
``repro.evaluation.metrics``) are kept apart from unresolved samples, and demonstrations (not graded) apart from
both.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from repro.evaluation.reports import NOT_GRADED_REASON, InstanceReport, read_reports
from repro.report.run_layout import phase_of, scan_run
from repro.store import RolloutRecord, open_store

OUTCOME_CLASSES = ("resolved", "unresolved", "infra-failure", "not-graded", "no-report")


@dataclass(frozen=True)
class RolloutEntry:
    """One rollout of a run, as the summary and the filters of ``repro inspect`` see it."""

    rollout_id: str
    phase: str  # folder of its report (step folders folded) or of its store, relative to the run; "." = the run
    folder: str  # the report's own folder ("rl/step_003"), or the store's
    mode: str  # the store's rollout mode (demo / probe / train / eval); "-" when no store has it
    outcome: str  # one of OUTCOME_CLASSES
    calls: int
    prompt_tokens: int
    completion_tokens: int
    started: float
    store: Path | None
    report: InstanceReport | None = None
    rollout: RolloutRecord | None = None


def outcome_class(report: InstanceReport | None) -> str:
    """The summary's outcome of a rollout with this report (``None``: no report)."""
    if report is None:
        return "no-report"
    if report.reason == NOT_GRADED_REASON:
        return "not-graded"
    if report.infra_failure:
        return "infra-failure"
    return report.outcome


def _store_rollouts(stores: Iterable[Path]) -> dict[str, tuple[RolloutRecord, tuple[int, int, int], Path]]:
    """rollout id -> (its record, (calls, prompt tokens, completion tokens), its store)."""
    found: dict[str, tuple[RolloutRecord, tuple[int, int, int], Path]] = {}
    for path in stores:
        store = open_store(path)
        try:
            usage = store.usage_by_rollout()
            for record in store.list_rollouts():
                found.setdefault(record.rollout_id, (record, usage.get(record.rollout_id, (0, 0, 0)), path))
        finally:
            store.close()
    return found


def index_run(run_dir: Path, stores: list[Path] | None = None) -> list[RolloutEntry]:
    """Every rollout of the run (reported, or only in a store), ordered by phase (the phase that started first
    comes first), then by start time. ``stores``: the trace stores to read (default: every one under the run)."""
    layout = scan_run(Path(run_dir))
    in_stores = _store_rollouts(layout.stores if stores is None else stores)
    entries: list[RolloutEntry] = []
    reported: set[str] = set()
    for folder in layout.phases:
        rel = layout.relative(folder)
        for report in read_reports(folder):
            reported.add(report.rollout_id)
            record, usage, store = in_stores.get(report.rollout_id, (None, None, None))
            calls, prompt, completion = usage or (report.n_calls, report.prompt_tokens, report.completion_tokens)
            entries.append(RolloutEntry(report.rollout_id, phase_of(rel), rel, record.mode if record else "-",
                                        outcome_class(report), calls, prompt, completion,
                                        report.started_at or (record.created_at if record else 0.0), store, report,
                                        record))
    for rollout_id, (record, (calls, prompt, completion), store) in in_stores.items():
        if rollout_id not in reported:
            rel = layout.relative(store.parent) if store.parent.is_relative_to(layout.root) else "."
            entries.append(RolloutEntry(rollout_id, rel, rel, record.mode, "no-report", calls, prompt, completion,
                                        record.created_at, store, None, record))
    first: dict[str, float] = {}
    for e in entries:
        first[e.phase] = min(first.get(e.phase, e.started), e.started)
    return sorted(entries, key=lambda e: (first[e.phase], e.phase, e.started, e.rollout_id))


def _split(values: Iterable[str] | None) -> list[str]:
    return [v.strip() for value in values or () for v in value.split(",") if v.strip()]


def phase_matches(entry: RolloutEntry, wanted: str) -> bool:
    """``rl`` matches ``rl`` and every arm's ``<arm>/rl``; ``proxy`` matches ``proxy/...``; a step folder
    (``rl/step_003``) matches that step only."""
    wanted = wanted.strip("/")
    return any(name == wanted or name.startswith(wanted + "/") or name.endswith("/" + wanted)
               for name in (entry.phase, entry.folder))


def select(entries: list[RolloutEntry], phases: Iterable[str] | None = None,
           outcomes: Iterable[str] | None = None) -> list[RolloutEntry]:
    """The entries of any of ``phases`` and any of ``outcomes`` (comma-separated lists allowed; none: all)."""
    wanted_phases = _split(phases)
    wanted_outcomes = [o.replace("_", "-") for o in _split(outcomes)]
    unknown = [o for o in wanted_outcomes if o not in OUTCOME_CLASSES]
    if unknown:
        raise SystemExit(f"unknown outcome {', '.join(unknown)}: choose from {', '.join(OUTCOME_CLASSES)}")
    return [e for e in entries
            if (not wanted_phases or any(phase_matches(e, p) for p in wanted_phases))
            and (not wanted_outcomes or e.outcome in wanted_outcomes)]
