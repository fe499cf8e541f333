"""SWE-smith rows in docker: a row in SWE-smith's exact schema (bug-introducing ``patch``, ``image_name``, no
``base_commit``), its image in SWE-smith's layout (the instance branch: "Bug Patch", then "Remove F2P Tests");
graded with the instance branch's tests restored (gold = the reversed bug patch: resolved; empty and a patch that
breaks a PASS_TO_PASS test: unresolved); mini-SWE-agent 2.4.6 and 1.17.5 act at the instance branch, started by
the row's start-up command inside the container."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness_adapters.mini_swe_agent.adapter import MiniSweAgentConfig
from repro.sandbox.docker import DockerSandbox, DockerSandboxConfig
from repro.sandbox.local import LocalSandbox, LocalSandboxConfig
from repro.tasks.distributions import TaskDistributionConfig, build_distribution
from tests.docker_support import docker_engine, p2p_breaking_patch, swesmith_layout_row
from tests.support import run_expert

TASKS = TaskDistributionConfig(seed=0, split="test", n_tasks=2, families=["procedural"], operators=["recipe"],
                               difficulty="locate")


@pytest.fixture(scope="module")
def smith_rows():
    engine = docker_engine()
    tasks = build_distribution(TASKS)
    return engine, [(task, swesmith_layout_row(engine, task, i)) for i, task in enumerate(tasks)]


def test_swesmith_rows_are_graded_at_the_bug_commit_with_their_tests_back(smith_rows) -> None:
    engine, pairs = smith_rows
    sandbox = DockerSandbox(DockerSandboxConfig(), engine)
    local = LocalSandbox(LocalSandboxConfig())
    try:
        for task, row in pairs:
            assert sandbox.image(row).name == row.extra["image_name"]
            breaking = p2p_breaking_patch(local, task)
            verdicts = [sandbox.grade_patch(row, p).outcome for p in (row.patch, "", breaking)]
            assert verdicts == ["resolved", "unresolved", "unresolved"], (row.instance_id, verdicts)
    finally:
        sandbox.close()
        local.close()


@pytest.mark.parametrize("version,mode", [("2.4.6", "toolcall"), ("1.17.5", "text")])
def test_the_harness_starts_at_the_instance_branch_and_resolves(smith_rows, tmp_path: Path, version: str,
                                                                mode: str) -> None:
    engine, pairs = smith_rows
    sandbox = DockerSandbox(DockerSandboxConfig(), engine)
    try:
        run = run_expert(tmp_path, TASKS, MiniSweAgentConfig(version=version, mode=mode, step_limit=4), sandbox,
                         f"smith-{version.replace('.', '_')}", rows=[row for _, row in pairs])
    finally:
        sandbox.close()
    for row, result, grade, workspace in zip(run["tasks"], run["results"], run["grades"], run["workspaces"],
                                             strict=True):
        assert result.status == "finished" and result.exit_status == "Submitted", result
        assert grade.outcome == "resolved", (row.instance_id, grade.reason)
        patch = workspace.diff()
        # on `main` (no start-up command) the patch against the instance branch would re-add the deleted tests
        assert patch.count("diff --git") == 1 and "tests/" not in patch.splitlines()[0], patch
        trajectory = json.loads(Path(result.trajectory_path).read_text())
        assert json.dumps(trajectory).count(row.extra["image_name"]) >= 1
    assert engine.containers.list(all=True, filters={"label": f"repro.run={sandbox.run_id}"}) == []
