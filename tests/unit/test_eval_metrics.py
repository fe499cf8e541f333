"""Pass@k estimator, intervals, the infrastructure-failure rule, and the paired tests."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.evaluation.metrics import (
    MetricsConfig,
    bootstrap_interval,
    is_infra_failure,
    pass_at_k,
    summarize,
    wilson_interval,
)
from repro.evaluation.paired import align, mcnemar_exact, paired_bootstrap, sign_flip_test


@dataclass
class S:
    instance_id: str
    sample: int
    outcome: str
    harness_status: str = "finished"


nck = st.integers(1, 60).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n)))


@given(nck)
def test_pass_at_k_is_a_probability_and_matches_the_binomial_formula(args: tuple[int, int, int]) -> None:
    n, c, k = args
    value = pass_at_k(n, c, k)
    assert 0.0 <= value <= 1.0
    assert value == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-9)


@given(nck)
def test_pass_at_k_is_monotone_in_k_and_c(args: tuple[int, int, int]) -> None:
    n, c, k = args
    if k < n:
        assert pass_at_k(n, c, k + 1) >= pass_at_k(n, c, k) - 1e-12
    if c < n:
        assert pass_at_k(n, c + 1, k) >= pass_at_k(n, c, k) - 1e-12


@given(st.integers(1, 500).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n))))
def test_pass_at_1_is_c_over_n(args: tuple[int, int]) -> None:
    n, c = args
    assert pass_at_k(n, c, 1) == pytest.approx(c / n, abs=1e-12)


def test_pass_at_k_is_stable_for_large_n_and_rejects_bad_arguments() -> None:
    assert pass_at_k(2000, 1000, 100) == pytest.approx(1.0, abs=1e-12)
    assert pass_at_k(2000, 1, 1000) == pytest.approx(0.5)
    for bad in [(3, 4, 1), (3, 1, 0), (3, 1, 4), (3, -1, 1)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_wilson_interval_known_values() -> None:
    low, high = wilson_interval(0, 10)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=1e-4)
    low, high = wilson_interval(5, 10)
    assert (low, high) == (pytest.approx(0.2366, abs=1e-4), pytest.approx(0.7634, abs=1e-4))
    assert wilson_interval(0, 0) == (0.0, 1.0)


@given(st.integers(1, 300).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_wilson_interval_contains_the_estimate(args: tuple[int, int]) -> None:
    c, n = args
    low, high = wilson_interval(c, n)
    assert 0.0 <= low <= c / n <= high <= 1.0


def test_bootstrap_is_seeded_and_brackets_the_mean() -> None:
    scores = [1.0] * 30 + [0.0] * 70
    a = bootstrap_interval(scores, seed=3)
    assert a == bootstrap_interval(scores, seed=3)
    assert a != bootstrap_interval(scores, seed=4)
    assert a[0] < 0.3 < a[1] and a[1] - a[0] < 0.25
    assert bootstrap_interval([1.0, 1.0]) == (1.0, 1.0)


def test_infra_failures_leave_the_denominator_but_count_in_strict() -> None:
    samples = [S("a", 0, "resolved"), S("b", 0, "unresolved"), S("c", 0, "error"),
               S("d", 0, "timeout"), S("e", 0, "resolved", "crashed"), S("f", 0, "resolved")]
    assert [is_infra_failure(s) for s in samples] == [False, False, True, True, True, False]
    summary = summarize(samples)
    assert summary.n_tasks == 3 and summary.n_tasks_total == 6
    assert summary.pass_at_1 == pytest.approx(2 / 3)
    assert summary.strict_pass_at_1 == pytest.approx(2 / 6)
    assert summary.excluded_tasks == ["c", "d", "e"]
    assert summary.wilson[0] < 2 / 3 < summary.wilson[1]


def test_pass_at_1_is_the_mean_of_per_task_rates_with_k_samples() -> None:
    samples = [S("a", i, o) for i, o in enumerate(["resolved", "unresolved", "unresolved", "unresolved"])]
    samples += [S("b", i, "resolved") for i in range(4)]
    samples += [S("c", 0, "resolved"), S("c", 1, "error"), S("c", 2, "unresolved"), S("c", 3, "unresolved")]
    summary = summarize(samples, k_values=[1, 2, 4])
    assert summary.per_task == {"a": 0.25, "b": 1.0, "c": pytest.approx(1 / 3)}
    assert summary.pass_at_1 == pytest.approx((0.25 + 1 + 1 / 3) / 3)
    assert summary.strict_pass_at_1 == pytest.approx((0.25 + 1 + 0.25) / 3)
    assert summary.pass_at_k[2] == pytest.approx((pass_at_k(4, 1, 2) + 1 + pass_at_k(3, 1, 2)) / 3)
    assert summary.pass_at_k_tasks == {1: 3, 2: 3, 4: 2}  # c has only 3 valid samples
    assert summary.pass_at_k[4] == pytest.approx((1.0 + 1.0) / 2)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["resolved", "unresolved", "error", "timeout"])),
                min_size=1, max_size=40))
def test_summary_bounds(raw: list[tuple[int, str]]) -> None:
    samples = [S(f"t{task}", i, outcome) for i, (task, outcome) in enumerate(raw)]
    summary = summarize(samples, config=MetricsConfig(bootstrap_resamples=200))
    assert 0.0 <= summary.strict_pass_at_1 <= summary.pass_at_1 <= 1.0
    assert summary.n_tasks + len(summary.excluded_tasks) == summary.n_tasks_total
    if summary.n_tasks:
        assert summary.bootstrap[0] <= summary.pass_at_1 + 1e-9 and summary.pass_at_1 <= summary.bootstrap[1] + 1e-9


def test_unknown_outcomes_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown outcome"):
        summarize([S("a", 0, "passed")])


def test_mcnemar_exact_known_values() -> None:
    a = {f"t{i}": False for i in range(10)}
    b = {**a, **{f"t{i}": True for i in range(6)}}
    result = mcnemar_exact(a, b)
    assert (result.only_a, result.only_b, result.n) == (0, 6, 10)
    assert result.p_value == pytest.approx(2 / 64)
    b2 = {**a, "t0": True, "t1": True}
    a2 = {**a, "t2": True}
    assert mcnemar_exact(a2, b2).p_value == pytest.approx(1.0)  # 1 vs 2 discordant: p = 2 * 4/8 capped at 1
    assert mcnemar_exact(a, a).p_value == 1.0


def test_paired_bootstrap_sees_a_consistent_improvement() -> None:
    a = {f"t{i}": 0.0 for i in range(40)}
    b = {f"t{i}": 1.0 if i < 12 else 0.0 for i in range(40)}
    result = paired_bootstrap(a, b, seed=1)
    assert result.diff == pytest.approx(0.3) and result.low > 0
    assert not hasattr(result, "p_value")  # the share of resamples past 0 is no p-value: the sign-flip test gives it
    same = paired_bootstrap(a, a)
    assert (same.diff, same.low, same.high) == (0.0, 0.0, 0.0)


def test_sign_flip_test_on_per_instance_means() -> None:
    a = {f"t{i}": 0.25 for i in range(30)}
    up = {f"t{i}": 0.75 if i < 10 else 0.25 for i in range(30)}
    result = sign_flip_test(a, up)
    assert result.diff == pytest.approx(1 / 6) and result.p_value < 0.01 and result.n == 30
    assert sign_flip_test(up, a).p_value == pytest.approx(result.p_value)  # two-sided: symmetric
    assert sign_flip_test(a, a).p_value == 1.0
    # 6 up by 0.25, 4 down by 0.25: no evidence either way; exact p = P(|S| >= 2) for 10 fair signs = 0.754
    mixed = {**a, **{f"t{i}": 0.5 for i in range(6)}, **{f"t{i}": 0.0 for i in range(6, 10)}}
    assert sign_flip_test(a, mixed, resamples=50000).p_value == pytest.approx(0.754, abs=0.02)


@given(st.lists(st.floats(-1, 1, allow_nan=False), min_size=1, max_size=30))
@settings(max_examples=50, deadline=None)
def test_sign_flip_p_value_is_a_probability(diffs: list[float]) -> None:
    a = {f"t{i}": 0.0 for i in range(len(diffs))}
    b = {f"t{i}": d for i, d in enumerate(diffs)}
    assert 0.0 < sign_flip_test(a, b, resamples=200).p_value <= 1.0


def test_paired_tests_need_the_same_instances() -> None:
    with pytest.raises(ValueError, match="same instances"):
        mcnemar_exact({"a": True}, {"b": True, "a": False})
    assert align({"a": 1.0, "b": 0.0}, {"b": 1.0, "c": 0.0}, allow_subset=True) == ["b"]
    with pytest.raises(ValueError, match="share no instance"):
        align({"a": 1.0}, {"b": 1.0}, allow_subset=True)
