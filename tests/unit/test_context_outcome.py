"""A rollout that ends on a call refused as longer than the context is the model's outcome (`context_exceeded`):
graded and counted apart from both "unresolved" and infrastructure failures, and trained by a named rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.evaluation.reports import InstanceReport, usage_from_store
from repro.store import CallRecord, GroupCommitWriter, RolloutRecord, TraceStoreConfig, open_store
from repro.train.samples import SampleConfig, build_sample_set


def _call(rollout_id: str, seq: int, status: str = "ok", purpose: str = "policy") -> CallRecord:
    ok = status == "ok"
    return CallRecord(rollout_id, seq, "chat", status, prompt_ids=[1, 2, 3 + seq], purpose=purpose,
                      completion_ids=[7, 8] if ok else None, logprobs=[-0.5, -0.5] if ok else None,
                      t_start=float(seq))


def _stored(tmp_path: Path, calls: list[CallRecord]) -> tuple[object, str]:
    config = TraceStoreConfig(path=str(tmp_path / "traces.sqlite"))
    store = open_store(config.path)
    store.create_rollout(RolloutRecord("r", task_id="t"))
    writer = GroupCommitWriter(config)
    for call in calls:
        writer.write_sync(call)
    writer.close()
    return store, "r"


def test_a_rollout_that_ends_on_a_refusal_records_which_call(tmp_path: Path) -> None:
    store, rid = _stored(tmp_path, [_call("r", 0), _call("r", 1, "context_exceeded"),
                                    _call("r", 2, purpose="auxiliary")])  # a side call after it does not count
    usage = usage_from_store(store, rid)
    assert (usage.context_refusals, usage.context_exceeded_seq) == (1, 1)


def test_a_refusal_the_harness_recovered_from_is_counted_but_is_not_the_outcome(tmp_path: Path) -> None:
    store, rid = _stored(tmp_path, [_call("r", 0), _call("r", 1, "context_exceeded"), _call("r", 2)])
    usage = usage_from_store(store, rid)
    assert (usage.context_refusals, usage.context_exceeded_seq) == (1, None)


def _report(harness_status: str, outcome: str = "unresolved", seq: int | None = 3) -> InstanceReport:
    return InstanceReport("i", 0, "r", outcome, harness_status=harness_status, context_exceeded_seq=seq)


@pytest.mark.parametrize("harness_status", ["finished", "crashed"])
def test_ending_on_a_refusal_is_not_an_infrastructure_failure(harness_status: str) -> None:
    report = _report(harness_status)
    assert report.context_exceeded and not report.infra_failure
    assert _report("crashed", seq=None).infra_failure  # control: a crash for any other reason still is one
    assert _report("crashed", outcome="error").infra_failure  # and a grader error is one whatever came before
    assert not _report("finished", outcome="resolved").context_exceeded  # resolved after all: resolved


def _group(tmp_path: Path) -> list[tuple[RolloutRecord, list[CallRecord]]]:
    pairs = []
    for i, reward in enumerate([1.0, 0.0, 0.0, 1.0]):
        ended = {"context_exceeded_seq": 1} if i == 2 else {}
        rollout = RolloutRecord(f"r{i}", task_id="t", group_id="t", status="finished", reward=reward, metadata=ended)
        pairs.append((rollout, [_call(f"r{i}", 0), *([_call(f"r{i}", 1, "context_exceeded")] if ended else [])]))
    return pairs


def test_the_trainer_rule_for_such_rollouts_is_named(tmp_path: Path) -> None:
    pairs = _group(tmp_path)
    kept = build_sample_set(pairs, SampleConfig())  # the default: zero_reward, as Agent Lightning
    assert kept.rollouts["r2"].masked is None and kept.rollouts["r2"].advantage < 0 and len(kept.rows) == 4
    masked = build_sample_set(pairs, SampleConfig(context_exceeded="mask"))
    assert "refused as longer than the context" in masked.rollouts["r2"].masked and len(masked.rows) == 3
    assert masked.rollouts["r1"].advantage < kept.rollouts["r1"].advantage  # r1 is now the group's only 0
    with pytest.raises(ValueError, match="context_exceeded must be one of"):
        SampleConfig(context_exceeded="drop")
