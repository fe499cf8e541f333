"""The red team inside a task container (``sandbox=docker``): the model (a scripted stub) has the unchanged
mini-SWE-agent 2.4.6 run the red-team agent's program (``tests/integration/test_red_team.py``) with its own
``DockerEnvironment``, in the task's container (network off, nothing of the host mounted). It recovers nothing and
the task does not resolve: no task file with the gold patch, no other rollout's working copy, no host process, no
proxy, model server or other port, no Docker socket. The control, the same program and harness without isolation
in the local sandbox, finds the task file and resolves: ``tests/integration/test_red_team_mini.py``."""

from __future__ import annotations

import json
import re
from pathlib import Path

from harness_adapters.mini_swe_agent.adapter import MiniSweAgentConfig
from harness_adapters.registry import get_harness
from repro.protocols import HarnessRollout
from repro.sandbox.docker import DockerSandbox, DockerSandboxConfig
from repro.sandbox.images import build_task_images
from repro.sandbox.repos import RepoResolver
from repro.tasks.distributions import TaskDistributionConfig, build_distribution
from repro.testing import StubChatServer
from tests.docker_support import docker_engine
from tests.integration.test_red_team import agent_program, scene
from tests.integration.test_red_team_mini import scripted
from tests.support import RunningProxy

TASKS = TaskDistributionConfig(seed=0, split="test", n_tasks=1, families=["procedural"])
REPORT = re.compile(r'\{\\*"found\\*": \{[^{}]*\}, \\*"own_model_call\\*": (?:null|\d+)\}')  # its last line


def test_the_red_team_in_a_task_container_recovers_nothing(tmp_path: Path, proxy: RunningProxy,
                                                           fake_upstream) -> None:
    engine = docker_engine()
    (task,) = build_distribution(TASKS)
    build_task_images(engine, [task], RepoResolver(Path("repos")), log=lambda _: None)
    sandbox = DockerSandbox(DockerSandboxConfig(), engine)
    try:
        with scene(tmp_path, proxy, fake_upstream[1]) as s:
            tasks_file = Path(s.targets["task_file"])
            tasks_file.write_text(json.dumps(task.to_row()) + "\n")  # this container's task, gold patch included
            program = agent_program(s.targets | {"statement": task.problem_statement})
            workspace = sandbox.workspace(task, "red")
            with StubChatServer(scripted(program, "toolcall")) as stub, \
                    get_harness("mini-swe-agent", MiniSweAgentConfig(step_limit=4)) as harness:
                rollout = HarnessRollout("red", task, workspace.path, stub.url("red"), "m", tmp_path / "out", 300.0,
                                         container=workspace.container_spec)
                (result,) = harness.run([rollout], 1)
            workspace.adopt(result)
            assert (result.status, result.exit_status) == ("finished", "Submitted"), result.reason
            text = Path(result.trajectory_path).read_text()  # the report, escaped once or twice (output, message)
            (report,) = {re.sub(r'\\+"', '"', match) for match in REPORT.findall(text)}
            found = json.loads(report)["found"]
            assert found == {}, found
            assert sandbox.grade(task, workspace).outcome != "resolved"
    finally:
        sandbox.close()
