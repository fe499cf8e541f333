"""The data pipeline's stages on real rows: drops by statement, starting point and test count (each stage's count),
and the kept set split by a seeded draw."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from repro.experiments.data_pipeline import split_kept, static_filters
from repro.tasks.distributions import TaskDistributionConfig, build_distribution
from repro.tasks.loaders import load_tasks

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_static_filters_drop_by_statement_start_and_test_count() -> None:
    tasks = build_distribution(TaskDistributionConfig(split="train", n_tasks=6, families=["procedural"]))
    smith = load_tasks(str(FIXTURES / "swesmith_sample.jsonl"))
    rows = [dataclasses.replace(tasks[0], problem_statement="  \n"), *tasks[1:4],
            dataclasses.replace(tasks[4], PASS_TO_PASS=[f"t.py::test_{i}" for i in range(300)]), *smith]
    missing = {smith[0].instance_id: "image missing"}
    kept, stages = static_filters(rows, 200, lambda t: missing.get(t.instance_id))
    assert [c for _, c in stages] == [6, 5, 4, 3]
    assert [t.instance_id for t in kept] == [t.instance_id for t in tasks[1:4]]


def test_the_split_is_a_seeded_draw_of_the_kept_tasks() -> None:
    kept = build_distribution(TaskDistributionConfig(split="train", n_tasks=20, families=["procedural"]))
    train, val = split_kept(kept, 5, seed=0)
    assert len(val) == 5 and len(train) == 15 and {t.instance_id for t in train}.isdisjoint(
        t.instance_id for t in val)
    assert split_kept(kept, 5, seed=0) == (train, val) and split_kept(kept, 5, seed=1)[1] != val
    assert [t.instance_id for t in train] == [t.instance_id for t in kept if t not in val]  # kept order
