"""Rollouts -> a SampleSet: group-relative advantages, masking of infra failures, the store and the inspect view."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from repro.cli.commands import main
from repro.report.inspect import inspect_path
from repro.store import CallRecord, GroupCommitWriter, RolloutRecord, TraceStoreConfig, open_store
from repro.train.samples import SampleConfig, build_rows, build_sample_set, group_advantages
from tests.support import rollout_calls

EPS = 1e-4
Pairs = list[tuple[RolloutRecord, list[CallRecord]]]
KINDS = ("finished", "finished", "finished", "failed", "failed_scored", "running", "no_reward")


def rollout(rollout_id: str, group: str, kind: str, reward: float) -> RolloutRecord:
    """A rollout of one of the KINDS; only ``finished`` ones are valid."""
    status = {"failed_scored": "failed", "no_reward": "finished"}.get(kind, kind)
    kept = None if kind in ("failed", "no_reward", "running") else reward
    return RolloutRecord(rollout_id, task_id=group, group_id=group, status=status, reward=kept,
                         failure_reason="sandbox crashed" if status == "failed" else None)


@st.composite
def groups(draw: st.DrawFn) -> Pairs:
    """1-3 groups of 1-5 rollouts each, with random kinds, rewards and fragmentations."""
    pairs: Pairs = []
    for g in range(draw(st.integers(1, 3))):
        for i in range(draw(st.integers(1, 5))):
            rid = f"g{g}-r{i}"
            reward = draw(st.sampled_from([0.0, 1.0]) | st.floats(-2.0, 2.0, allow_nan=False))
            pairs.append((rollout(rid, f"g{g}", draw(st.sampled_from(KINDS)), reward),
                          draw(rollout_calls(rollout_id=rid, max_calls=4)).calls))
    return pairs


def valid(r: RolloutRecord) -> bool:
    return r.status == "finished" and r.reward is not None


def reference_advantages(pairs: Pairs, scale: str) -> dict[str, float]:
    """GRPO written out independently: population std over the group's valid rewards."""
    rewards: dict[str, list[float]] = defaultdict(list)
    for r, _ in pairs:
        if valid(r):
            rewards[r.group_id].append(float(r.reward))
    out = {}
    for r, _ in pairs:
        group = rewards[r.group_id]
        if not valid(r) or len(group) < 2 or statistics.pstdev(group) == 0:
            out[r.rollout_id] = 0.0
            continue
        centred = r.reward - statistics.fmean(group)
        out[r.rollout_id] = centred / (statistics.pstdev(group) + EPS) if scale == "group" else centred
    return out


@given(groups(), st.sampled_from(["group", "none"]), st.sampled_from(["per_call", "prefix_merge"]))
def test_advantages_are_group_relative_shared_by_rows_and_masked_rollouts_do_not_count(
        pairs: Pairs, scale: str, mode: str) -> None:
    samples = build_sample_set(pairs, SampleConfig(mode=mode, scale_rewards=scale))
    expected = reference_advantages(pairs, scale)
    for rid, info in samples.rollouts.items():
        assert info.advantage == pytest.approx(expected[rid], abs=1e-9)
        assert all(row.advantage == info.advantage for row in info.rows)
    masked = {r.rollout_id for r, _ in pairs if not valid(r)}
    assert {rid for rid, info in samples.rollouts.items() if info.masked} == masked
    assert not any(row.rollout_id in masked for row in samples.rows)
    assert all(row.weight == 0.0 for rid in masked for row in samples.rollouts[rid].rows)
    without = build_sample_set([p for p in pairs if valid(p[0])], SampleConfig(mode=mode, scale_rewards=scale))
    assert {rid: i.advantage for rid, i in without.rollouts.items()} == \
        {rid: i.advantage for rid, i in samples.rollouts.items() if rid not in masked}
    assert [(r.rollout_id, r.row_index, r.weight) for r in without.rows] == \
        [(r.rollout_id, r.row_index, r.weight) for r in samples.rows]


def _one_call(rid: str) -> list[CallRecord]:
    return [CallRecord(rid, 0, "chat", "ok", prompt_ids=[1, 2], completion_ids=[3, 4], logprobs=[-0.5, -0.25])]


def test_infrastructure_failure_is_masked_never_scored_zero() -> None:
    pairs = [(rollout("a", "g", "finished", 1.0), _one_call("a")),
             (rollout("b", "g", "finished", 0.0), _one_call("b")),
             (rollout("c", "g", "failed_scored", 0.0), _one_call("c"))]
    samples = build_sample_set(pairs)
    advantage = 0.5 / (0.5 + EPS)  # group {1, 0}: the failed rollout is not a third member with reward 0
    assert [samples.rollouts[r].advantage for r in "abc"] == pytest.approx([advantage, -advantage, 0.0])
    assert samples.rollouts["c"].masked == "infrastructure failure: sandbox crashed"
    assert [r.rollout_id for r in samples.rows] == ["a", "b"]
    assert samples.rollouts["c"].rows[0].weight == 0.0 and samples.rollouts["c"].rows[0].reward is None


