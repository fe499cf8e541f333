"""What `repro report` reads from run directories: metrics.json, config.yaml, overrides.txt, rl/diagnostics.jsonl,
and every graded sample (``<phase>/instances/<id>/sample-<i>/report.json``) with the trace store holding its calls.

A run directory's phases are the folders that hold an ``instances/`` folder, as ``repro.report.run_layout`` finds
them: the run itself (an evaluation), ``eval_before`` / ``eval_after`` / ``rl/step_000`` / ``demos`` (the miniature,
an RL run), an arm's folders (a loop comparison); each phase's calls are in the nearest trace store at or above it. A
sweep directory (``<time>/`` of ``repro run -m``) stands for its jobs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.evaluation.metrics import is_infra_failure
from repro.evaluation.reports import INSTANCES_DIR, REPORT_FILE, InstanceReport
from repro.evaluation.summary import METRICS_FILE
from repro.report.run_layout import STORE_FILE, scan_run
from repro.report.run_records import with_run_files
from repro.store import RolloutRecord, open_store

DIAGNOSTICS_FILE = "rl/diagnostics.jsonl"
SOLVED, FAILED, INFRA, UNGRADED = "solved", "failed", "infra", "ungraded"


@dataclass(eq=False)  # hashed by identity
class Sample:
    """One graded (or, for demonstrations, recorded) sample of a run, and where its calls are."""

    run: str  # the run's label
    phase: str  # the folder holding its instances/ (relative to the run; "." for an evaluation run)
    report: InstanceReport
    store: Path | None  # the traces.sqlite with its calls
    folder: Path  # its report.json and patch.diff
    mode: str = ""  # the rollout's mode in the store (eval / train / demo)

    @property
    def category(self) -> str:
        """solved / failed (graded, not resolved) / infra (infrastructure failure) / ungraded (demonstration)."""
        if self.mode == "demo":
            return UNGRADED
        if is_infra_failure(self.report):
            return INFRA
        return SOLVED if self.report.outcome == "resolved" else FAILED

    @property
    def where(self) -> str:
        phase = "" if self.phase == "." else f" · {self.phase}"
        return f"{self.run}{phase} · sample {self.report.sample}"


@dataclass
class Run:
    """A run directory and what it holds."""

    path: Path
    label: str
    metrics: dict[str, Any] | None
    config_text: str = ""
    overrides: list[str] = field(default_factory=list)
    diagnostics: list[dict[str, Any]] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return (self.metrics or {}).get("kind", "unfinished")

    @property
    def fingerprint(self) -> str | None:
        return (self.metrics or {}).get("fingerprint")

    @property
    def spec(self) -> dict[str, Any] | None:
        """The frozen evaluation spec (an eval run's, or the held-out evaluation's of a before/after run)."""
        metrics = self.metrics or {}
        return metrics.get("spec") or (metrics.get("before") or {}).get("spec")


def is_run_dir(path: Path) -> bool:
    return any((path / name).exists() for name in (METRICS_FILE, "config.yaml", STORE_FILE))


def expand(paths: list[Path]) -> list[Path]:
    """Run directories: each path that is one, else the run directories just under it (a sweep's jobs)."""
    out = []
    for path in paths:
        if not path.is_dir():
            raise SystemExit(f"{path} is not a directory: pass run directories (outputs/<experiment>/<time>)")
        jobs = [] if is_run_dir(path) else sorted((p for p in path.iterdir() if p.is_dir() and is_run_dir(p)),
                                                  key=lambda p: (len(p.name), p.name))
        if not is_run_dir(path) and not jobs:
            raise SystemExit(f"{path} holds no run (no metrics.json, config.yaml or traces.sqlite)")
        out += jobs or [path]
    return out


def run_label(path: Path) -> str:
    """``<experiment>/<time>`` or, for a sweep's job, ``<experiment>/<time>/<job>``."""
    parts = path.resolve().parts
    return "/".join(parts[-3:] if path.name.isdigit() else parts[-2:])


def load_run(path: Path) -> Run:
    metrics_path = path / METRICS_FILE
    metrics = with_run_files(json.loads(metrics_path.read_text()), path) if metrics_path.exists() else None
    if metrics is not None:
        metrics["run_dir"] = str(path)
    config = path / "config.yaml"
    overrides = path / "overrides.txt"
    diagnostics = path / DIAGNOSTICS_FILE
    return Run(path, run_label(path), metrics, config.read_text() if config.exists() else "",
               [line for line in overrides.read_text().splitlines() if line.strip()] if overrides.exists() else [],
               [json.loads(line) for line in diagnostics.read_text().splitlines() if line.strip()]
               if diagnostics.exists() else [])


def _modes(store: Path | None) -> dict[str, RolloutRecord]:
    if store is None:
        return {}
    opened = open_store(store)
    try:
        return {r.rollout_id: r for r in opened.list_rollouts()}
    finally:
        opened.close()


def samples_of(run: Run) -> list[Sample]:
    """Every sample report of ``run``, by phase, instance and sample."""
    out: list[Sample] = []
    rollouts: dict[Path | None, dict[str, RolloutRecord]] = {}
    layout = scan_run(run.path)
    for phase_dir in layout.phases:
        store = layout.store_for(phase_dir)
        if store not in rollouts:
            rollouts[store] = _modes(store)
        for path in sorted((phase_dir / INSTANCES_DIR).glob(f"*/sample-*/{REPORT_FILE}")):
            report = InstanceReport.from_dict(json.loads(path.read_text()))
            record = rollouts[store].get(report.rollout_id)
            out.append(Sample(run.label, layout.relative(phase_dir), report, store, path.parent,
                              record.mode if record else ""))
    return out
