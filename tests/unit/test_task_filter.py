"""The Agent Lightning task filter: which probed tasks RL keeps, and the pass@k curve of the probes."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from repro.train.task_filter import (
    ALL_FAIL,
    ALL_PASS,
    MIXED,
    TaskFilterConfig,
    outcome_class,
    pass_at_k_curve,
    select_tasks,
)

FIXTURE = {  # 8 probes each: 3 mixed, 3 all-fail, 2 all-pass
    "a": [True, False, False, False, False, False, False, False],
    "b": [False] * 8,
    "c": [True] * 8,
    "d": [True, True, False, True, False, False, True, False],
    "e": [False] * 8,
    "f": [False] * 7 + [True],
    "g": [True] * 8,
    "h": [False] * 8,
}

outcome_maps = st.dictionaries(st.text(min_size=1, max_size=6), st.lists(st.booleans(), min_size=2, max_size=8),
                               max_size=40)


def test_fixture_keeps_mixed_then_a_share_of_all_fail() -> None:
    result = select_tasks(FIXTURE, all_fail_share=0.25, seed=0)
    assert result.kept[:3] == ["a", "d", "f"]  # every mixed task, in candidate order
    assert len(result.kept) == 4 and result.kept[3] in {"b", "e", "h"}  # 1 all-fail = 25% of 4
    assert result.counts() == {MIXED: 3, ALL_FAIL: 3, ALL_PASS: 2, "kept": 4, "kept_all_fail": 1}
    assert "c" not in result.kept and "g" not in result.kept


def test_no_all_fail_share_keeps_only_mixed() -> None:
    assert select_tasks(FIXTURE, all_fail_share=0.0).kept == ["a", "d", "f"]


def test_all_fail_draw_depends_on_the_seed_only() -> None:
    draws = {tuple(select_tasks(FIXTURE, 0.25, seed=s).kept) for s in range(12)}
    assert len(draws) > 1
    reordered = dict(reversed(FIXTURE.items()))  # which all-fail tasks are drawn does not depend on their order
    assert set(select_tasks(FIXTURE, 0.25, seed=3).kept) == set(select_tasks(reordered, 0.25, seed=3).kept)


def test_outcome_class() -> None:
    assert outcome_class([True, False]) == MIXED
    assert outcome_class([False, False]) == ALL_FAIL
    assert outcome_class([True, True]) == ALL_PASS
    with pytest.raises(ValueError, match="without probe outcomes"):
        outcome_class([])


def test_config_refuses_what_cannot_filter() -> None:
    with pytest.raises(ValueError, match="at least 2 probes"):
        TaskFilterConfig(k=1)
    with pytest.raises(ValueError, match="all_fail_share"):
        TaskFilterConfig(all_fail_share=1.0)


def test_pass_at_k_curve_on_the_fixture() -> None:
    curve = pass_at_k_curve(FIXTURE)
    assert list(curve) == list(range(1, 9))
    solved = sum(map(sum, FIXTURE.values()))
    assert curve[1] == pytest.approx(solved / 64)  # pass@1 is the mean success rate
    assert curve[8] == pytest.approx(5 / 8)  # pass@n: the share of tasks solved at least once


@given(outcome_maps, st.floats(min_value=0.0, max_value=0.9), st.integers(0, 5))
def test_kept_is_every_mixed_task_and_never_an_all_pass_one(outcomes: dict, share: float, seed: int) -> None:
    result = select_tasks(outcomes, share, seed)
    mixed = [i for i, o in outcomes.items() if 0 < sum(o) < len(o)]
    assert result.kept[: len(mixed)] == mixed
    assert len(set(result.kept)) == len(result.kept)
    assert all(not all(outcomes[i]) for i in result.kept)
    n_fail = len(result.kept) - len(mixed)
    available = sum(1 for o in outcomes.values() if not any(o))
    assert n_fail == min(available, round(share / (1 - share) * len(mixed)))


@given(outcome_maps)
def test_pass_at_k_curve_never_decreases(outcomes: dict) -> None:
    curve = list(pass_at_k_curve(outcomes).values())
    assert all(0.0 <= x <= 1.0 for x in curve)
    assert all(b >= a - 1e-12 for a, b in itertools.pairwise(curve))
