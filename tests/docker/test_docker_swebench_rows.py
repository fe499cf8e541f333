"""SWE-bench rows in docker: the image found by swebench's naming, graded by swebench's own eval script (conda
activation, test files reset, test_patch heredoc, the repository's test command) and the repository's log parser,
the same verdicts as the bundled path; the harness acts in such an image through mini's SWE-bench environment."""

from __future__ import annotations

import pytest

from repro.sandbox.docker import DockerSandbox, DockerSandboxConfig
from repro.sandbox.eval_script import eval_spec
from repro.sandbox.local import LocalSandbox, LocalSandboxConfig
from repro.tasks.distributions import TaskDistributionConfig, build_distribution
from tests.docker_support import docker_engine, p2p_breaking_patch, swebench_layout_row


@pytest.fixture(scope="module")
def rows():
    engine = docker_engine()
    tasks = build_distribution(TaskDistributionConfig(split="test", n_tasks=0, families=["packages"]))[:3]
    return engine, [(task, swebench_layout_row(engine, task, i)) for i, task in enumerate(tasks)]


def test_swebench_rows_are_graded_by_swebenchs_script_as_the_bundled_tasks(rows) -> None:
    engine, pairs = rows
    sandbox = DockerSandbox(DockerSandboxConfig(), engine)
    local = LocalSandbox(LocalSandboxConfig())
    try:
        for task, row in pairs:
            assert eval_spec(row, row.base_commit).source == "swebench"
            assert sandbox.image(row).name.startswith("swebench/sweb.eval.x86_64.pallets_1776_flask-9000")
            breaking = p2p_breaking_patch(local, task)
            verdicts = [sandbox.grade_patch(row, p).outcome for p in (row.patch, "", breaking)]
            assert verdicts == ["resolved", "unresolved", "unresolved"], (row.instance_id, verdicts)
    finally:
        sandbox.close()
        local.close()
