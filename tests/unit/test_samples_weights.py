"""Row weights: a rollout's rows share one rollout's weight (or, with ``fragment``, each row is an episode)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from repro.store import CallRecord, RolloutRecord
from repro.train.samples import SampleConfig, build_sample_set, row_weights
from tests.support import Drawn, rollout_calls


def finished(rollout_id: str, reward: float, group: str = "g") -> RolloutRecord:
    return RolloutRecord(rollout_id, task_id=group, group_id=group, status="finished", reward=reward)


@given(rollout_calls(max_calls=10), st.sampled_from(["per_call", "prefix_merge"]))
def test_rollout_weights_sum_to_one_and_follow_sampled_tokens(drawn: Drawn, mode: str) -> None:
    samples = build_sample_set([(finished("r", 1.0), drawn.calls)], SampleConfig(mode=mode))
    rows = samples.rows
    if not drawn.trainable:
        assert rows == []
        return
    assert sum(r.weight for r in rows) == pytest.approx(1.0, abs=1e-12)
    total = sum(r.n_sampled for r in rows)
    assert [r.weight for r in rows] == pytest.approx([r.n_sampled / total for r in rows])


@given(rollout_calls(max_calls=10))
def test_fragment_weights_are_one_per_row(drawn: Drawn) -> None:
    samples = build_sample_set([(finished("r", 1.0), drawn.calls)], SampleConfig(weighting="fragment"))
    assert [r.weight for r in samples.rows] == [1.0] * len(samples.rows)


def _calls(rollout_id: str, n: int, extend: bool) -> list[CallRecord]:
    """``n`` calls whose prompts all extend the previous row (one fragment) or never do (n fragments)."""
    calls, current = [], [1]
    for seq in range(n):
        prompt = [*current, 7] if extend else [1000 + seq, 7]
        completion = [100 + 3 * seq, 101 + 3 * seq, 102 + 3 * seq]
        calls.append(CallRecord(rollout_id, seq, "chat", "ok", prompt_ids=prompt, completion_ids=completion,
                                logprobs=[-0.5] * 3))
        current = prompt + completion
    return calls


def test_what_the_unit_changes_ten_fragments_against_one() -> None:
    pairs = [(finished("broken", 1.0), _calls("broken", 10, extend=False)),
             (finished("whole", 0.0), _calls("whole", 10, extend=True))]

    def totals(weighting: str) -> dict[str, float]:
        samples = build_sample_set(pairs, SampleConfig(weighting=weighting))
        assert len(samples.rollouts["broken"].rows) == 10 and len(samples.rollouts["whole"].rows) == 1
        return {rid: sum(r.weight for r in samples.rows if r.rollout_id == rid) for rid in ("broken", "whole")}

    assert totals("fragment") == {"broken": 10.0, "whole": 1.0}
    assert totals("rollout") == pytest.approx({"broken": 1.0, "whole": 1.0})


def test_row_weights_edge_cases() -> None:
    assert row_weights([]) == []
    assert row_weights([0, 0]) == [0.5, 0.5]  # no sampled tokens: split evenly
    assert row_weights([1, 3]) == [0.25, 0.75]
    assert row_weights([1, 3], "fragment") == [1.0, 1.0]
    with pytest.raises(ValueError, match="rollout, fragment"):
        row_weights([1], "token")
