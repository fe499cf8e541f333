"""Slow (``pytest -m slow``): every bundled package task, in every split, and a procedural sample, is graded
resolved with its gold patch and unresolved with the empty patch by the local sandbox."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from repro.sandbox.local import LocalSandbox, LocalSandboxConfig
from repro.tasks.distributions import SPLITS, TaskDistributionConfig, build_distribution


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize(("families", "n_tasks"), [(["packages"], 0), (["procedural"], 100)])
def test_every_bundled_task_is_validated_by_its_gold_patch(families: list[str], n_tasks: int) -> None:
    tasks = [t for split in SPLITS
             for t in build_distribution(TaskDistributionConfig(split=split, n_tasks=n_tasks, families=families))]
    sandbox = LocalSandbox(LocalSandboxConfig())

    def verdicts(task):
        return task.instance_id, sandbox.grade_patch(task, task.patch).outcome, sandbox.grade_patch(task, "").outcome

    try:
        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(verdicts, tasks))
    finally:
        sandbox.close()
    bad = [r for r in results if r[1:] != ("resolved", "unresolved")]
    assert tasks and not bad, f"{len(bad)} of {len(tasks)} tasks misgraded, e.g. {bad[:5]}"
