"""The phases and files of a run directory: where its trace stores and its graded samples are.

A run keeps its rollouts in one or more trace stores (``traces.sqlite``: the run's, and one per arm of a
comparison) and its graded samples in phase folders, each with an ``instances/`` folder of reports
(``demos``, ``probe``, ``eval_before``, ``rl/step_003``, ``proxy/eval_after``, or the run dir itself for an
evaluation run). :func:`scan_run` finds both in one walk, down to ``_MAX_DEPTH`` folders below the run and past
the large folders that hold no reports (harness trajectories, policies, checkpoints, trainer state, hidden ones).
`repro inspect` (``repro.report.rollout_index``) and `repro report` (``repro.report.run_data``) both read a run
through it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from repro.evaluation.reports import INSTANCES_DIR

STORE_FILE = "traces.sqlite"
_STEP_FOLDER = re.compile(r"/step_\d+$")
_SKIPPED_DIRS = {"harness", "policy", "checkpoint", "__pycache__"}  # large folders that hold no reports
_MAX_DEPTH = 4


@dataclass(frozen=True)
class RunLayout:
    """What :func:`scan_run` found under ``root``."""

    root: Path
    phases: tuple[Path, ...]  # folders holding an ``instances/`` folder, by the path of that folder
    stores: tuple[Path, ...]  # trace stores, in walk order

    def relative(self, folder: Path) -> str:
        """``folder`` relative to the run (``rl/step_003``); ``.`` for the run itself."""
        return folder.relative_to(self.root).as_posix() if folder != self.root else "."

    def store_for(self, folder: Path) -> Path | None:
        """The nearest trace store at or above ``folder`` (within the run): where a phase's rollouts are."""
        stores = set(self.stores)
        for candidate in (folder, *folder.parents):
            if candidate / STORE_FILE in stores:
                return candidate / STORE_FILE
            if candidate == self.root:
                return None
        return None


def scan_run(run_dir: Path) -> RunLayout:
    """The phase folders and trace stores under ``run_dir``."""
    run_dir = Path(run_dir)
    phases: list[Path] = []
    stores: list[Path] = []
    root_depth = len(run_dir.parts)
    for current, dirnames, filenames in os.walk(run_dir):
        here = Path(current)
        if INSTANCES_DIR in dirnames:
            phases.append(here)
        if STORE_FILE in filenames:
            stores.append(here / STORE_FILE)
        deeper = len(here.parts) - root_depth < _MAX_DEPTH
        dirnames[:] = sorted(d for d in dirnames if deeper and d != INSTANCES_DIR and d not in _SKIPPED_DIRS
                             and not d.startswith(".") and not d.endswith(".trainer"))
    return RunLayout(run_dir, tuple(sorted(phases, key=lambda p: p / INSTANCES_DIR)), tuple(stores))


def phase_of(folder: str) -> str:
    """``rl/step_003`` -> ``rl``, ``validation/step_010`` -> ``validation``; other folders stay as they are."""
    return _STEP_FOLDER.sub("", folder) if "/" in folder else folder
