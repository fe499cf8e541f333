"""Run records: the few KB of a run that its published tables are built from, kept after the run directory is gone.

A run directory is big (``traces.sqlite``, checkpoints) and stays on the machine that made it. Its record is one
JSON file, ``record.json``: the run's ``metrics.json`` (less the copies of per-task data listed in ``pruned``), the
resolved config (credentials already redacted), the overrides, ``manifest.json``, the eval fingerprint, the machine
it ran on (CPU model, cores, ISA flags, kernel, Python) and, for a run that failed, its ``error.json`` (no
traceback). No path in it is absolute: paths under the repository (the working directory), under the folder that
holds the outputs root, or under the home directory are written relative to them (``~/`` for home).

A run writes its record into its run directory when it finishes or fails (``repro.cli.runner``); `repro table` builds
the same record from every run directory under ``outputs/`` and copies it to ``results/runs/<experiment>/<run-id>/``
(``<run-id>``: the run directory's path under ``<experiment>/``, ``/`` read as ``-``, e.g. ``20261201-153837-0``),
then builds every table from the records there alone (``repro.report.tables``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import platform
import tempfile
from pathlib import Path
from typing import Any

import yaml

from repro.common.accounting import cpu_model
from repro.common.files import atomic_write_text
from repro.common.secrets import REDACTED, without_secrets
from repro.evaluation.summary import METRICS_FILE
from repro.report.record_codec import compact, expand

RECORD_FILE = "record.json"
RECORD_VERSION = 1
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16")  # what decides the CPU kernels torch runs (SFT speed, bf16)
ERROR_FILE = "error.json"  # what a run that failed after it started working leaves (``repro.cli.runner``)


def cpu_flags(names: tuple[str, ...] = ISA_FLAGS) -> dict[str, bool | None]:
    """Which of ``names`` the CPU reports (``/proc/cpuinfo``; None each where it cannot be read)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                present = set(line.split(":", 1)[1].split())
                return {name: name in present for name in names}
    return dict.fromkeys(names)


def machine() -> dict[str, Any]:
    """The machine a run ran on: what its speed (and a CPU kernel's numerics) depends on."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        usable = os.cpu_count() or 0
    return {"cpu_model": cpu_model(), "cpu_cores": os.cpu_count() or 0, "cpu_cores_usable": usable,
            "arch": platform.machine(), "isa": cpu_flags(), "kernel_release": platform.release(),
            "kernel_version": platform.version(), "python": platform.python_version()}


def _machine_of(manifest: dict[str, Any], metrics: dict[str, Any] | None) -> dict[str, Any]:
    """The machine a run recorded in its manifest; for a run made before manifests held it, what the manifest
    and the metrics' hardware still say (ISA flags unknown)."""
    if "machine" in manifest:
        return manifest["machine"]
    hardware = ((metrics or {}).get("compute") or {}).get("hardware") or {}
    return {"cpu_model": hardware.get("cpu_model", manifest.get("cpu")), "cpu_cores": manifest.get("cpu_count"),
            "platform": manifest.get("platform"), "isa": dict.fromkeys(ISA_FLAGS), "python": manifest.get("python")}


