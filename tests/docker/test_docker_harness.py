"""The unchanged mini-SWE-agent 2.4.6 acting inside task containers through its own ``DockerEnvironment``: the
scripted expert (real CPU server, real proxy) looks the line up, edits it and submits on ``locate`` tasks; each
rollout's patch is read inside its container and graded in a fresh one; no container outlives the run. And a run
killed with SIGKILL leaves containers that the next run removes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness_adapters.mini_swe_agent.adapter import MiniSweAgentConfig
from repro.sandbox.docker import DockerSandbox, DockerSandboxConfig
from repro.sandbox.docker_engine import LABEL_PID, LABEL_RUN, labelled
from repro.sandbox.images import build_task_images
from repro.sandbox.repos import RepoResolver
from repro.store import open_store
from repro.tasks.distributions import TaskDistributionConfig, build_distribution
from tests.docker_support import docker_engine
from tests.support import run_expert

TASKS = TaskDistributionConfig(seed=0, split="test", n_tasks=3, families=["procedural"], operators=["recipe"],
                               difficulty="locate")
HARNESS = MiniSweAgentConfig(step_limit=4)


@pytest.fixture(scope="module")
def docker_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    engine = docker_engine()
    build_task_images(engine, build_distribution(TASKS), RepoResolver(Path("repos")), log=lambda _: None)
    sandbox = DockerSandbox(DockerSandboxConfig(), engine)
    left: list = []
    try:
        run = run_expert(tmp_path_factory.mktemp("docker-expert"), TASKS, HARNESS, sandbox, "docker-expert",
                         while_up=lambda box: left.extend(_gone_within(engine, box.run_id, 30.0)))
    finally:
        sandbox.close()
    return run | {"left": left}


def _gone_within(engine, run_id: str, seconds: float) -> list:
    deadline = time.monotonic() + seconds
    while (left := labelled(engine, f"{LABEL_RUN}={run_id}")) and \
            time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def test_the_harness_acts_inside_the_task_container_and_resolves(docker_run: dict) -> None:
    for task, result, grade, workspace in zip(docker_run["tasks"], docker_run["results"], docker_run["grades"],
                                              docker_run["workspaces"], strict=True):
        assert result.status == "finished" and result.exit_status == "Submitted", result
        assert grade.outcome == "resolved", (task.instance_id, grade.reason)
        trajectory = json.loads(Path(result.trajectory_path).read_text())
        environment = trajectory["info"]["config"]
        assert environment["environment_type"] == "minisweagent.environments.docker.DockerEnvironment"
        assert environment["environment"]["image"] == workspace.image.name
        assert "--network" in environment["environment"]["run_args"]
        assert workspace.diff().startswith("diff --git") and result.n_model_calls >= 3


def test_every_call_is_recorded_under_its_rollout(docker_run: dict) -> None:
    store = open_store(docker_run["store"])
    for i, result in enumerate(docker_run["results"]):
        calls = store.calls(f"docker-expert-{i}")
        assert len(calls) == result.n_model_calls >= 3


def test_the_harness_removed_its_containers(docker_run: dict) -> None:
    assert docker_run["left"] == []


def _run_containers(engine, pid: int) -> list:
    return labelled(engine, f"{LABEL_PID}={pid}")


@pytest.mark.e2e
def test_a_run_killed_with_sigkill_leaves_nothing_after_the_next_run(tmp_path: Path) -> None:
    engine = docker_engine()
    overrides = ["experiment=eval_bundled", "sandbox=docker", "tasks.n_tasks=8", "tasks.families=[procedural]",
                 "eval.k=1", "eval.concurrency=4", "harness.step_limit=40", f"run.output_root={tmp_path}/first"]
    build_task_images(engine, build_distribution(TaskDistributionConfig(split="test", n_tasks=8,
                                                                        families=["procedural"])),
                      RepoResolver(Path("repos")), log=lambda _: None)
    proc = subprocess.Popen([sys.executable, "-m", "repro.cli.commands", "run", *overrides], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 240
    while len(_run_containers(engine, proc.pid)) < 3 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)  # several rollouts in flight: some container is mid-rollout, not being stopped
    assert _run_containers(engine, proc.pid), "the run started no container"
    os.killpg(proc.pid, signal.SIGKILL)  # the run and its workers: nobody is left to clean up
    proc.wait()
    time.sleep(1)
    assert _run_containers(engine, proc.pid), "containers vanished without a sweep: the test shows nothing"
    second = subprocess.run([sys.executable, "-m", "repro.cli.commands", "run", *overrides[:-1], "tasks.n_tasks=1",
                             f"run.output_root={tmp_path}/second"], capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "left by runs that are gone" in second.stdout
    assert _run_containers(engine, proc.pid) == []


def _leftover_sleeps(engine, interpreter_bound: bool, tmp_path: Path) -> str:
    """Run `sleep 300` through mini's own DockerEnvironment with a 2 s command timeout, then list what still runs
    in its container 9 s later."""
    from harness_adapters.mini_swe_agent.adapter import (
        ensure_mini_swe_agent_env,
        rollout_settings,
        swebench_environment,
    )
    from repro.protocols import ContainerSpec
    from repro.sandbox.docker_engine import label_args, run_labels

    env = ensure_mini_swe_agent_env("2.4.6")
    labels = run_labels(f"bound-{interpreter_bound}-{os.getpid()}", "rollout")
    spec = ContainerSpec("repro/base:" + docker_base_tag(engine), "/", ["--network", "none", *label_args(labels)],
                         "true", 2.0)
    settings = rollout_settings("", "http://unused", Path("/"), spec, swebench_environment(env.site_packages))
    environment = settings["environment"]
    if not interpreter_bound:
        environment["interpreter"] = environment["interpreter"][4:]
    script = ("import json, sys, time\nfrom minisweagent.environments.docker import DockerEnvironment\n"
              "e = DockerEnvironment(**json.loads(sys.argv[1]))\n"
              "out = e.execute({'command': 'sleep 300'})\ntime.sleep(9)\n"
              "print(e.execute({'command': 'cat /proc/[0-9]*/cmdline | tr \"\\\\0\" \" \"'})['output'])\n"
              "import subprocess; subprocess.run(['docker', 'rm', '-f', e.container_id], capture_output=True)\n")
    proc = subprocess.run([str(env.python), "-c", script, json.dumps(environment)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def docker_base_tag(engine) -> str:
    from repro.sandbox.images import base_image_name

    return base_image_name().split(":", 1)[1]


def test_a_command_past_its_timeout_is_stopped_inside_the_container(tmp_path: Path) -> None:
    engine = docker_engine()
    with ThreadPoolExecutor(2) as pool:  # each waits 9 s in its own container: side by side
        bound, unbound = pool.map(lambda interpreter_bound: _leftover_sleeps(engine, interpreter_bound, tmp_path),
                                  (True, False))
    assert "sleep 300" not in bound
    assert "sleep 300" in unbound  # mini's own timeout leaves it running
