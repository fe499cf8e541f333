"""Bundled distributions end to end: every emitted task fails before its gold patch and passes after it (real
git clone + git apply + pytest), the empty patch resolves nothing, and the same seed gives the same tasks."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from repro.execution.pytest_runner import run_pytest
from repro.tasks.distributions import TaskDistributionConfig, build_distribution
from repro.tasks.schema import Task

PROCEDURAL = TaskDistributionConfig(seed=3, n_tasks=6, families=["procedural"], difficulty="mixed")
PACKAGES = TaskDistributionConfig(seed=3, n_tasks=4, families=["packages"], difficulty="mixed", split="test")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("repro-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REPRO_CACHE_DIR", str(root))
        yield root


@pytest.fixture(scope="module")
def tasks(cache: Path) -> list[Task]:
    return build_distribution(PROCEDURAL) + build_distribution(PACKAGES)


def grade(task: Task, patch: str, workdir: Path) -> dict[str, str]:
    """Statuses of FAIL_TO_PASS + PASS_TO_PASS in a fresh clone at base_commit with ``patch`` applied."""
    subprocess.run(["git", "clone", "-q", "--shared", task.repo_path, str(workdir)], check=True)
    subprocess.run(["git", "checkout", "-q", task.base_commit], cwd=workdir, check=True)
    if patch:
        (workdir / "gold.patch").write_text(patch)
        subprocess.run(["git", "apply", "gold.patch"], cwd=workdir, check=True)
    return run_pytest(workdir, task.FAIL_TO_PASS + task.PASS_TO_PASS, timeout_s=60).statuses


def resolved(task: Task, statuses: dict[str, str]) -> bool:
    return all(statuses.get(t) == "PASSED" for t in task.FAIL_TO_PASS + task.PASS_TO_PASS)


def test_every_task_fails_before_and_passes_after_its_gold_patch(tasks: list[Task], tmp_path: Path):
    assert len(tasks) == PROCEDURAL.n_tasks + PACKAGES.n_tasks
    jobs = [(t, patch, tmp_path / f"{i}-{bool(patch)}") for i, t in enumerate(tasks) for patch in ("", t.patch)]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda job: grade(*job), jobs))
    for (task, patch, _), statuses in zip(jobs, results, strict=True):
        if not patch:  # the empty patch: every FAIL_TO_PASS fails, every PASS_TO_PASS passes, not resolved
            assert all(statuses.get(t) in ("FAILED", "ERROR") for t in task.FAIL_TO_PASS), (task.instance_id, statuses)
            assert all(statuses.get(t) == "PASSED" for t in task.PASS_TO_PASS), task.instance_id
            assert not resolved(task, statuses)
        else:
            assert resolved(task, statuses), (task.instance_id, statuses)


def test_task_fields(tasks: list[Task]):
    families = {t.family for t in tasks}
    assert "procedural" in families and any(f.startswith("package:") for f in families)
    for task in tasks:
        assert task.repo.startswith("repro-bundled/")
        assert Path(task.repo_path).name == task.repo.replace("/", "__")
        assert len(task.base_commit) == 40 and task.base_commit != task.environment_setup_commit
        assert task.FAIL_TO_PASS and task.patch.startswith("diff --git a/")
        assert not set(task.FAIL_TO_PASS) & set(task.PASS_TO_PASS)
        assert task.difficulty in ("one_step", "multi_step") and task.operator
        ref = subprocess.run(["git", "rev-parse", f"refs/tasks/{task.instance_id}"], cwd=task.repo_path,
                             capture_output=True, text=True, check=True).stdout.strip()
        assert ref == task.base_commit
    assert len({t.instance_id for t in tasks}) == len(tasks)


def test_statements_describe_behaviour_not_the_diff(tasks: list[Task]):
    for task in tasks:
        text = task.problem_statement
        assert task.patch not in text and "diff --git" not in text
        assert "expected" in text or "raise" in text
        buggy, fixed = task.extra["buggy_line"].strip(), task.extra["fixed_line"].strip()
        if task.difficulty == "multi_step":
            assert not buggy or buggy not in text, task.instance_id
            assert all(line.strip() not in text for line in fixed.splitlines()), task.instance_id
            assert f"`{task.extra['file']}`" not in text
        else:
            assert task.extra["function"] in text and task.extra["file"] in text
            if task.family == "procedural" and buggy:
                assert f"on the line `{buggy}`" in text and "should be" in text


def _rows(tasks: list[Task]) -> list[dict]:
    return [{k: v for k, v in t.to_row().items() if k != "repo_path"} for t in tasks]


def test_same_seed_same_tasks_and_shas_in_a_fresh_cache(tasks: list[Task], cache: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch):
    other = tmp_path / "other-cache"
    shutil.copytree(cache / "tasks", other / "tasks")  # reuse pytest verdicts only; repositories are rebuilt
    monkeypatch.setenv("REPRO_CACHE_DIR", str(other))
    again = build_distribution(PROCEDURAL) + build_distribution(PACKAGES)
    assert _rows(again) == _rows(tasks)
    assert all(a.repo_path.startswith(str(other)) for a in again)


def test_different_seed_gives_different_tasks(tasks: list[Task]):
    other = build_distribution(replace(PROCEDURAL, seed=4))
    assert {t.instance_id for t in other}.isdisjoint(t.instance_id for t in tasks)
    assert {t.base_commit for t in other}.isdisjoint(t.base_commit for t in tasks)


def test_selection_by_operator_and_difficulty(cache: Path):
    picked = build_distribution(replace(PROCEDURAL, n_tasks=8, operators=["comparison"], difficulty="multi_step"))
    assert {t.operator for t in picked} <= {"comparison_flip", "negated_condition"}
    assert {t.difficulty for t in picked} == {"multi_step"}
    assert all(t.instance_id.split("-")[-2] == "ms" for t in picked)


def test_a_longer_build_extends_a_shorter_one(tasks: list[Task]):
    longer = build_distribution(replace(PROCEDURAL, n_tasks=9))
    assert _rows(longer[:6]) == _rows(tasks[:6])


def test_bad_selections_are_named(cache: Path):
    with pytest.raises(ValueError, match="unknown task family 'pkgs'"):
        build_distribution(replace(PROCEDURAL, families=["pkgs"]))
    with pytest.raises(ValueError, match="unknown bundled package 'nope'"):
        build_distribution(replace(PROCEDURAL, families=["package:nope"]))
    with pytest.raises(ValueError, match="unknown split"):
        build_distribution(replace(PROCEDURAL, split="dev"))
    with pytest.raises(ValueError, match="unknown difficulty"):
        build_distribution(replace(PROCEDURAL, difficulty="hard"))
