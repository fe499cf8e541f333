"""The real mini-SWE-agent 2.4.6 in long-lived workers (MiniSweAgentHarness) against a scripted stub.

The stub answers each rollout's requests on its own ``/rollouts/<id>/v1`` path with a ``bash`` tool call
chosen per rollout, so cross-talk between concurrent rollouts (endpoint, workdir) shows up in the files.
First run builds the harness env (~1 min).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil
import pytest

from harness_adapters.mini_swe_agent.adapter import MiniSweAgentConfig, ensure_mini_swe_agent_env, run_mini_swe_agent
from harness_adapters.mini_swe_agent.pool import MiniSweAgentHarness
from repro.common.net import free_port
from repro.protocols import HarnessResult, HarnessRollout
from repro.tasks.schema import Task
from repro.testing import StubChatServer, tool_call_reply

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def write_own_id(rollout_id: str) -> str:
    return f"echo {rollout_id} > out.txt && {SUBMIT}"


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniSweAgentHarness]:
    env = ensure_mini_swe_agent_env()
    with MiniSweAgentHarness(MiniSweAgentConfig(), env=env, state_dir=tmp_path_factory.mktemp("pool")) as pool:
        yield pool


def make_rollouts(tmp_path: Path, urls: Callable[[str], str], ids: list[str], timeout_s: float = 60.0):
    rollouts = []
    for rollout_id in ids:
        workdir = tmp_path / rollout_id / "work"
        workdir.mkdir(parents=True)
        task = Task(
            instance_id=rollout_id,
            repo="o/r",
            base_commit="0" * 40,
            problem_statement="Write your rollout id into out.txt.",
        )
        rollouts.append(
            HarnessRollout(
                rollout_id, task, workdir, urls(rollout_id), "stub-model", tmp_path / rollout_id / "out", timeout_s
            )
        )
    return rollouts


@pytest.fixture(scope="module")
def strict_harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniSweAgentHarness]:
    """Gives a silent worker 1 s past a rollout's timeout; replaces a worker as soon as one thread is stuck."""
    env = ensure_mini_swe_agent_env()
    state_dir = tmp_path_factory.mktemp("strict")
    with MiniSweAgentHarness(MiniSweAgentConfig(), env=env, state_dir=state_dir, grace_s=1, max_abandoned=0) as pool:
        yield pool


def worker_processes() -> list[psutil.Process]:
    return [
        p
        for p in psutil.Process().children(recursive=True)
        if any("worker.py" in part for part in p.cmdline())
    ]


def test_rollouts_run_concurrently_in_one_worker(harness: MiniSweAgentHarness, tmp_path: Path) -> None:
    ids = [f"c{i}" for i in range(6)]
    with StubChatServer(tool_call_reply(write_own_id), delay_s=lambda rollout_id: 1.0) as stub:
        started = time.monotonic()
        results = harness.run(make_rollouts(tmp_path, stub.url, ids), concurrency=6)
        elapsed = time.monotonic() - started
        pids = harness.worker_pids()
        assert len(worker_processes()) == 1
        again = harness.run(make_rollouts(tmp_path / "again", stub.url, ["d0", "d1"]), concurrency=2)
    assert stub.max_open >= 4, "rollouts did not overlap"
    assert elapsed < 4.0, "six 1-second model calls should overlap"
    assert [r.rollout_id for r in results] == ids
    for rollout_id, result in zip(ids, results, strict=True):
        assert (result.status, result.exit_status, result.n_model_calls) == ("finished", "Submitted", 1), result
        assert (tmp_path / rollout_id / "work" / "out.txt").read_text() == f"{rollout_id}\n"
        assert stub.requests_for(rollout_id) == [f"/rollouts/{rollout_id}/v1/chat/completions"]
        trajectory = json.loads(Path(result.trajectory_path).read_text())
        assert trajectory["info"]["exit_status"] == "Submitted"
        assert json.loads((tmp_path / rollout_id / "out" / "harness_run.json").read_text())["status"] == "finished"
    assert len(stub.paths) == len(ids) + 2
    assert [r.status for r in again] == ["finished", "finished"]
    assert harness.worker_pids() == pids and len(pids) == 1
    assert {r.info["worker_pid"] for r in results + again} == set(pids)