def prune(metrics: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``metrics`` less the per-task copies no table reads: inside a run's nested evaluations (``before``,
    ``after``, arms) ``per_task`` (the run keeps ``per_instance``) and ``spec.tasks.instance_ids`` (the
    fingerprint names them). A top-level evaluation keeps both (its table checks the spec's fingerprint)."""
    pruned: list[str] = []

    def walk(node: Any, path: str) -> None:
        if not isinstance(node, dict):
            return
        if path and node.get("kind") == "eval":
            if node.pop("per_task", None) is not None:
                pruned.append(f"{path}.per_task")
            tasks = (node.get("spec") or {}).get("tasks") or {}
            if tasks.pop("instance_ids", None) is not None:
                pruned.append(f"{path}.spec.tasks.instance_ids")
        for key, value in node.items():
            walk(value, f"{path}.{key}" if path else key)

    metrics = copy.deepcopy(metrics)
    walk(metrics, "")
    return metrics, pruned


def path_roots(outputs: Path | None = None) -> list[tuple[str, str]]:
    """(absolute prefix, what replaces it) for the paths a record may name, longest first: the repository (the
    working directory) and the folder holding ``outputs`` become relative, the home directory ``~``, the temporary
    directory ``$TMPDIR`` (sandbox workspaces show up in recorded prompts)."""
    roots = [(Path(tempfile.gettempdir()), "$TMPDIR/"), (Path.cwd(), ""), (Path.home(), "~/")]
    if outputs is not None:
        roots.append((Path(outputs).resolve().parent, ""))
    prefixes = {str(p.resolve()).rstrip("/") + "/": new for p, new in reversed(roots) if str(p.resolve()) != "/"}
    return sorted(prefixes.items(), key=lambda item: -len(item[0]))


def relative_paths(value: Any, roots: list[tuple[str, str]]) -> Any:
    """``value`` (JSON-like) with every string's absolute prefixes in ``roots`` replaced (``/repo/outputs/x`` ->
    ``outputs/x``), so a record names no path of the machine it was made on."""
    if isinstance(value, dict):
        return {k: relative_paths(v, roots) for k, v in value.items()}
    if isinstance(value, list):
        return [relative_paths(v, roots) for v in value]
    if isinstance(value, str) and "/" in value:
        for prefix, new in roots:
            value = (new.rstrip("/") or ".") if value == prefix.rstrip("/") else value.replace(prefix, new)
    return value


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise SystemExit(f"{path} is not valid JSON ({exc}); delete or fix that run") from None


def run_files(run_dir: Path) -> tuple[list[str] | None, dict[str, Any] | None]:
    """The run's overrides (``overrides.txt``, one a line) and resolved config (``config.yaml``); None for a file
    the run directory does not hold."""
    overrides, config = run_dir / "overrides.txt", run_dir / "config.yaml"
    return ([line for line in overrides.read_text().splitlines() if line.strip()] if overrides.exists() else None,
            yaml.safe_load(config.read_text()) if config.exists() else None)


def repo_relative(path: str) -> str:
    """``path`` relative to the working directory (the repository) when it lies under it: published tables never
    name a machine's absolute paths (a Hydra multirun records its job directories absolute)."""
    candidate = Path(path)
    if not candidate.is_absolute():
        return path
    try:
        return str(candidate.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path


def with_run_files(metrics: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """``metrics`` (a run's metrics.json) with its ``run_dir`` (repository-relative), ``overrides`` (overrides.txt),
    ``run_config`` (the resolved config.yaml) and the manifest's ``git_sha`` when the run directory holds them:
    what the row builders read (as :func:`table_input` gives them from a record)."""
    metrics["run_dir"] = repo_relative(metrics.get("run_dir") or str(run_dir))
    overrides, config = run_files(run_dir)
    if overrides is not None:
        metrics["overrides"] = overrides
    if config is not None:
        metrics["run_config"] = config
    git_sha = (_read_json(run_dir / "manifest.json") or {}).get("git_sha")
    if git_sha:
        metrics.setdefault("git_sha", git_sha)
    return metrics


def build_record(run_dir: Path, outputs: Path | None = None) -> dict[str, Any] | None:
    """The record of the run in ``run_dir`` (``outputs``: the root its table reads runs from); None for a run
    that has neither finished (``metrics.json``) nor failed (``error.json``)."""
    metrics, error = _read_json(run_dir / METRICS_FILE), _read_json(run_dir / ERROR_FILE)
    if metrics is None and error is None:
        return None
    manifest = _read_json(run_dir / "manifest.json") or {}
    overrides, config = run_files(run_dir)
    pruned: list[str] = []
    if metrics is not None:
        metrics, pruned = prune(metrics)
        if "run_dir" in metrics:  # where the run was made, which may name another machine's or a moved folder
            metrics["run_dir"] = str(run_dir.resolve())
    record = {
        "record_version": RECORD_VERSION,
        "run_dir": str(run_dir.resolve()),
        "fingerprint": (metrics or {}).get("fingerprint"),
        "machine": _machine_of(manifest, metrics),
        "manifest": {k: v for k, v in manifest.items() if k != "machine"},
        "overrides": overrides,
        "config": config,
        "metrics": metrics,
        "error": None if metrics is not None or error is None else {k: v for k, v in error.items() if k != "traceback"},
        "pruned": pruned,
    }
    return without_secrets(relative_paths(record, path_roots(outputs)), replacement=REDACTED)


def record_text(record: dict[str, Any]) -> str:
    """The record's file: JSON, one value a line (keys in the order the run wrote them), per-instance tables in
    their compact form (:mod:`repro.report.record_codec`)."""
    return json.dumps(compact(record), indent=1, ensure_ascii=False) + "\n"


def write_if_changed(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` unless it already holds it (an unchanged record keeps its time)."""
    if path.exists() and path.read_text() == text:
        return False
    atomic_write_text(path, text)
    return True


def write_record(run_dir: Path, outputs: Path | None = None) -> Path | None:
    """Write ``run_dir/record.json`` (the run finished or failed); returns it, None for a run that did neither."""
    record = build_record(run_dir, outputs)
    if record is None:
        return None
    path = run_dir / RECORD_FILE
    write_if_changed(path, record_text(record))
    return path


def record_id(run_dir: Path, outputs: Path) -> str:
    """``<experiment>/<run-id>`` of a run under ``outputs``: its first folder, then the rest joined by ``-``
    (``mini_repro/20261201-153837/0`` -> ``mini_repro/20261201-153837-0``)."""
    parts = run_dir.resolve().relative_to(outputs.resolve()).parts or (run_dir.name,)
    return f"{parts[0]}/{'-'.join(parts[1:])}" if len(parts) > 1 else f"_/{parts[0]}"


def records_of_outputs(outputs: Path) -> dict[str, dict[str, Any]]:
    """The record of every run under ``outputs`` that finished or failed, by record id."""
    run_dirs = {p.parent for name in (METRICS_FILE, ERROR_FILE) for p in outputs.rglob(name)} if outputs.exists() \
        else set()
    found = {record_id(d, outputs): build_record(d, outputs) for d in sorted(run_dirs)}
    return {k: v for k, v in found.items() if v is not None}


def read_records(root: Path) -> dict[str, dict[str, Any]]:
    """The records under ``root`` (``<experiment>/<run-id>/record.json``), by record id."""
    found = {}
    for path in sorted(root.glob(f"*/*/{RECORD_FILE}")):
        record = _read_json(path)
        found[f"{path.parent.parent.name}/{path.parent.name}"] = expand(record) if record is not None else None
    return found


def publish(records: dict[str, dict[str, Any]], root: Path) -> list[Path]:
    """Copy ``records`` to ``root/<id>/record.json`` (the same id replaces its older copy); returns the files
    that changed."""
    changed = []
    for rid, record in sorted(records.items()):
        path = root / rid / RECORD_FILE
        if write_if_changed(path, record_text(record)):
            changed.append(path)
    return changed


def table_input(record: dict[str, Any]) -> dict[str, Any]:
    """What a table's row builder reads of a finished run: its metrics with ``run_dir``, ``overrides``,
    ``run_config`` and the manifest's ``git_sha`` (the last three only where the run had them), as a fresh copy."""
    metrics = copy.deepcopy(record["metrics"])
    metrics["run_dir"] = record["run_dir"]
    if record.get("overrides") is not None:
        metrics["overrides"] = list(record["overrides"])
    if record.get("config") is not None:
        metrics["run_config"] = copy.deepcopy(record["config"])
    if (record.get("manifest") or {}).get("git_sha"):
        metrics.setdefault("git_sha", record["manifest"]["git_sha"])
    return metrics


def failure_input(record: dict[str, Any]) -> dict[str, Any]:
    """What the "Runs that did not finish" section reads of a failed run."""
    return {**copy.deepcopy(record["error"]), "run_dir": record["run_dir"]}
