"""Agent Lightning's sample options: the group std's ddof, failed rollouts trained with a reward, and the row
length caps (a long prompt drops the row, a long response is cut). Defaults keep the old behaviour."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from repro.store import CallRecord, RolloutRecord
from repro.train.samples import SampleConfig, build_sample_set, group_advantages
from repro.train.samples.rows import Fragment, capped, prompt_length


def call(rollout_id: str, seq: int, prompt: list[int], completion: list[int]) -> CallRecord:
    return CallRecord(rollout_id, seq, "completions", "ok", prompt_ids=prompt, completion_ids=completion,
                      logprobs=[-0.5] * len(completion))


def group(rewards: list[float | None], failed: tuple[int, ...] = ()) -> list[tuple[RolloutRecord, list[CallRecord]]]:
    pairs = []
    for i, reward in enumerate(rewards):
        status = "failed" if i in failed else "finished"
        rollout = RolloutRecord(f"r{i}", task_id="t", group_id="t", status=status, reward=reward,
                                failure_reason="harness timed out" if status == "failed" else None)
        pairs.append((rollout, [call(f"r{i}", 0, [1, 2, 3], [4, 5])]))
    return pairs


@given(st.lists(st.sampled_from([0.0, 1.0]) | st.floats(-2, 2, allow_nan=False), min_size=2, max_size=8))
def test_ddof_one_is_the_sample_std(rewards: list[float]) -> None:
    values = group_advantages(rewards, "group", 1e-6, ddof=1)
    std = statistics.stdev(rewards)
    mean = statistics.fmean(rewards)
    expected = [0.0] * len(rewards) if std == 0 else [(r - mean) / (std + 1e-6) for r in rewards]
    assert values == pytest.approx(expected, rel=1e-9, abs=1e-9)


def test_ddof_zero_stays_the_default_population_std() -> None:
    rewards = [1.0, 0.0, 0.0, 0.0]
    assert SampleConfig().std_ddof == 0
    assert group_advantages(rewards)[0] == pytest.approx(0.75 / (statistics.pstdev(rewards) + 1e-4))
    assert group_advantages(rewards, ddof=1)[0] < group_advantages(rewards)[0]  # the sample std is larger


def test_failed_rollouts_are_masked_by_default_and_trained_with_the_failed_reward_when_set() -> None:
    pairs = group([1.0, 0.0, None, 1.0], failed=(2,))
    masked = build_sample_set(pairs, SampleConfig())
    assert masked.rollouts["r2"].masked and masked.rollouts["r2"].advantage == 0.0
    assert len(masked.rows) == 3

    filled = build_sample_set(pairs, SampleConfig(failed_reward=0.0))
    info = filled.rollouts["r2"]
    assert info.masked is None and info.reward == 0.0 and len(filled.rows) == 4
    mean = 0.5  # rewards 1, 0, 0 (filled), 1
    assert info.advantage == pytest.approx((0.0 - mean) / (statistics.pstdev([1, 0, 0, 1]) + 1e-4))
    assert math.isclose(sum(filled.rollouts[f"r{i}"].advantage for i in range(4)), 0.0, abs_tol=1e-9)


def test_bad_values_are_refused_with_the_field_named() -> None:
    with pytest.raises(ValueError, match="std_ddof"):
        SampleConfig(std_ddof=2)
    with pytest.raises(ValueError, match="failed_reward"):
        SampleConfig(failed_reward=float("nan"))
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        SampleConfig(max_prompt_tokens=-1)


def fragment(prompt: int, response_mask: list[int]) -> Fragment:
    n = prompt + len(response_mask)
    return Fragment([0], list(range(n)), [0] * prompt + response_mask,
                    [0.0] * prompt + [-0.1 if m else 0.0 for m in response_mask])


@pytest.mark.parametrize(("prompt", "cap", "kept"), [(10, 10, True), (11, 10, False), (10, 0, True)])
def test_a_prompt_over_the_cap_drops_the_row(prompt: int, cap: int, kept: bool) -> None:
    out = capped(fragment(prompt, [1, 1, 0, 1]), max_prompt_tokens=cap)
    assert (out is not None) is kept


@given(st.integers(0, 20), st.lists(st.sampled_from([0, 1]), min_size=1, max_size=30).map(lambda m: [1, *m]),
       st.integers(0, 40))
def test_a_response_cap_cuts_the_tail_and_never_reorders(prompt: int, mask: list[int], cap: int) -> None:
    part = fragment(prompt, mask)
    out = capped(part, max_response_tokens=cap)
    assert out is not None and prompt_length(out) == prompt
    length = prompt + min(len(mask), cap) if cap else prompt + len(mask)
    assert out.input_ids == part.input_ids[:length]
    assert out.loss_mask == part.loss_mask[:length] and out.old_logprobs == part.old_logprobs[:length]


def test_the_caps_apply_to_built_rows_and_name_the_dropped_calls() -> None:
    long_prompt = (RolloutRecord("a", task_id="t", group_id="t", status="finished", reward=1.0),
                   [call("a", 0, list(range(50)), [7, 8, 9])])
    long_response = (RolloutRecord("b", task_id="t", group_id="t", status="finished", reward=0.0),
                     [call("b", 0, [1, 2], list(range(100, 130)))])
    samples = build_sample_set([long_prompt, long_response], SampleConfig(max_prompt_tokens=20,
                                                                          max_response_tokens=8))
    assert [r.rollout_id for r in samples.rows] == ["b"]
    assert samples.rows[0].input_ids == [1, 2, *range(100, 108)]
    assert "max_prompt_tokens=20" in samples.rollouts["a"].skipped[0].reason
    uncapped = build_sample_set([long_prompt, long_response], SampleConfig())
    assert [len(r.input_ids) for r in uncapped.rows] == [53, 32]