def test_worker_builds_the_agent_the_cli_builds(tmp_path: Path) -> None:
    """Same config files and options -> same resolved agent/model/environment config and same messages (unjailed:
    the ``mini`` one-shot path runs mini's own local environment)."""
    harness = MiniSweAgentHarness(MiniSweAgentConfig(isolation="none"), state_dir=tmp_path / "state")
    with StubChatServer(tool_call_reply(write_own_id)) as stub, harness:
        (pooled,) = harness.run(make_rollouts(tmp_path / "pool", stub.url, ["same"]), concurrency=1)
        cli_work = tmp_path / "cli" / "same" / "work"  # same layout as make_rollouts, under another root
        cli_work.mkdir(parents=True)
        cli = run_mini_swe_agent(
            "Write your rollout id into out.txt.",
            cli_work,
            stub.url("same"),
            "stub-model",
            harness.cfg,
            tmp_path / "cli" / "same" / "out",
            timeout_s=120,
        )
    assert pooled.status == cli.status == "finished"
    assert harness.identity() == asdict(cli.identity) | {"isolation": "none"}
    assert _comparable(Path(pooled.trajectory_path), tmp_path / "pool") == _comparable(
        cli.trajectory_path, tmp_path / "cli"
    )


def _comparable(trajectory: Path, root: Path) -> dict[str, Any]:
    data = json.loads(trajectory.read_text().replace(str(root.resolve()), "<root>"))
    messages = [(m["role"], m.get("content")) for m in data["messages"]]
    return {"config": data["info"]["config"], "messages": messages, "exit_status": data["info"]["exit_status"]}


