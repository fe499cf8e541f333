"""Run records: per-instance reports, resumability, preds.json under a lock, metrics.json."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from repro.evaluation.preds import load_preds, preds_path, update_preds, write_preds
from repro.evaluation.reports import (
    InstanceReport,
    Usage,
    finished_samples,
    next_rollout_id,
    patch_stats,
    pending_samples,
    read_patch,
    read_reports,
    rollout_id_for,
    safe_name,
    usage_from_store,
    write_report,
)
from repro.evaluation.spec import EvalSpec, HarnessSpec, TaskSetSpec
from repro.evaluation.summary import Cost, default_k_values, eval_metrics, write_metrics
from repro.protocols import GradeResult, HarnessResult
from repro.store import CallRecord, GroupCommitWriter, RolloutRecord, TraceStoreConfig, open_store
from repro.tasks.schema import Task

PATCH = "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n"


def _task(instance_id: str) -> Task:
    return Task(instance_id, "o/r", "abc", "bug", FAIL_TO_PASS=["t::f"], PASS_TO_PASS=["t::p"])


def _report(instance_id: str, sample: int = 0, outcome: str = "resolved", harness: str = "finished") -> InstanceReport:
    grade = GradeResult(outcome, reason="" if outcome == "resolved" else f"{outcome} because",
                        tests={"t::f": "PASSED" if outcome == "resolved" else "FAILED", "t::p": "PASSED"},
                        duration_s=0.5, log_tail="x" * 10_000)
    result = HarnessResult(f"r-{instance_id}-{sample}", harness, exit_status="Submitted", n_model_calls=3,
                           duration_s=2.0)
    return InstanceReport.build(_task(instance_id), sample, result.rollout_id, result, grade, PATCH,
                                Usage(3, 300, 30), started_at=1.0, finished_at=4.0)


def test_report_build_write_read_round_trip(tmp_path: Path) -> None:
    report = _report("o__r-1", outcome="unresolved")
    assert (report.patch_bytes, report.patch_added, report.patch_removed) == (len(PATCH), 1, 1)
    assert report.fail_to_pass == ["t::f"] and len(report.grade_log_tail) == 4000
    write_report(tmp_path, report, PATCH)
    assert read_reports(tmp_path) == [report]
    assert read_patch(tmp_path, "o__r-1", 0) == PATCH
    assert read_patch(tmp_path, "o__r-1", 1) == ""


def test_reports_refuse_unknown_outcomes_and_name_corrupt_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="outcome"):
        InstanceReport("a", 0, "r", "passed")
    write_report(tmp_path, _report("a"), PATCH)
    bad = next(tmp_path.rglob("report.json"))
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="delete it to rerun"):
        read_reports(tmp_path)


def test_resumability_skips_finished_samples_and_optionally_retries_infra(tmp_path: Path) -> None:
    write_report(tmp_path, _report("a", 0), PATCH)
    write_report(tmp_path, _report("a", 1, "error"), PATCH)
    write_report(tmp_path, _report("b", 0, "unresolved", harness="crashed"), PATCH)
    assert finished_samples(tmp_path) == {("a", 0), ("a", 1), ("b", 0)}
    assert pending_samples(tmp_path, ["a", "b", "c"], 2) == [("b", 1), ("c", 0), ("c", 1)]
    assert pending_samples(tmp_path, ["a", "b", "c"], 2, retry_infra=True) == \
        [("a", 1), ("b", 0), ("b", 1), ("c", 0), ("c", 1)]
    assert pending_samples(tmp_path / "fresh", ["a"], 1) == [("a", 0)]


def test_names_and_rollout_ids_are_safe_and_distinct() -> None:
    assert safe_name("django__django-11099") == "django__django-11099"
    odd = [safe_name(x) for x in ("a/b", "a?b", "..", "", "a b")]
    assert len(set(odd)) == len(odd) and all("/" not in x and not x.startswith(".") for x in odd)
    assert rollout_id_for("run 1", "a/b", 2) != rollout_id_for("run 1", "a/b", 2, attempt=1)
    assert "/" not in rollout_id_for("run", "a/b", 0)
    from repro.proxy.validation import ROLLOUT_ID

    for run, iid in [("20261129-1", "astropy__astropy-12907"), ("r", "x.y/z" * 40), ("run 1", "a/b")]:
        for attempt in (0, 3):
            rid = rollout_id_for(run, iid, 1, attempt)
            assert ROLLOUT_ID.fullmatch(rid), rid  # the proxy accepts every id we make


def test_patch_stats_ignore_file_headers() -> None:
    assert patch_stats("") == (0, 0, 0)
    assert patch_stats(PATCH)[1:] == (1, 1)


def test_usage_is_read_from_the_trace_store(tmp_path: Path) -> None:
    config = TraceStoreConfig(path=str(tmp_path / "traces.sqlite"))
    store = open_store(config.path)
    store.create_rollout(RolloutRecord("r1"))
    writer = GroupCommitWriter(config)
    for seq in range(2):
        writer.write_sync(CallRecord("r1", seq, "chat", "ok", request={"messages": []}, prompt_tokens=10 + seq,
                                     completion_tokens=5))
    writer.close()
    assert usage_from_store(store, "r1") == Usage(2, 21, 10, longest_prompt=11)


def test_reruns_get_a_fresh_rollout_id(tmp_path: Path) -> None:
    store = open_store(tmp_path / "traces.sqlite")
    first = next_rollout_id(store, "run", "a", 0)
    assert first == rollout_id_for("run", "a", 0)
    store.create_rollout(RolloutRecord(first))
    second = next_rollout_id(store, "run", "a", 0)
    assert second == rollout_id_for("run", "a", 0, attempt=1)
    store.create_rollout(RolloutRecord(second))
    assert next_rollout_id(store, "run", "a", 0).endswith("-r2")
    assert next_rollout_id(store, "run", "a", 1) == rollout_id_for("run", "a", 1)


def _hammer(run_dir: str, worker: int) -> None:
    for i in range(15):
        update_preds(Path(run_dir), f"w{worker}-i{i}", "model/x", f"patch {worker} {i}")


def test_concurrent_preds_updates_lose_nothing(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")  # fork could inherit a lock another thread holds
    procs = [ctx.Process(target=_hammer, args=(str(tmp_path), w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    preds = load_preds(preds_path(tmp_path))
    assert len(preds) == 60
    assert [p["instance_id"] for p in preds] == sorted(p["instance_id"] for p in preds)
    assert set(preds[0]) == {"instance_id", "model_name_or_path", "model_patch"}


def test_update_replaces_and_samples_get_their_own_file(tmp_path: Path) -> None:
    update_preds(tmp_path, "a", "m", "one")
    update_preds(tmp_path, "a", "m", "two")
    update_preds(tmp_path, "a", "m", "s1", sample=1)
    assert load_preds(preds_path(tmp_path)) == [{"instance_id": "a", "model_name_or_path": "m", "model_patch": "two"}]
    assert load_preds(tmp_path / "preds-sample1.json")[0]["model_patch"] == "s1"
    assert not list(tmp_path.glob(".*.tmp"))


def test_write_preds_rebuilds_from_reports(tmp_path: Path) -> None:
    reports = [_report("b"), _report("a"), _report("a", 1)]
    for r in reports:
        write_report(tmp_path, r, PATCH + f"# {r.instance_id}{r.sample}\n")
    paths = write_preds(tmp_path, read_reports(tmp_path), "m")
    assert [p.name for p in paths] == ["preds.json", "preds-sample1.json"]
    assert [p["instance_id"] for p in load_preds(paths[0])] == ["a", "b"]
    assert load_preds(paths[1])[0]["model_patch"].endswith("# a1\n")


def _spec(ids: tuple[str, ...], k: int = 2) -> EvalSpec:
    return EvalSpec(HarnessSpec("mini-swe-agent", "2.4.6"), TaskSetSpec("bundled", ids, "ff"), k=k)


def test_eval_metrics_json(tmp_path: Path) -> None:
    spec = _spec(("a", "b", "c"))
    reports = [_report("a", 0), _report("a", 1, "unresolved"), _report("b", 0, "timeout"),
               _report("b", 1, "resolved", harness="crashed"), _report("c", 0, "unresolved")]
    metrics = eval_metrics(reports, spec, "eval_tiny", "tiny@abc", cost=Cost({"harness": 0.5}, {"serving": 0.25}),
                           started_at=10.0, durations_s={"rollouts": 3.0})
    assert metrics["kind"] == "eval" and metrics["table"] == "eval_tiny"
    assert metrics["fingerprint"] == spec.fingerprint() and EvalSpec.from_dict(metrics["spec"]) == spec
    assert metrics["pass_at_1"] == pytest.approx((0.5 + 0.0) / 2) and metrics["n_tasks"] == 2
    assert metrics["strict_pass_at_1"] == pytest.approx((0.5 + 0 + 0) / 3)
    assert metrics["counts"] == {"resolved": 2, "unresolved": 2, "error": 0, "timeout": 1, "harness_crashed": 1,
                                 "infra_failures": 2, "context_exceeded": 0, "context_refusals": 0}
    assert [(f["instance_id"], f["sample"]) for f in metrics["infra_failures"]] == [("b", 0), ("b", 1)]
    assert metrics["excluded_tasks"] == ["b"]
    assert not metrics["complete"] and metrics["missing_samples"] == [["c", 1]]
    assert metrics["cost"]["cpu_h_total"] == 0.5 and metrics["cost"]["gpu_h_total"] == 0.25
    assert metrics["harness"] == "mini-swe-agent@2.4.6" and metrics["task_distribution"] == "bundled"
    assert metrics["ci"]["method"] == "wilson" and metrics["ci"]["low"] <= metrics["pass_at_1"] <= metrics["ci"]["high"]
    path = write_metrics(tmp_path, metrics)
    assert json.loads(path.read_text()) == json.loads(json.dumps(metrics))


def test_eval_metrics_refuses_reports_from_another_spec() -> None:
    with pytest.raises(ValueError, match="outside the eval spec"):
        eval_metrics([_report("z")], _spec(("a",)), "e", "m")
    with pytest.raises(ValueError, match="outside the eval spec"):
        eval_metrics([_report("a", 3)], _spec(("a",)), "e", "m")


def test_default_k_values() -> None:
    assert default_k_values(1) == [1]
    assert default_k_values(8) == [1, 2, 4, 8]
    assert default_k_values(5) == [1, 2, 4, 5]


def test_a_run_whose_every_sample_is_an_infrastructure_failure_exits_with_the_reason(tmp_path) -> None:
    from repro.evaluation import InstanceReport
    from repro.rl.evaluator import refuse_if_all_infra

    missing = "task t: repository acme/x is missing at /r/acme__x. Obtain it ..."
    bad = [InstanceReport(instance_id=f"t{i}", sample=0, rollout_id=f"r{i}", outcome="error", reason=missing)
           for i in range(3)]
    with pytest.raises(SystemExit, match=r"all 3 samples are infrastructure failures.*3 x task t: repository acme/x"):
        refuse_if_all_infra(bad, tmp_path)
    refuse_if_all_infra([*bad, InstanceReport(instance_id="u", sample=0, rollout_id="u", outcome="unresolved")],
                        tmp_path)  # one measured sample: the run stands


def test_evaluate_or_refuse_returns_the_reports_and_exits_when_none_was_measured(tmp_path) -> None:
    from types import SimpleNamespace

    from repro.evaluation import InstanceReport
    from repro.rl.evaluator import evaluate_or_refuse

    class FakeEvaluator:
        def __init__(self, reports: list[InstanceReport]) -> None:
            self.reports, self.calls = reports, []

        def evaluate(self, tasks, phase_dir, label):
            self.calls.append((tasks, phase_dir, label))
            return SimpleNamespace(reports=self.reports)

    good = [InstanceReport(instance_id="u", sample=0, rollout_id="u", outcome="unresolved")]
    ev = FakeEvaluator(good)
    assert evaluate_or_refuse(ev, ["t"], tmp_path / "p", "warm") == good
    assert ev.calls == [(["t"], tmp_path / "p", "warm")]
    crashed = [InstanceReport(instance_id="t", sample=0, rollout_id="r", outcome="error", reason="harness crashed")]
    with pytest.raises(SystemExit, match=r"all 1 samples are infrastructure failures.*harness crashed"):
        evaluate_or_refuse(FakeEvaluator(crashed), ["t"], tmp_path / "p", "warm")