def test_degenerate_groups_and_unscaled_rewards() -> None:
    assert group_advantages([1.0]) == [0.0]
    assert group_advantages([0.5, 0.5, 0.5]) == [0.0, 0.0, 0.0]
    assert group_advantages([1.0, 0.0], scale="none") == [0.5, -0.5]
    assert group_advantages([2.0, 0.0, 1.0], eps=0.0 + EPS) == pytest.approx(
        [1 / (math.sqrt(2 / 3) + EPS), -1 / (math.sqrt(2 / 3) + EPS), 0.0])


def test_rollouts_of_modes_not_included_are_masked() -> None:
    pairs = [(rollout("a", "g", "finished", 1.0), _one_call("a")), (rollout("b", "g", "finished", 0.0), _one_call("b")),
             (rollout("e", "g", "finished", 1.0), _one_call("e"))]
    pairs[2][0].mode = "demo"
    samples = build_sample_set(pairs, SampleConfig(include_modes=("eval",)))
    assert samples.rollouts["e"].masked == "mode demo not included (eval)"
    assert [r.rollout_id for r in samples.rows] == ["a", "b"]
    assert samples.rollouts["a"].advantage == pytest.approx(0.5 / (0.5 + EPS))  # group {1, 0}, the demo left out
    assert build_sample_set(pairs).rollouts["e"].masked is None
    with pytest.raises(ValueError, match="tuple of modes"):
        SampleConfig(include_modes="train")  # type: ignore[arg-type]


def test_stats() -> None:
    more = [CallRecord("a", 1, "chat", "ok", prompt_ids=[9], completion_ids=[5], logprobs=None),
            CallRecord("a", 2, "chat", "error")]
    pairs = [(rollout("a", "g", "finished", 1.0), [*_one_call("a"), *more]),
             (rollout("b", "g", "failed", 0.0), _one_call("b")),
             (rollout("c", "g", "finished", 0.0), [])]
    assert build_sample_set(pairs).stats() == {
        "rows": 2, "rollouts": 3, "masked_rollouts": 1, "rollouts_without_rows": 1, "sampled_tokens": 3,
        "total_tokens": 6, "mean_rows_per_rollout": 2.0, "rows_missing_logprobs": 1, "skipped_calls": 1}


def _write_store(path: Path) -> Pairs:
    """Run ``run1``: rollout a (3 calls: two extend, then a break), b (1 call), c infra-failed; run2: d."""
    calls_a = [CallRecord("a", 0, "chat", "ok", prompt_ids=[1, 2], completion_ids=[3, 4], logprobs=[-0.5, -0.25]),
               CallRecord("a", 1, "chat", "ok", prompt_ids=[1, 2, 3, 4, 5, 6], completion_ids=[7],
                          logprobs=[-1.0]),
               CallRecord("a", 2, "chat", "ok", prompt_ids=[1, 8], completion_ids=[9], logprobs=[-2.0])]
    pairs = [(rollout("a", "task-1", "finished", 1.0), calls_a),
             (rollout("b", "task-1", "finished", 0.0), _one_call("b")),
             (rollout("c", "task-1", "failed", 0.0), _one_call("c"))]
    store = open_store(path)
    writer = GroupCommitWriter(TraceStoreConfig(path=str(path)))
    for (r, calls), run in [*((p, "run1") for p in pairs), ((rollout("d", "task-1", "finished", 5.0), []), "run2")]:
        store.create_rollout(RolloutRecord(r.rollout_id, run_id=run, task_id=r.task_id, group_id=r.group_id))
        for call in calls:
            writer.write_sync(call)
        store.finish_rollout(r.rollout_id, r.status, r.reward, r.failure_reason)
    writer.close()
    store.close()
    return pairs


def _summary(rows: list) -> list[tuple]:
    return [(r.rollout_id, r.call_seqs, r.input_ids, r.loss_mask, r.old_logprobs, r.weight, r.advantage)
            for r in rows]


def test_store_rows_match_in_memory_rows_and_inspect_shows_them(tmp_path: Path, capsys) -> None:
    db = tmp_path / "t.sqlite"
    pairs = _write_store(db)
    store = open_store(db)
    samples = build_rows(store, "run1")  # run2's rollout d is another run: not in the group
    assert list(samples.rollouts) == ["a", "b", "c"]
    assert _summary(samples.rows) == _summary(build_sample_set(pairs).rows)
    assert [r.call_seqs for r in samples.rows] == [[0, 1], [2], [0]]
    assert samples.rows[0].loss_mask == [0, 0, 1, 1, 0, 0, 1]
    assert _summary(build_rows(store, ["a", "b"]).rows) == _summary(samples.rows)
    with pytest.raises(KeyError, match="nope"):
        build_rows(store, ["nope"])
    store.close()
    inspect_path(db, "a")
    out = capsys.readouterr().out
    assert "calls -> rows of rollout a (3 calls, 2 rows)" in out
    assert "rollout a -> rows: finished, reward 1, trained · mode prefix_merge, weighting rollout" in out
    assert "advantage within group task-1: 3 rollouts, 2 valid" in out
    assert "0-1" in out and "0.7500" in out and "0.2500" in out and "+0.9998" in out
    main(["inspect", str(db), "c", "--samples-mode", "per_call", "--weighting", "fragment"])
    out = capsys.readouterr().out
    assert "MASKED (infrastructure failure: sandbox crashed)" in out and "mode per_call, weighting fragment" in out
    assert "0.0000" in out  # the masked rollout's row, shown with no weight
