"""``locate`` tasks: the statement names the faulty line by its first words only; mixtures of difficulties."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from repro.recipe.miniature import split_train
from repro.tasks.blobs import buggy_files
from repro.tasks.distributions import TaskDistributionConfig, build_distribution
from repro.tasks.probe import Symptom
from repro.tasks.statements import unique_prefix

SOURCE = "def f(a, b):\n    x = a - b\n    y = a - b + 1\n    return x - y\n"


def test_unique_prefix_is_the_shortest_run_of_words_on_no_other_line() -> None:
    assert unique_prefix("    x = a - b", SOURCE) == "x ="
    assert unique_prefix("    return x - y", SOURCE) == "return x"
    assert unique_prefix("    y = a - b + 1", SOURCE) == "y ="
    assert unique_prefix("    x = a - b", SOURCE + "def g():\n    x = a - b\n") is None  # the same line twice


def test_symptom_assertion_is_one_runnable_line_or_none() -> None:
    symptom = Symptom("tests/test_m.py::test_f_1", "f(1, 2)", "returns `-1`", "`3`", imports=("from m import f",))
    assert symptom.assertion() == "from m import f; assert f(1, 2) == 3"
    assert Symptom("t", "f(1)", "returns `1`", "`<object>`", imports=("from m import f",)).assertion() is None
    assert Symptom("t", "f(1)", "returns `1`", "`2`", setup=("x = 1",), imports=("from m import f",)).assertion() \
        is None


@pytest.fixture(scope="module")
def locate_tasks() -> list:
    return build_distribution(TaskDistributionConfig(seed=0, split="validation", n_tasks=12, families=["procedural"],
                                                     operators=["recipe"], difficulty="locate"))


def test_locate_statements_name_the_line_by_a_unique_prefix(locate_tasks: list) -> None:
    files = buggy_files((t, t.extra["file"]) for t in locate_tasks)
    for task in locate_tasks:
        buggy = task.extra["buggy_line"].strip()
        (prefix,) = re.findall(r"on the line that starts with `([^`]+)`", task.problem_statement)
        lines = files[(task.base_commit, task.extra["file"])].splitlines()
        assert buggy.startswith(prefix) and sum(prefix in line for line in lines) == 1
        assert task.difficulty == "locate" and "-lc-" in task.instance_id
        assert prefix == buggy or f"`{buggy}`" not in task.problem_statement  # the line itself must be looked up
        assert task.extra["check"].startswith("from ") and " == " in task.extra["check"]


def test_a_mixture_of_difficulties_is_a_fixed_draw_per_task() -> None:
    cfg = TaskDistributionConfig(seed=0, split="validation", n_tasks=40, families=["procedural"],
                                 operators=["recipe"], difficulty="one_step_brief+locate")
    tasks = build_distribution(cfg)
    counts = Counter(t.difficulty for t in tasks)
    assert set(counts) == {"one_step_brief", "locate"} and min(counts.values()) >= 10
    assert [t.instance_id for t in build_distribution(cfg)] == [t.instance_id for t in tasks]
    demos, rl = split_train(tasks, 20, rl_difficulty="locate")
    assert demos == tasks[:20] and rl and all(t.difficulty == "locate" for t in rl)
    with pytest.raises(SystemExit, match="leaves none for RL of difficulty multi_step"):
        split_train(tasks, 20, rl_difficulty="multi_step")
    with pytest.raises(ValueError, match="unknown difficulty 'hard'"):
        build_distribution(TaskDistributionConfig(split="validation", n_tasks=2, difficulty="locate+hard"))
