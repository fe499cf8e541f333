"""No path from the agent to the fix through git, in the local sandbox: a scripted git miner (``tests/support.py``:
``git log --all``, ``git show HEAD~1``, reflog, fsck, stash, tags, branches, every object; then it applies the
reverse of HEAD~1 and the smallest change towards any commit HEAD does not descend from) recovers nothing from an
agent copy, for bundled tasks and for a SWE-bench-shaped row whose repository holds the fix as a future commit, a
tag, a branch and a stash. Control: the same miner resolves the same tasks in a raw clone of their repositories."""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.sandbox.local import LocalSandbox, LocalWorkspace
from repro.tasks.distributions import TaskDistributionConfig, build_distribution
from repro.tasks.schema import Task
from tests.support import leaked_lines, make_leaky_calc_repo, make_sandbox, mine_git, raw_clone, tree_text

BUNDLED = [TaskDistributionConfig(seed=0, split="test", n_tasks=2, families=["procedural"], difficulty="locate"),
           TaskDistributionConfig(seed=0, split="test", n_tasks=2, families=["packages"])]


def _miner_in(sandbox: LocalSandbox, workspace: LocalWorkspace) -> str:
    return mine_git(lambda command: sandbox.run(workspace, command, 60).output)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> list[Task]:
    leaky, _ = make_leaky_calc_repo(tmp_path_factory.mktemp("repos") / "acme__calc")
    return [leaky, *(t for config in BUNDLED for t in build_distribution(config)[:2])]


def test_the_miner_recovers_nothing_from_an_agent_copy(tasks: list[Task], tmp_path: Path) -> None:
    sandbox = make_sandbox(tmp_path / "repos", tmp_path / "ws")
    try:
        for i, task in enumerate(tasks):
            workspace = sandbox.workspace(task, f"miner-{i}")
            start = tree_text(workspace.path)
            transcript = _miner_in(sandbox, workspace)
            assert "miner: applied" not in transcript, (task.instance_id, transcript[-2000:])
            assert leaked_lines(task.patch, transcript, start) == set(), task.instance_id
            assert workspace.diff() == ""
            grade = sandbox.grade(task, workspace)
            assert grade.outcome == "unresolved", (task.instance_id, grade.reason)
            assert sandbox.grade_patch(task, task.patch).outcome == "resolved", task.instance_id
    finally:
        sandbox.close()


def test_control_the_same_miner_resolves_the_tasks_in_a_raw_clone(tasks: list[Task], tmp_path: Path) -> None:
    sandbox = make_sandbox(tmp_path / "repos", tmp_path / "ws")
    try:
        for i, task in enumerate(tasks):
            repo, sha = sandbox.resolver.resolve(task)
            clone = tmp_path / f"clone-{i}"
            clone.mkdir()
            raw_clone(repo.path, sha, clone)
            workspace = LocalWorkspace(clone, sha, tmp_path / f"home-{i}")
            start = tree_text(clone)
            transcript = _miner_in(sandbox, workspace)
            assert "miner: applied" in transcript, (task.instance_id, transcript[-2000:])
            assert leaked_lines(task.patch, transcript, start), task.instance_id
            grade = sandbox.grade(task, workspace)
            assert grade.outcome == "resolved", (task.instance_id, grade.reason)
    finally:
        sandbox.close()
