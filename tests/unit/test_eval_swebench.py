"""Real SWE-bench Verified rows load as tasks and yield a preds.json that swebench 4.1.0's own code accepts.

Fixture ``tests/fixtures/swebench_verified_sample.jsonl``: two rows of the SWE-bench Verified test split, all 12
fields verbatim (FAIL_TO_PASS / PASS_TO_PASS as JSON-encoded strings, as the dataset stores them), extracted
with ``ast.literal_eval`` from public code that embeds them as example instances:

* ``astropy__astropy-12907`` (row 0 of princeton-nlp/SWE-bench_Verified): ``test_task`` in
  github.com/princeton-pli/hal-harness, ``agent_eval_harness/benchmarks/swe_bench.py`` at commit
  74902f550b4b4d37d911eb34a1dfb28306127c4f (its SWE-bench Verified smoke task). Cross-checked against the same row
  (with the Verified ``difficulty`` column) quoted in github.com/sunnweiwei/PPP-Agent.
* ``django__django-11099``: ``EXAMPLE_INSTANCE`` in github.com/lwaekfjlk/OpenDevin (an OpenHands fork),
  ``evaluation/swe_bench/swe_env_box.py`` at commit 09140826f541d226a76cb72f2bc1de4de8dde734.

These revisions of the rows predate the ``difficulty`` column that later revisions of the Verified dataset add.
No Docker or network is needed: swebench's own prediction reader, dataset filter and grading arithmetic run here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS, ResolvedStatus
from swebench.harness.grading import get_eval_tests_report, get_resolution_status
from swebench.harness.run_evaluation import get_dataset_from_preds
from swebench.harness.test_spec.python import get_test_directives
from swebench.harness.test_spec.test_spec import make_test_spec
from swebench.harness.utils import get_predictions_from_file, load_swebench_dataset

from repro.evaluation.preds import preds_path, update_preds, write_preds
from repro.evaluation.reports import InstanceReport, Usage, read_reports, write_report
from repro.evaluation.spec import TaskSetSpec
from repro.protocols import GradeResult, HarnessResult
from repro.tasks.schema import Task

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "swebench_verified_sample.jsonl"
IDS = ["astropy__astropy-12907", "django__django-11099"]


def _rows() -> list[dict]:
    return [json.loads(line) for line in FIXTURE.read_text().splitlines()]


def test_fixture_rows_are_complete_swebench_rows() -> None:
    rows = _rows()
    assert [r["instance_id"] for r in rows] == IDS
    for row in rows:
        assert set(row) == {"repo", "instance_id", "base_commit", "patch", "test_patch", "problem_statement",
                            "hints_text", "created_at", "version", FAIL_TO_PASS, PASS_TO_PASS,
                            "environment_setup_commit"}
        assert isinstance(row[FAIL_TO_PASS], str) and row["patch"].startswith("diff --git")
        assert len(row["base_commit"]) == 40


def test_rows_load_as_tasks_with_decoded_test_lists() -> None:
    tasks = [Task.from_row(r) for r in _rows()]
    astropy, django = tasks
    assert astropy.FAIL_TO_PASS == ["astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]",
                                    "astropy/modeling/tests/test_separable.py::test_separable[compound_model9-result9]"]
    assert len(astropy.PASS_TO_PASS) == 13 and len(django.PASS_TO_PASS) == 19
    assert django.FAIL_TO_PASS[0] == "test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests)"
    assert all(t.extra == {} for t in tasks)  # every column is a known task field
    assert TaskSetSpec.from_tasks("swebench-verified-sample", tasks).instance_ids == tuple(IDS)


def test_test_lists_parse_as_swebench_parses_them() -> None:
    rows = _rows()
    for row, task in zip(rows, map(Task.from_row, rows), strict=True):
        assert json.loads(row[FAIL_TO_PASS]) == task.FAIL_TO_PASS
        assert get_test_directives(row)  # swebench finds the test files in the test patch
    astropy = make_test_spec(rows[0])  # offline for astropy (django's spec fetches requirements from GitHub)
    assert astropy.FAIL_TO_PASS == Task.from_row(rows[0]).FAIL_TO_PASS
    assert astropy.PASS_TO_PASS == Task.from_row(rows[0]).PASS_TO_PASS


def _graded(task: Task, resolved: bool) -> InstanceReport:
    tests = dict.fromkeys(task.FAIL_TO_PASS + task.PASS_TO_PASS, "PASSED")
    if not resolved:
        tests[task.FAIL_TO_PASS[0]] = "FAILED"
    grade = GradeResult("resolved" if resolved else "unresolved", tests=tests)
    harness = HarnessResult(f"run.{task.instance_id}.s0", "finished", exit_status="Submitted")
    return InstanceReport.build(task, 0, harness.rollout_id, harness, grade, task.patch, Usage(), started_at=0.0)


@pytest.mark.parametrize("resolved", [True, False])
def test_our_outcomes_agree_with_swebench_grading(resolved: bool) -> None:
    for task in map(Task.from_row, _rows()):
        report = _graded(task, resolved)
        gold = {FAIL_TO_PASS: report.fail_to_pass, PASS_TO_PASS: report.pass_to_pass}
        status = get_resolution_status(get_eval_tests_report(report.tests, gold))
        assert (status == ResolvedStatus.FULL.value) == (report.outcome == "resolved")


def test_preds_json_is_accepted_by_swebench(tmp_path: Path) -> None:
    tasks = [Task.from_row(r) for r in _rows()]
    for task in tasks:
        write_report(tmp_path, _graded(task, True), task.patch)  # the gold patch as the model's patch
    (path,) = write_preds(tmp_path, read_reports(tmp_path), "repro/tiny-qwen")
    assert path == preds_path(tmp_path)
    preds = get_predictions_from_file(str(path), str(FIXTURE), "test")
    assert [p["instance_id"] for p in preds] == IDS
    assert all(p["model_patch"] == t.patch and p["model_name_or_path"] == "repro/tiny-qwen"
               for p, t in zip(preds, tasks, strict=True))
    by_id = {p["instance_id"]: p for p in preds}
    dataset = get_dataset_from_preds(str(FIXTURE), "test", IDS, by_id, run_id=f"check-{tmp_path.name}",
                                     rewrite_reports=False)
    assert sorted(d["instance_id"] for d in dataset) == IDS  # every prediction matched, none skipped as empty
    assert [d["instance_id"] for d in load_swebench_dataset(str(FIXTURE), "test", IDS)] == IDS


def test_single_updates_also_give_an_accepted_file(tmp_path: Path) -> None:
    update_preds(tmp_path, IDS[1], "m", "diff --git a/x b/x\n")
    update_preds(tmp_path, IDS[0], "m", "")  # an empty patch is a valid prediction (graded as unresolved)
    preds = get_predictions_from_file(str(preds_path(tmp_path)), str(FIXTURE), "test")
    assert [p["instance_id"] for p in preds] == IDS
    by_id = {p["instance_id"]: p for p in preds}
    dataset = get_dataset_from_preds(str(FIXTURE), "test", [], by_id, run_id=f"check-{tmp_path.name}",
                                     rewrite_reports=False)
    assert [d["instance_id"] for d in dataset] == [IDS[1]]  # swebench skips empty patches itself
