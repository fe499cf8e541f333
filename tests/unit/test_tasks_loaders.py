"""Task loaders: local JSON / JSONL / parquet / save_to_disk sources, hub names offline, clear errors."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from repro.tasks.loaders import TaskSourceError, data_sha256, hub_local_path, load_tasks, write_tasks
from repro.tasks.schema import Task

SWE_ROW = {
    "repo": "astropy/astropy",
    "instance_id": "astropy__astropy-12907",
    "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607",
    "patch": "diff --git a/astropy/modeling/separable.py b/astropy/modeling/separable.py\n",
    "test_patch": "diff --git a/astropy/modeling/tests/test_separable.py b/astropy/modeling/tests/test_separable.py\n",
    "problem_statement": "Modeling's `separability_matrix` does not compute separability correctly for nested models",
    "hints_text": "",
    "created_at": "2022-03-03T15:14:54Z",
    "version": "4.3",
    "FAIL_TO_PASS": '["astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]"]',
    "PASS_TO_PASS": '["astropy/modeling/tests/test_separable.py::test_coord_matrix", '
                    '"astropy/modeling/tests/test_separable.py::test_cdot"]',
    "environment_setup_commit": "298ccb478e6bf092953bca67a3d29dc6c35f6752",
    "difficulty": "15 min - 1 hour",
}


def tasks() -> list[Task]:
    return [Task(f"o__r-{i}", "o/r", f"{i:040d}", f"bug {i}", patch="p", FAIL_TO_PASS=[f"t.py::test_{i}"],
                 PASS_TO_PASS=["t.py::test_ok"], family="procedural", extra={"function_key": f"k{i}"})
            for i in range(3)]


def write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_round_trip(tmp_path: Path):
    path = write_tasks(tasks(), tmp_path / "tasks.jsonl")
    assert load_tasks(str(path)) == tasks()


def test_json_list_round_trip(tmp_path: Path):
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps([t.to_row() for t in tasks()], indent=1))
    assert load_tasks(str(path)) == tasks()


def test_swe_bench_rows_with_json_string_test_lists(tmp_path: Path):
    (task,) = load_tasks(str(write_jsonl(tmp_path / "verified.jsonl", [SWE_ROW])))
    assert task.FAIL_TO_PASS == ["astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]"]
    assert len(task.PASS_TO_PASS) == 2 and task.version == "4.3" and task.repo == "astropy/astropy"
    assert task.repo_path is None and task.difficulty == "15 min - 1 hour"


def test_parquet_file_and_hub_snapshot_folder(tmp_path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "snapshot" / "data"
    data.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([SWE_ROW]), data / "test-00000-of-00001.parquet")
    other = dict(SWE_ROW, instance_id="astropy__astropy-1")
    pq.write_table(pa.Table.from_pylist([other]), data / "train-00000-of-00001.parquet")
    assert [t.instance_id for t in load_tasks(str(data / "test-00000-of-00001.parquet"))] == [SWE_ROW["instance_id"]]
    assert [t.instance_id for t in load_tasks(str(tmp_path / "snapshot"), split="test")] == [SWE_ROW["instance_id"]]
    assert len(load_tasks(str(tmp_path / "snapshot"))) == 2


def test_save_to_disk_folder(tmp_path: Path):
    datasets = pytest.importorskip("datasets")
    datasets.DatasetDict({"test": datasets.Dataset.from_list([SWE_ROW])}).save_to_disk(str(tmp_path / "saved"))
    (task,) = load_tasks(str(tmp_path / "saved"))
    assert task.instance_id == SWE_ROW["instance_id"] and len(task.PASS_TO_PASS) == 2


def test_instance_ids_filter(tmp_path: Path):
    path = write_tasks(tasks(), tmp_path / "tasks.jsonl")
    assert [t.instance_id for t in load_tasks(str(path), instance_ids=["o__r-2", "o__r-0"])] == ["o__r-0", "o__r-2"]
    with pytest.raises(TaskSourceError, match=r"instance ids not found: \['nope'\]"):
        load_tasks(str(path), instance_ids=["nope"])


def test_missing_path_names_it_and_the_fix(tmp_path: Path):
    missing = tmp_path / "nowhere" / "tasks.jsonl"
    with pytest.raises(TaskSourceError, match=rf"{missing} does not exist.*repro tasks build"):
        load_tasks(str(missing))


def test_malformed_line_names_file_and_line(tmp_path: Path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(SWE_ROW) + "\n\n{not json\n")
    with pytest.raises(TaskSourceError, match=rf"{path}:3: not valid JSON"):
        load_tasks(str(path))


def test_missing_field_names_file_line_and_field(tmp_path: Path):
    row = {k: v for k, v in SWE_ROW.items() if k != "base_commit"}
    path = write_jsonl(tmp_path / "rows.jsonl", [SWE_ROW | {"instance_id": "ok"}, row])
    with pytest.raises(TaskSourceError, match=rf"{path}:2: field 'base_commit' is missing"):
        load_tasks(str(path))


def test_bad_test_list_names_the_field(tmp_path: Path):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([SWE_ROW | {"FAIL_TO_PASS": "[unclosed"}]))
    with pytest.raises(TaskSourceError, match=r"row 0: field 'FAIL_TO_PASS' is not a JSON list"):
        load_tasks(str(path))


def test_duplicate_ids_are_rejected(tmp_path: Path):
    path = write_jsonl(tmp_path / "dup.jsonl", [SWE_ROW, SWE_ROW])
    with pytest.raises(TaskSourceError, match=r":2: duplicate instance_id 'astropy__astropy-12907' \(first at .*:1\)"):
        load_tasks(str(path))


def test_hub_name_fails_fast_offline_with_the_path_convention(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("REPRO_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("REPRO_ALLOW_HUB", raising=False)
    started = time.monotonic()
    with pytest.raises(TaskSourceError) as info:
        load_tasks("princeton-nlp/SWE-bench_Verified", split="test")
    assert time.monotonic() - started < 2
    message = str(info.value)
    assert str(tmp_path / "princeton-nlp__SWE-bench_Verified") in message
    assert "load_dataset('princeton-nlp/SWE-bench_Verified', split='test')" in message


def test_hub_name_resolves_to_the_local_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("REPRO_DATA_DIR", str(tmp_path))
    local = hub_local_path("princeton-nlp/SWE-bench_Verified")
    write_jsonl(local.with_name(local.name + ".jsonl"), [SWE_ROW])
    assert [t.instance_id for t in load_tasks("princeton-nlp/SWE-bench_Verified")] == [SWE_ROW["instance_id"]]


def test_data_sha256_is_stable_order_free_and_ignores_repo_path():
    base = tasks()
    moved = [Task(**{**t.to_row(), "repo_path": "/elsewhere"}) for t in reversed(base)]
    assert data_sha256(base) == data_sha256(moved)
    changed = [*base[:2], Task(**{**base[2].to_row(), "problem_statement": "other"})]
    assert data_sha256(changed) != data_sha256(base)
    assert len(data_sha256(base)) == 64


def test_a_task_file_takes_a_seeded_count_kept_in_file_order(tmp_path: Path) -> None:
    from repro.tasks.distributions import TaskDistributionConfig, build_distribution
    from repro.tasks.sets import TaskFileConfig, load_task_set

    rows = build_distribution(TaskDistributionConfig(split="train", n_tasks=12))
    source = write_tasks(rows, tmp_path / "tasks.jsonl")
    order = [t.instance_id for t in rows]
    name, every = load_task_set(TaskFileConfig(str(source)))
    assert name == "tasks" and [t.instance_id for t in every] == order
    name, some = load_task_set(TaskFileConfig(str(source), n_tasks=5, seed=1))
    ids = [t.instance_id for t in some]
    assert name == "tasks:n5:s1" and len(ids) == 5 and ids == [i for i in order if i in ids]  # file order
    assert [t.instance_id for t in load_task_set(TaskFileConfig(str(source), n_tasks=5, seed=1))[1]] == ids
    assert [t.instance_id for t in load_task_set(TaskFileConfig(str(source), n_tasks=5, seed=2))[1]] != ids
    assert len(load_task_set(TaskFileConfig(str(source), n_tasks=50))[1]) == 12  # more than the file: all
    with pytest.raises(ValueError, match="n_tasks must be >= 0"):
        TaskFileConfig(str(source), n_tasks=-1)
