"""``preds.json`` in SWE-bench's prediction format, so a run's patches can be graded by SWE-bench itself.

The file is a JSON list of ``{"instance_id", "model_name_or_path", "model_patch"}`` (what
``swebench.harness.utils.get_predictions_from_file`` reads in swebench 4.1.0, and mini-SWE-agent writes). One
prediction per instance: ``preds.json`` holds sample 0; with k > 1 samples per task, sample i > 0 goes to
``preds-sample<i>.json`` (each file is a complete SWE-bench predictions file). Updates are read-modify-write
under an inter-process lock and land atomically, so concurrent workers never lose or tear an entry.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from repro.common.files import atomic_write_text, file_lock
from repro.evaluation.reports import InstanceReport, read_patch

PREDS_FILE = "preds.json"


def preds_path(run_dir: Path, sample: int = 0) -> Path:
    return Path(run_dir) / (PREDS_FILE if sample == 0 else f"preds-sample{sample}.json")


def prediction(instance_id: str, model_name: str, patch: str) -> dict[str, str]:
    """One SWE-bench prediction (``model_name_or_path`` becomes a log folder name there; '/' is allowed)."""
    return {"instance_id": instance_id, "model_name_or_path": model_name, "model_patch": patch}


def load_preds(path: Path) -> list[dict[str, Any]]:
    """The predictions in ``path`` ([] when absent)."""
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    if not isinstance(data, list):
        raise ValueError(f"{path} must hold a JSON list of predictions")
    return data


def _store(path: Path, entries: dict[str, dict[str, str]]) -> None:
    atomic_write_text(path, json.dumps([entries[k] for k in sorted(entries)], indent=2))


def update_preds(run_dir: Path, instance_id: str, model_name: str, patch: str, sample: int = 0) -> Path:
    """Insert or replace one instance's prediction (safe across threads and processes)."""
    path = preds_path(run_dir, sample)
    with file_lock(path):
        entries = {p["instance_id"]: p for p in load_preds(path)}
        entries[instance_id] = prediction(instance_id, model_name, patch)
        _store(path, entries)
    return path


def write_preds(run_dir: Path, reports: list[InstanceReport], model_name: str) -> list[Path]:
    """Rebuild every predictions file from the reports and their saved patches (idempotent)."""
    by_sample: dict[int, dict[str, dict[str, str]]] = {}
    for r in reports:
        patch = read_patch(run_dir, r.instance_id, r.sample)
        by_sample.setdefault(r.sample, {})[r.instance_id] = prediction(r.instance_id, model_name, patch)
    written = []
    for sample, entries in sorted(by_sample.items()):
        path = preds_path(run_dir, sample)
        with file_lock(path):
            _store(path, entries)
        written.append(path)
    return written
