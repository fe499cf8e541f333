"""Calls -> fragments: merging keeps every sampled token once and in order, and the mask marks exactly them.

The strategies (random fragmentation, call statuses, missing logprobs) are in ``tests/support.py``, shared with the
weights and build tests.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from repro.store import CallRecord
from repro.train.samples import SampleConfig, fragments
from tests.support import Drawn, rollout_calls


def by_seq(drawn: Drawn) -> dict[int, CallRecord]:
    return {c.seq: c for c in drawn.calls}


def sampled_tokens(fragment_ids: list[int], mask: list[int]) -> list[int]:
    return [t for t, m in zip(fragment_ids, mask, strict=True) if m == 1]


@given(rollout_calls(), st.sampled_from(["per_call", "prefix_merge"]))
def test_merging_never_drops_reorders_or_duplicates_a_sampled_token(drawn: Drawn, mode: str) -> None:
    parts, skipped = fragments(drawn.calls, mode)
    calls = by_seq(drawn)
    got = [t for p in parts for t in sampled_tokens(p.input_ids, p.loss_mask)]
    assert got == [t for seq in drawn.trainable for t in calls[seq].completion_ids or []]
    assert [s for p in parts for s in p.call_seqs] == drawn.trainable
    assert sorted([s.seq for s in skipped] + drawn.trainable) == [c.seq for c in drawn.calls]


@given(rollout_calls())
def test_prefix_merge_breaks_exactly_where_a_prompt_does_not_extend(drawn: Drawn) -> None:
    parts, _ = fragments(drawn.calls, "prefix_merge")
    calls = by_seq(drawn)
    assert [p.call_seqs[0] for p in parts] == drawn.starts
    for part in parts:
        last = calls[part.call_seqs[-1]]
        assert part.input_ids == (last.prompt_ids or []) + (last.completion_ids or [])


@given(rollout_calls(), st.sampled_from(["per_call", "prefix_merge"]))
def test_mask_is_one_exactly_on_sampled_tokens_and_logprobs_align(drawn: Drawn, mode: str) -> None:
    parts, _ = fragments(drawn.calls, mode)
    calls = by_seq(drawn)
    for part in parts:
        expected_mask = [0] * len(part.input_ids)
        expected_lp = [0.0] * len(part.input_ids)
        for seq in part.call_seqs:  # each merged call's completion sits right after its prompt
            call = calls[seq]
            start = len(call.prompt_ids or [])
            completion = call.completion_ids or []
            assert part.input_ids[start:start + len(completion)] == completion
            for i in range(len(completion)):
                expected_mask[start + i] = 1
                expected_lp[start + i] = call.logprobs[i] if call.logprobs else math.nan
        assert part.loss_mask == expected_mask
        assert len(part.old_logprobs) == len(part.input_ids)
        for got, want in zip(part.old_logprobs, expected_lp, strict=True):
            assert (math.isnan(got) and math.isnan(want)) or got == want
        assert part.missing_logprob_seqs == [s for s in part.call_seqs if calls[s].logprobs is None]


@given(rollout_calls(max_calls=6, breaks=False, statuses=("ok",)))
def test_all_extending_calls_give_one_merged_row_or_one_row_per_call(drawn: Drawn) -> None:
    merged, _ = fragments(drawn.calls, "prefix_merge")
    per_call, _ = fragments(drawn.calls, "per_call")
    n = len(drawn.trainable)
    assert len(merged) == min(n, 1) and len(per_call) == n
    assert [t for p in merged for t in sampled_tokens(p.input_ids, p.loss_mask)] == \
        [t for p in per_call for t in sampled_tokens(p.input_ids, p.loss_mask)]
    assert sum(len(p.input_ids) for p in merged) <= sum(len(p.input_ids) for p in per_call)


def test_worked_example_prompt_suffix_is_masked_and_breaks_start_rows() -> None:
    calls = [
        CallRecord("r", 0, "chat", "ok", prompt_ids=[1, 2], completion_ids=[10, 11], logprobs=[-0.1, -0.2]),
        CallRecord("r", 1, "chat", "error", error="upstream 500"),
        CallRecord("r", 2, "chat", "ok", prompt_ids=[1, 2, 10, 11, 3], completion_ids=[12], logprobs=[-0.3]),
        CallRecord("r", 3, "chat", "aborted", prompt_ids=[1, 2, 10, 11, 3, 12], completion_ids=[13]),
        CallRecord("r", 4, "chat", "truncated", prompt_ids=[1, 2, 10, 11, 3, 12, 4], completion_ids=[14],
                   logprobs=None),
        CallRecord("r", 5, "chat", "ok", prompt_ids=[1, 9], completion_ids=[15], logprobs=[-0.5]),
        CallRecord("r", 6, "chat", "ok", prompt_ids=[1, 9, 15], completion_ids=[], logprobs=[]),
    ]
    parts, skipped = fragments(calls, "prefix_merge")
    assert [p.call_seqs for p in parts] == [[0, 2, 4], [5]]
    first = parts[0]
    assert first.input_ids == [1, 2, 10, 11, 3, 12, 4, 14]
    assert first.loss_mask == [0, 0, 1, 1, 0, 1, 0, 1]
    assert first.old_logprobs[:7] == pytest.approx([0.0, 0.0, -0.1, -0.2, 0.0, -0.3, 0.0])
    assert math.isnan(first.old_logprobs[7]) and first.missing_logprob_seqs == [4]
    assert [(s.seq, s.reason) for s in skipped] == [(1, "status error"), (3, "status aborted"),
                                                   (6, "no completion token ids")]
    assert [p.call_seqs for p in fragments(calls, "per_call")[0]] == [[0], [2], [4], [5]]


def test_config_rejects_unknown_choices_and_lists_them() -> None:
    with pytest.raises(ValueError, match="per_call, prefix_merge"):
        SampleConfig(mode="merge")
    with pytest.raises(ValueError, match="rollout, fragment"):
        SampleConfig(weighting="token")
    with pytest.raises(ValueError, match="group, none"):
        SampleConfig(scale_rewards="batch")
    with pytest.raises(ValueError, match="per_call, prefix_merge"):
        fragments([], "merge")


def test_auxiliary_calls_are_skipped_and_do_not_break_the_agents_chain() -> None:
    """A title request between the agent's calls: skipped by default (named), trained on only when asked, and in
    neither case does it split the agent's own prefix-merged row."""
    calls = [
        CallRecord("r", 0, "chat", "ok", prompt_ids=[1, 2], completion_ids=[10], logprobs=[-0.1]),
        CallRecord("r", 1, "chat", "ok", prompt_ids=[7, 8], completion_ids=[20], logprobs=[-0.2], purpose="auxiliary"),
        CallRecord("r", 2, "chat", "ok", prompt_ids=[1, 2, 10, 3], completion_ids=[11], logprobs=[-0.3]),
        CallRecord("r", 3, "chat", "ok", prompt_ids=[5], completion_ids=[30], logprobs=[-0.4], purpose="summary"),
        CallRecord("r", 4, "chat", "ok", prompt_ids=[5, 30, 6], completion_ids=[12], logprobs=[-0.5]),
    ]
    parts, skipped = fragments(calls, "prefix_merge")
    assert [p.call_seqs for p in parts] == [[0, 2], [3], [4]]  # the summary breaks the prefix; the title does not
    assert [(s.seq, s.reason) for s in skipped] == [(1, "purpose auxiliary (not in samples.train_purposes)")]
    parts, skipped = fragments(calls, "prefix_merge", ("policy", "summary", "auxiliary"))
    assert [p.call_seqs for p in parts] == [[0, 2], [1], [3], [4]] and skipped == []
    assert [p.call_seqs for p in fragments(calls, "prefix_merge", ("policy",))[0]] == [[0, 2], [4]]
    with pytest.raises(ValueError, match="policy, auxiliary, summary"):
        SampleConfig(train_purposes=("policy", "title"))
