"""Which tasks an RL step takes: one seeded order for every pass (the default), or a new order each pass
(``rl.reshuffle_each_epoch``, verl's sampler); either way every task once per pass and none twice in a step."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from repro.rl.config import RLConfig
from repro.rl.steps import step_tasks
from repro.tasks.schema import Task


def tasks(n: int) -> list[Task]:
    return [Task(instance_id=f"t{i}", repo="o/r", base_commit="c", problem_statement="p") for i in range(n)]


def ids(picked: list[Task]) -> list[str]:
    return [t.instance_id for t in picked]


@given(st.integers(1, 40), st.integers(1, 12), st.integers(0, 5), st.booleans())
def test_a_pass_takes_every_task_once_and_a_step_never_repeats_one(n: int, per_step: int, seed: int,
                                                                  reshuffle: bool) -> None:
    cfg = RLConfig(tasks_per_step=per_step, seed=seed, reshuffle_each_epoch=reshuffle)
    pool = tasks(n)
    steps = [ids(step_tasks(pool, cfg, s)) for s in range(3 * n)]
    assert all(len(s) == len(set(s)) == min(per_step, n) for s in steps)
    if n % per_step == 0:  # steps tile the passes exactly: each pass is a permutation
        per_pass = n // per_step
        for p in range(3):
            seen = Counter(i for s in steps[p * per_pass:(p + 1) * per_pass] for i in s)
            assert set(seen.values()) == {1} and len(seen) == n


def test_the_default_repeats_one_order_and_reshuffling_gives_each_pass_its_own() -> None:
    pool = tasks(32)
    fixed = RLConfig(tasks_per_step=16, seed=3)
    fresh = RLConfig(tasks_per_step=16, seed=3, reshuffle_each_epoch=True)
    passes = {name: [ids(step_tasks(pool, cfg, 2 * p)) + ids(step_tasks(pool, cfg, 2 * p + 1)) for p in range(3)]
              for name, cfg in (("fixed", fixed), ("fresh", fresh))}
    assert passes["fixed"][0] == passes["fixed"][1] == passes["fixed"][2]
    assert passes["fresh"][0] == passes["fixed"][0]  # the first pass is the default's order
    assert len({tuple(p) for p in passes["fresh"]}) == 3
    assert step_tasks(pool, fresh, 5) == step_tasks(pool, fresh, 5)  # seeded: the same on every call
