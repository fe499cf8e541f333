"""verl's PPO mini-batch rule as Agent Lightning runs it (repro.train.batching): rows // M mini-batches of M rows,
capped, a step below M rows skipped, zero-advantage rows dropped first, the kept rows in their order."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from repro.train.batching import n_updates, plan_updates

M = 128  # Agent Lightning's SWE recipe: 16 tasks x n=8


@dataclass
class R:
    advantage: float


def rows(n: int, zero: int = 0) -> list[R]:
    """``n`` rows, the first ``zero`` of them zero-advantage."""
    return [R(0.0 if i < zero else 1.0) for i in range(n)]


@pytest.mark.parametrize(("n", "updates"), [(127, 0), (128, 1), (255, 1), (256, 2), (511, 2)])
def test_mini_batches_at_the_boundaries(n: int, updates: int) -> None:
    plan = plan_updates(rows(n), M, 2, random.Random(0))
    assert len(plan.mini_batches) == updates and all(len(b) == M for b in plan.mini_batches)
    assert plan.skipped == (updates == 0) and plan.dropped_zero_advantage + plan.dropped_other == n - updates * M


def test_a_step_below_one_mini_batch_is_skipped() -> None:
    plan = plan_updates(rows(127, zero=60), M, 2, random.Random(0))
    assert plan.skipped and plan.mini_batches == [] and plan.kept == []


def test_zero_advantage_rows_go_first_and_the_rest_keeps_its_order() -> None:
    plan = plan_updates(rows(255, zero=100), M, 2, random.Random(0))
    assert (plan.dropped_zero_advantage, plan.dropped_other) == (100, 27)
    kept = plan.kept
    assert kept == sorted(kept) and min(kept) >= 100  # every zero-advantage row dropped, nothing reordered


def test_the_cap_and_no_cap() -> None:
    assert n_updates(400, M, 2) == 2 and n_updates(400, M, 0) == 3 and n_updates(400, M, 5) == 3


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="max_ppo_updates must be >= 0"):
        n_updates(10, 2, -1)
    with pytest.raises(ValueError, match="ppo_mini_batch_rows > 0"):
        n_updates(10, 0, 2)


@given(advantages=st.lists(st.sampled_from([0.0, 1.0, -0.5]), max_size=60), m=st.integers(1, 16),
       cap=st.integers(0, 4), seed=st.integers(0, 3))
def test_plans_are_disjoint_full_capped_and_drop_zero_advantage_first(advantages: list[float], m: int, cap: int,
                                                                       seed: int) -> None:
    batch = [R(a) for a in advantages]
    plan = plan_updates(batch, m, cap, random.Random(seed))
    kept = plan.kept
    assert len(kept) == len(set(kept)) and all(len(b) == m for b in plan.mini_batches)
    full = len(batch) // m
    assert len(plan.mini_batches) == (min(full, cap) if cap else full)
    assert kept == sorted(kept)  # nothing reordered
    dropped = set(range(len(batch))) - set(kept)
    if any(batch[i].advantage != 0 for i in dropped):  # a non-zero row went only once every zero one had
        assert all(batch[i].advantage != 0 for i in kept)
    assert plan.dropped_zero_advantage == sum(1 for i in dropped if batch[i].advantage == 0)
