"""Load SWE-bench-style task rows from local files (JSON, JSONL, parquet, arrow, ``save_to_disk`` folders,
downloaded hub snapshots) and name hub datasets by a local path convention (this machine has no hub).

SWE-smith rows (an ``image_name``, no ``base_commit``) are mapped onto SWE-bench's field meanings by
:mod:`repro.tasks.swesmith`. Errors name the file, the line or row, the field, and how to fix it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from repro.common.files import cache_dir
from repro.tasks.schema import Task
from repro.tasks.swesmith import is_swesmith_row, swesmith_row

REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement")
TEST_LISTS = ("FAIL_TO_PASS", "PASS_TO_PASS")
ROW_FILES = (".jsonl", ".json", ".parquet", ".arrow")
HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class TaskSourceError(ValueError):
    """A task source that cannot be read: the message says which file, row and field, and what to do."""


def datasets_dir() -> Path:
    """Where hub datasets are looked for locally: ``$REPRO_DATA_DIR`` or ``<cache>/datasets``."""
    return Path(os.environ.get("REPRO_DATA_DIR") or cache_dir() / "datasets")


def hub_local_path(name: str) -> Path:
    """The local path convention for hub dataset ``owner/name``: ``<datasets_dir>/owner__name``."""
    return datasets_dir() / name.replace("/", "__")


def _hub_error(name: str, split: str | None) -> TaskSourceError:
    local = hub_local_path(name)
    split_ = split or "test"
    return TaskSourceError(
        f"{name!r} is not a local path and no dataset hub is reachable from here (offline). Put the dataset at "
        f"{local} (a folder of parquet/JSONL files or a save_to_disk folder) or at {local}.jsonl, or pass any "
        f"local path. On a connected machine: python -c \"from datasets import load_dataset; "
        f"load_dataset('{name}', split='{split_}').to_json('{local.name}.jsonl')\" and copy the file over. "
        f"To let this machine try the hub itself, set REPRO_ALLOW_HUB=1."
    )


def row_to_task(row: dict[str, Any], where: str) -> Task:
    """A Task from one row; ``where`` (``file:line``) prefixes every error."""
    if not isinstance(row, dict):
        raise TaskSourceError(f"{where}: a task row must be a JSON object, got {type(row).__name__}")
    if is_swesmith_row(row) and isinstance(row.get("instance_id"), str) and row["instance_id"]:
        row = swesmith_row(row)  # SWE-smith's schema: the instance branch is the base, the fix is the reverse patch
    for key in REQUIRED:
        if not isinstance(row.get(key), str) or not row.get(key):
            raise TaskSourceError(f"{where}: field {key!r} is missing or empty (row {row.get('instance_id', '?')!r});"
                                  f" every task row needs {list(REQUIRED)}")
    row = dict(row)
    for key in TEST_LISTS:
        value = row.get(key, [])
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else []
            except json.JSONDecodeError as exc:
                raise TaskSourceError(f"{where}: field {key!r} is not a JSON list of test ids: {exc}") from exc
        if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
            raise TaskSourceError(f"{where}: field {key!r} must be a list of test ids (or its JSON string)")
        row[key] = value
    return Task.from_row(row)


def _jsonl_rows(path: Path) -> Iterator[tuple[dict[str, Any], str]]:
    with path.open() as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield json.loads(line), f"{path}:{number}"
            except json.JSONDecodeError as exc:
                raise TaskSourceError(f"{path}:{number}: not valid JSON ({exc.msg} at column {exc.colno}); "
                                      f"a JSONL file holds one task object per line") from exc


def _json_rows(path: Path) -> Iterator[tuple[dict[str, Any], str]]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise TaskSourceError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg}); if it holds one object per "
                              f"line, name it .jsonl") from exc
    if isinstance(data, dict):
        data = data.get("data", data.get("rows", [data] if "instance_id" in data else None))
    if not isinstance(data, list):
        raise TaskSourceError(f"{path}: expected a JSON list of task objects")
    for index, row in enumerate(data):
        yield row, f"{path}: row {index}"


def _arrow_rows(path: Path) -> Iterator[tuple[dict[str, Any], str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.suffix == ".parquet":
        table = pq.read_table(path)
    else:
        with pa.memory_map(str(path)) as source:
            try:
                table = pa.ipc.open_stream(source).read_all()
            except pa.ArrowInvalid:
                table = pa.ipc.open_file(source).read_all()
    for index, row in enumerate(table.to_pylist()):
        yield row, f"{path}: row {index}"


def _file_rows(path: Path) -> Iterator[tuple[dict[str, Any], str]]:
    if path.suffix == ".jsonl":
        return _jsonl_rows(path)
    if path.suffix == ".json":
        return _json_rows(path)
    if path.suffix in (".parquet", ".arrow"):
        return _arrow_rows(path)
    raise TaskSourceError(f"{path}: unknown task file type {path.suffix!r}; use one of {list(ROW_FILES)}")


def _dir_rows(path: Path, split: str | None) -> Iterator[tuple[dict[str, Any], str]]:
    """A ``save_to_disk`` folder, or a folder of row files (e.g. a hub snapshot's ``data/test-*.parquet``)."""
    if (path / "dataset_dict.json").exists() or (path / "state.json").exists():
        return _saved_rows(path, split)
    files = sorted(p for p in path.rglob("*") if p.suffix in ROW_FILES and p.is_file())
    if split is not None:
        files = [p for p in files if p.name.startswith(split) or p.parent.name == split]
    if not files:
        raise TaskSourceError(f"{path}: no task files{f' for split {split!r}' if split else ''} "
                              f"({', '.join(ROW_FILES)}) in this folder")
    return (item for file in files for item in _file_rows(file))


def _saved_rows(path: Path, split: str | None) -> Iterator[tuple[dict[str, Any], str]]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets

    data = datasets.load_from_disk(str(path))
    if isinstance(data, datasets.DatasetDict):
        if split is None and len(data) == 1:
            split = next(iter(data))
        if split not in data:
            raise TaskSourceError(f"{path}: choose a split from {sorted(data)} (got {split!r})")
        data = data[split]
    return ((row, f"{path}: row {index}") for index, row in enumerate(data))


def _hub_rows(name: str, split: str | None) -> Iterator[tuple[dict[str, Any], str]]:
    import datasets

    data = datasets.load_dataset(name, split=split or "test")
    return ((row, f"{name}[{split or 'test'}]: row {index}") for index, row in enumerate(data))


def _rows(source: str, split: str | None) -> Iterator[tuple[dict[str, Any], str]]:
    path = Path(source).expanduser()
    if path.is_dir():
        return _dir_rows(path, split)
    if path.is_file():
        return _file_rows(path)
    if HUB_NAME.match(source) and not path.suffix:
        local = hub_local_path(source)
        for candidate in (local, local.with_name(local.name + ".jsonl"), local.with_name(local.name + ".parquet")):
            if candidate.exists():
                return _rows(str(candidate), split)
        if os.environ.get("REPRO_ALLOW_HUB") == "1":
            return _hub_rows(source, split)
        raise _hub_error(source, split)
    raise TaskSourceError(f"task file {path} does not exist; pass an existing JSON/JSONL/parquet file or folder "
                          f"(export bundled tasks with `repro tasks build --out {path.name or 'tasks.jsonl'}`)")


def load_tasks(source: str, split: str | None = None, instance_ids: Iterable[str] | None = None) -> list[Task]:
    """Tasks from a local file or folder, or a hub name (``owner/name``, resolved by :func:`hub_local_path`).

    ``split`` picks a split of a dataset folder (file names starting with it, or a DatasetDict key);
    ``instance_ids`` keeps those tasks (in file order) and fails if any is absent.
    """
    tasks: list[Task] = []
    seen: dict[str, str] = {}
    for row, where in _rows(source, split):
        task = row_to_task(row, where)
        if task.instance_id in seen:
            first = seen[task.instance_id]
            raise TaskSourceError(f"{where}: duplicate instance_id {task.instance_id!r} (first at {first})")
        seen[task.instance_id] = where
        tasks.append(task)
    if instance_ids is not None:
        wanted = list(instance_ids)
        missing = [i for i in wanted if i not in seen]
        if missing:
            more = " ..." if len(missing) > 10 else ""
            raise TaskSourceError(f"{source}: instance ids not found: {missing[:10]}{more}")
        keep = set(wanted)
        tasks = [t for t in tasks if t.instance_id in keep]
    return tasks


def write_tasks(tasks: Iterable[Task], path: Path) -> Path:
    """Write tasks as JSONL (one ``Task.to_row()`` per line; test lists as JSON lists)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        for task in tasks:
            handle.write(json.dumps(task.to_row(), sort_keys=True) + "\n")
    return path


def data_sha256(tasks: Iterable[Task]) -> str:
    """A stable hash of the task rows, independent of their order and of where repositories sit on disk
    (``repo_path`` is left out), for evaluation fingerprints."""
    rows = []
    for task in tasks:
        row = task.to_row()
        row.pop("repo_path", None)
        rows.append(json.dumps(row, sort_keys=True, separators=(",", ":"), default=str))
    digest = hashlib.sha256()
    for line in sorted(rows):
        digest.update(line.encode() + b"\n")
    return digest.hexdigest()
