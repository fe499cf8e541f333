"""No path from the agent to the fix through git, in the docker sandbox: the scripted git miner
(``tests/support.py``) recovers nothing in a rollout's container, for SWE-bench-shaped rows whose image holds the fix
as a future commit (branch, tag), SWE-smith-shaped rows (instance branch: "Bug Patch", then "Remove F2P Tests") and
bundled tasks' images, both where the sandbox starts the container (``open_container``) and where a harness does
(the container spec's start-up and diff commands, run as mini runs them). Control: with ``scrub_history=false`` the
same miner resolves the SWE-bench and SWE-smith rows. With the scrub, the gold patch applied in the agent's container
still resolves and no change still fails."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from repro.sandbox.docker import DockerSandbox, DockerSandboxConfig, DockerWorkspace
from repro.sandbox.docker_engine import exec_bounded, put_file
from repro.sandbox.images import build_task_images
from repro.sandbox.repos import RepoResolver
from repro.tasks.distributions import TaskDistributionConfig, build_distribution
from repro.tasks.schema import Task
from tests.docker_support import docker_engine, leaky_swebench_row, swesmith_layout_row
from tests.support import leaked_lines, mine_git

TASKS = TaskDistributionConfig(seed=0, split="test", n_tasks=2, families=["procedural"], operators=["recipe"],
                               difficulty="locate")


@pytest.fixture(scope="module")
def rows() -> tuple[Any, dict[str, list[Task]]]:
    engine = docker_engine()
    tasks = build_distribution(TASKS)
    build_task_images(engine, tasks, RepoResolver(Path("repos")), log=lambda _: None)
    return engine, {"bundled": tasks,
                    "swebench": [leaky_swebench_row(engine, t, i) for i, t in enumerate(tasks)],
                    "swesmith": [swesmith_layout_row(engine, t, 40 + i) for i, t in enumerate(tasks)]}


def start_tree(workspace: DockerWorkspace) -> str:
    return workspace.run("git ls-files -z | xargs -0 cat").output


def mine_where_the_sandbox_starts(sandbox: DockerSandbox, row: Task, rollout_id: str) -> tuple[str, str, str]:
    """(transcript, the starting tree's text, "grade outcome: reason") of the miner in an ``open_container``
    workspace."""
    workspace = sandbox.open_container(row, rollout_id)
    try:
        start = start_tree(workspace)
        transcript = mine_git(lambda command: workspace.run(command, 120).output)
        grade = sandbox.grade(row, workspace)
        return transcript, start, f"{grade.outcome}: {grade.reason}"
    finally:
        workspace.cleanup()


def mine_where_the_harness_starts(sandbox: DockerSandbox, row: Task, rollout_id: str) -> tuple[str, str, str]:
    """The same in a container started as a harness starts it from the workspace's container spec: the start-up
    command, the miner's commands, then the spec's diff command (its output is the graded patch)."""
    spec = sandbox.workspace(row, rollout_id).container_spec
    container = sandbox._start(spec.image, "rollout", rollout_id)
    try:
        if spec.startup_command:
            started = exec_bounded(container, spec.startup_command, spec.startup_timeout_s or 60)
            assert started.exit_code == 0, started.output
        run = lambda command: exec_bounded(container, command, 120).output  # noqa: E731
        start = run("git ls-files -z | xargs -0 cat")
        transcript = mine_git(run)
        diff = exec_bounded(container, spec.diff_command, 60)
        assert diff.exit_code == 0, diff.output
        grade = sandbox.grade_patch(row, diff.output)
        return transcript, start, f"{grade.outcome}: {grade.reason}"
    finally:
        container.remove(force=True)


MINERS = {"open_container": mine_where_the_sandbox_starts, "harness": mine_where_the_harness_starts}


@pytest.mark.parametrize("where", sorted(MINERS))
def test_the_miner_recovers_nothing_with_the_scrub(rows, where: str) -> None:
    engine, kinds = rows
    sandbox = DockerSandbox(DockerSandboxConfig(), engine)
    try:
        for kind, tasks in kinds.items():
            for i, row in enumerate(tasks):
                transcript, start, outcome = MINERS[where](sandbox, row, f"miner-{kind}-{i}")
                assert "miner: applied" not in transcript, (kind, row.instance_id, transcript[-2000:])
                assert leaked_lines(row.patch, transcript, start) == set(), (kind, row.instance_id)
                assert "Bug Patch" not in transcript and "Remove F2P" not in transcript, row.instance_id
                assert outcome.startswith("unresolved:"), (kind, row.instance_id, outcome)
    finally:
        sandbox.close()


def test_control_without_the_scrub_the_miner_resolves_the_rows(rows) -> None:
    engine, kinds = rows
    sandbox = DockerSandbox(DockerSandboxConfig(scrub_history=False), engine)
    try:
        for kind in ("swebench", "swesmith"):
            for i, row in enumerate(kinds[kind]):
                for where, mine in MINERS.items():
                    transcript, start, outcome = mine(sandbox, row, f"control-{kind}-{where}-{i}")
                    assert "miner: applied" in transcript, (kind, where, transcript[-2000:])
                    assert leaked_lines(row.patch, transcript, start), (kind, where, row.instance_id)
                    assert outcome.startswith("resolved:"), (kind, where, row.instance_id, outcome,
                                                            transcript[transcript.index("$ recover"):])
        for task in kinds["bundled"]:  # bundled images carry the base tree's root commit only, scrub or not
            workspace = sandbox.open_container(task, "control-bundled")
            try:
                assert workspace.run("git rev-list --all --reflog | wc -l").output.strip() == "1"
            finally:
                workspace.cleanup()
    finally:
        sandbox.close()


def test_with_the_scrub_the_gold_patch_in_the_agents_container_resolves(rows) -> None:
    engine, kinds = rows
    sandbox = DockerSandbox(DockerSandboxConfig(), engine)
    try:
        for kind, tasks in kinds.items():
            for i, row in enumerate(tasks):
                workspace = sandbox.open_container(row, f"gold-{kind}-{i}")
                try:
                    assert sandbox.grade(row, workspace).outcome == "unresolved", (kind, row.instance_id)
                    put_file(workspace.container, "/tmp/gold.diff", row.patch.encode())
                    applied = workspace.run("git apply /tmp/gold.diff")
                    assert applied.exit_code == 0, applied.output
                    grade = sandbox.grade(row, workspace)
                    assert grade.outcome == "resolved", (kind, row.instance_id, grade.reason)
                finally:
                    workspace.cleanup()
    finally:
        sandbox.close()