def test_dead_endpoint_crashes_only_its_rollout(harness: MiniSweAgentHarness, tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with StubChatServer(tool_call_reply(write_own_id)) as stub:

        def url(rollout_id: str) -> str:
            return f"{dead}/rollouts/{rollout_id}/v1" if rollout_id == "down" else stub.url(rollout_id)

        down, up = harness.run(make_rollouts(tmp_path, url, ["down", "up"]), concurrency=2)
    assert down.status == "crashed"
    assert "Connection error" in down.reason, down.reason
    assert down.exit_status == "InternalServerError"  # mini's word for the uncaught LiteLLM error
    assert down.duration_s < 30
    assert "minisweagent/agents/default.py" in down.info["error"]  # the traceback tail
    assert (up.status, up.exit_status) == ("finished", "Submitted")


@pytest.mark.parametrize("strict", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_overrun_is_a_timeout_and_the_agent_stops(harness: MiniSweAgentHarness, tmp_path: Path, strict: bool) -> None:
    """``strict`` also checks that mini itself ends with TimeExceeded and makes no further model call. Under
    load that part raced once (mini started one more step before it saw the lowered wall-time limit), so it
    runs with ``-m slow`` until the watchdog stops the agent deterministically."""
    def command(rollout_id: str) -> str:
        return "echo $$ > pid.txt && sleep 60.1" if rollout_id == "slow" else write_own_id(rollout_id)

    with StubChatServer(tool_call_reply(command)) as stub:
        pids = harness.worker_pids()
        slow, quick = harness.run(make_rollouts(tmp_path, stub.url, ["slow", "quick"], timeout_s=3), concurrency=2)
        assert slow.status == "timeout", slow
        assert 3 <= slow.duration_s < 10
        assert quick.status == "finished"
        assert (tmp_path / "slow" / "work" / "pid.txt").exists()
        assert _eventually(lambda: not _sleeping("60.1")), "the timed-out rollout's command still runs"
        if strict:
            trajectory = Path(tmp_path / "slow" / "out" / "trajectory.traj.json")
            assert _eventually(lambda: json.loads(trajectory.read_text())["info"]["exit_status"] == "TimeExceeded")
            assert stub.requests_for("slow") == ["/rollouts/slow/v1/chat/completions"]  # no model call after it
    assert harness.worker_pids() == pids


def test_killed_worker_crashes_its_rollouts_and_is_restarted(harness: MiniSweAgentHarness, tmp_path: Path) -> None:
    def command(rollout_id: str) -> str:
        return "echo $$ > pid.txt && sleep 60.2" if rollout_id.startswith("k") else write_own_id(rollout_id)

    with StubChatServer(tool_call_reply(command)) as stub:
        (old_pid,) = harness.worker_pids()
        starts = harness.n_worker_starts
        outcome: list[list[HarnessResult]] = []
        ids = ["k0", "k1", "k2"]
        thread = threading.Thread(target=lambda: outcome.append(harness.run(make_rollouts(tmp_path, stub.url, ids), 3)))
        thread.start()
        assert _eventually(lambda: all((tmp_path / i / "work" / "pid.txt").exists() for i in ids), 30)
        os.kill(old_pid, signal.SIGKILL)
        thread.join(timeout=30)
        assert not thread.is_alive()
        (crashed,) = outcome
        assert [r.status for r in crashed] == ["crashed"] * 3
        assert all(f"pid {old_pid} exited with code -9" in r.reason for r in crashed), crashed[0].reason
        assert _eventually(lambda: not _sleeping("60.2")), "orphaned agent commands still run"
        (after,) = harness.run(make_rollouts(tmp_path / "after", stub.url, ["after"]), concurrency=1)
    assert (after.status, after.exit_status) == ("finished", "Submitted")
    assert harness.n_worker_starts == starts + 1
    assert harness.worker_pids() != [old_pid] and len(worker_processes()) == 1


def test_silent_worker_is_killed_after_the_grace(strict_harness: MiniSweAgentHarness, tmp_path: Path) -> None:
    with StubChatServer(tool_call_reply(lambda rollout_id: "echo $$ > pid.txt && sleep 60.3")) as stub:
        (old_pid,) = strict_harness.worker_pids()
        outcome: list[list[HarnessResult]] = []
        rollouts = make_rollouts(tmp_path, stub.url, ["frozen"], timeout_s=2)
        thread = threading.Thread(target=lambda: outcome.append(strict_harness.run(rollouts, 1)))
        thread.start()
        assert _eventually(lambda: (tmp_path / "frozen" / "work" / "pid.txt").exists(), 30)
        os.kill(old_pid, signal.SIGSTOP)  # its watchdog can no longer report
        thread.join(timeout=30)
        ((frozen,),) = outcome
        assert frozen.status == "timeout" and "no report 1 s after the 2 s timeout" in frozen.reason, frozen
        assert not _alive(old_pid)
        assert _eventually(lambda: not _sleeping("60.3"))


def test_worker_with_stuck_threads_is_replaced_when_idle(strict_harness: MiniSweAgentHarness, tmp_path: Path) -> None:
    """A thread stuck in a model request outlives its timeout report; max_abandoned=0 retires that worker."""
    stuck_delay = lambda rollout_id: 30.0 if rollout_id == "stuck" else 0.0  # noqa: E731
    with StubChatServer(tool_call_reply(write_own_id), delay_s=stuck_delay) as stub:
        (stuck,) = strict_harness.run(make_rollouts(tmp_path, stub.url, ["stuck"], timeout_s=2), 1)
        pids, starts = strict_harness.worker_pids(), strict_harness.n_worker_starts
        (after,) = strict_harness.run(make_rollouts(tmp_path, stub.url, ["after"]), 1)
    assert stuck.status == "timeout" and "watchdog" in stuck.reason, stuck
    assert (after.status, after.exit_status) == ("finished", "Submitted")
    assert strict_harness.n_worker_starts == starts + 1
    assert strict_harness.worker_pids() != pids


def _eventually(check: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return True
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.1)
    return False


def _sleeping(seconds: str) -> bool:
    """Whether an agent command ``sleep <seconds>`` still runs (found by its command line: a jailed command's ``$$``
    is a pid of its own namespace)."""
    for process in psutil.process_iter(["cmdline", "status"]):
        if process.info["cmdline"] == ["sleep", seconds] and process.info["status"] != psutil.STATUS_ZOMBIE:
            return True
    return False


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_rollouts_env_reaches_the_agents_commands(harness: MiniSweAgentHarness, tmp_path: Path) -> None:
    """The sandbox's command environment (``HarnessRollout.env``, e.g. PATH led by the task's interpreter) is what
    the agent's shell sees, through mini's own ``environment.env``; a rollout without one keeps the worker's."""
    bin_dir = tmp_path / "task-bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text("#!/bin/sh\necho task-python\n")
    (bin_dir / "python").chmod(0o755)
    command = lambda rollout_id: f"python > out.txt; {SUBMIT}"  # noqa: E731
    with StubChatServer(tool_call_reply(command)) as stub:
        rollouts = make_rollouts(tmp_path, stub.url, ["env0", "env1"])
        rollouts[0].env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
        results = harness.run(rollouts, concurrency=2)
    assert [r.status for r in results] == ["finished", "finished"]
    assert (tmp_path / "env0" / "work" / "out.txt").read_text() == "task-python\n"
    assert (tmp_path / "env1" / "work" / "out.txt").read_text() != "task-python\n"


def test_a_jailed_command_past_its_timeout_reads_as_the_agents_own(tmp_path: Path) -> None:
    """Jailed (the default), a command past mini's command timeout is killed and the agent's observation quotes its
    own command, not the jail's prefix (``jailed``); the trajectory names the jailed environment."""
    cfg = MiniSweAgentConfig(command_timeout_s=1, step_limit=2)
    with MiniSweAgentHarness(cfg, state_dir=tmp_path / "state") as pool:
        if pool.identity()["isolation"] != "jail":
            pytest.skip("no jail on this machine")
        with StubChatServer(tool_call_reply("sleep 30.4")) as stub:
            (result,) = pool.run(make_rollouts(tmp_path, stub.url, ["slow"]), concurrency=1)
    trajectory = json.loads(Path(result.trajectory_path).read_text())
    observation = next(m for m in trajectory["messages"] if m["role"] == "tool")["content"]
    assert "sleep 30.4" in observation and "timed out" in observation
    assert "unshare" not in observation and "jail_init" not in observation
    assert trajectory["info"]["config"]["environment_type"] == "repro_mswea_jailed.JailedLocalEnvironment"
    assert not _sleeping("30.4")
