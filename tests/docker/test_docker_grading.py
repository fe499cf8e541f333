"""The docker sandbox grades as the local one does (gold / empty / a patch breaking a PASS_TO_PASS test, one task of
every bundled package x operator and procedural operator), and its faults end as infrastructure errors."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from repro.sandbox.docker import DockerSandbox, DockerSandboxConfig
from repro.sandbox.docker_engine import LABEL_RUN, ContainerLimits
from repro.sandbox.images import build_task_images
from repro.sandbox.local import LocalSandbox, LocalSandboxConfig
from repro.sandbox.repos import RepoResolver
from repro.tasks.distributions import SPLITS, TaskDistributionConfig, build_distribution
from repro.tasks.schema import Task
from tests.docker_support import docker_engine, p2p_breaking_patch


def one_per_kind(tasks: list[Task]) -> list[Task]:
    """The first task of each (family, operator)."""
    kinds: dict[tuple[str, str], Task] = {}
    for task in tasks:
        kinds.setdefault((task.family, task.operator), task)
    return list(kinds.values())


def parity_tasks(every: bool) -> list[Task]:
    packages = [t for split in (SPLITS if every else ("test",))
                for t in build_distribution(TaskDistributionConfig(split=split, n_tasks=0, families=["packages"]))]
    procedural = build_distribution(TaskDistributionConfig(split="test", n_tasks=100 if every else 40,
                                                           families=["procedural"]))
    return packages + procedural if every else one_per_kind(packages) + one_per_kind(procedural)


def verdicts(sandbox, task: Task, patches: dict[str, str | None]) -> dict[str, str]:
    return {name: sandbox.grade_patch(task, patch).outcome for name, patch in patches.items() if patch is not None}


def check_parity(tasks: list[Task]) -> None:
    engine = docker_engine()
    build_task_images(engine, tasks, RepoResolver(Path("repos")), log=lambda _: None)
    local, docker = LocalSandbox(LocalSandboxConfig()), DockerSandbox(DockerSandboxConfig(), engine)
    try:
        patches = {t.instance_id: {"gold": t.patch, "empty": "", "breaks_p2p": p2p_breaking_patch(local, t)}
                   for t in tasks}

        def both(task: Task) -> tuple[str, dict[str, str], dict[str, str]]:
            return (task.instance_id, verdicts(local, task, patches[task.instance_id]),
                    verdicts(docker, task, patches[task.instance_id]))

        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(both, tasks))
    finally:
        local.close()
        docker.close()
    differ = [r for r in results if r[1] != r[2]]
    assert not differ, f"{len(differ)} of {len(tasks)} tasks graded differently (local, docker): {differ[:3]}"
    expected = {"gold": "resolved", "empty": "unresolved", "breaks_p2p": "unresolved"}
    wrong = [r for r in results if any(expected[k] != v for k, v in r[1].items())]
    assert not wrong, f"verdicts other than gold=resolved, empty/breaking=unresolved: {wrong[:3]}"
    broken = sum("breaks_p2p" in r[1] for r in results)
    assert broken >= 0.8 * len(tasks), f"a PASS_TO_PASS-breaking patch was found for only {broken}/{len(tasks)}"
    assert len(engine.containers.list(all=True, filters={"label": f"{LABEL_RUN}={docker.run_id}"})) == 0


def test_docker_grades_as_local_on_every_kind_of_bundled_task() -> None:
    check_parity(parity_tasks(every=False))


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_docker_grades_as_local_on_every_bundled_task() -> None:
    check_parity(parity_tasks(every=True))


@pytest.fixture(scope="module")
def task_and_engine():
    engine = docker_engine()
    task = build_distribution(TaskDistributionConfig(split="test", n_tasks=0, families=["packages"]))[0]
    build_task_images(engine, [task], RepoResolver(Path("repos")), log=lambda _: None)
    return task, engine


def _patch_function(task: Task, body: str) -> str:
    """The gold patch with ``body`` run first in the function the task's first FAIL_TO_PASS test exercises: a
    patch that, say, hangs or allocates when the tests run."""
    local = LocalSandbox(LocalSandboxConfig())
    try:
        workspace = local.workspace(task, "fault")
        from repro.sandbox.repos import apply_patch

        assert apply_patch(workspace.path, task.patch) is None
        source = next(p for p in workspace.path.rglob("*.py") if "tests" not in p.parts and p.name != "__init__.py"
                      and p.read_text().count("\ndef ") > 0)
        source.write_text(source.read_text() + f"\n\n{body}\n")
        return workspace.diff()
    finally:
        local.close()


def test_a_hung_test_is_a_timeout_not_a_failed_task(task_and_engine) -> None:
    task, engine = task_and_engine
    hang = _patch_function(task, "import time\ntime.sleep(120)")  # at import: every test run hangs
    sandbox = DockerSandbox(DockerSandboxConfig(test_timeout_s=5), engine)
    try:
        result = sandbox.grade_patch(task, hang)
    finally:
        sandbox.close()
    assert result.outcome == "timeout", result
    assert "5 s" in result.reason and result.duration_s < 60


def test_running_out_of_memory_is_an_infrastructure_error(task_and_engine) -> None:
    task, engine = task_and_engine
    hog = _patch_function(task, "_hog = bytearray(400 * 1024 * 1024)")
    limits = ContainerLimits(memory_mb=128)
    sandbox = DockerSandbox(DockerSandboxConfig(limits=limits), engine)
    try:
        result = sandbox.grade_patch(task, hog)
    finally:
        sandbox.close()
    assert result.outcome == "error" and "out of memory" in result.reason, result


def test_a_patch_cannot_reach_the_network(task_and_engine) -> None:
    task, engine = task_and_engine
    sandbox = DockerSandbox(DockerSandboxConfig(), engine)
    workspace = sandbox.open_container(task, "net")
    try:
        probe = workspace.run("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 80), timeout=3)\"",
                              timeout_s=20)
        routes = workspace.run("cat /proc/net/route | wc -l")
    finally:
        workspace.cleanup()
        sandbox.close()
    assert probe.exit_code != 0 and "Network is unreachable" in probe.output, probe
    assert routes.output.strip() == "1"  # the header line only: no route at all


def test_a_missing_image_names_it_and_how_to_build_it(task_and_engine) -> None:
    task, engine = task_and_engine
    sandbox = DockerSandbox(DockerSandboxConfig(bundled_namespace="repro-absent"), engine)
    result = sandbox.grade_patch(task, task.patch)
    assert result.outcome == "error" and "repro images build" in result.reason and "repro-absent" in result.reason


class _FailingEngine:
    """The real engine, except that starting a container fails as a crashed daemon call would."""

    def __init__(self, engine) -> None:
        self._engine = engine
        self.images = engine.images
        self.containers = self

    def run(self, *args, **kwargs):
        import docker.errors

        raise docker.errors.APIError("500 Server Error: the daemon call failed (injected)")

    def list(self, *args, **kwargs):
        return self._engine.containers.list(*args, **kwargs)


def test_a_failed_engine_call_is_an_infrastructure_error(task_and_engine) -> None:
    task, engine = task_and_engine
    result = DockerSandbox(DockerSandboxConfig(), _FailingEngine(engine)).grade_patch(task, task.patch)
    assert result.outcome == "error" and "docker engine call failed" in result.reason, result


def test_the_working_tree_is_fresh_for_every_rollout(task_and_engine) -> None:
    task, engine = task_and_engine
    sandbox = DockerSandbox(DockerSandboxConfig(), engine)
    try:
        first = sandbox.open_container(task, "a")
        first.run("echo junk >> README.extra && git rm -q -r --cached . >/dev/null")
        assert "README.extra" in first.diff()
        second = sandbox.open_container(task, "b")
        assert second.diff() == "" and second.run("git status --porcelain").output == ""
        assert dataclasses.asdict(sandbox.config.limits)["network"] == "none"
    finally:
        sandbox.close()
    assert engine.containers.list(all=True, filters={"label": f"{LABEL_RUN}={sandbox.run_id}"}) == []
