"""The real mini-SWE-agent 1.17.5 (text mode, one ``mini`` per rollout).

- Bundled tasks through the recording proxy and the real CPU model server, chosen by the registry from
  ``version: 1.17.5`` (``evaluate_job``): every call is recorded with its token ids and every rollout finishes.
- Against a scripted text stub (no model server): ``Submitted``, ``LimitsExceeded`` after format errors, and a
  dead endpoint crashing only its rollout.

First use builds the 1.17.5 env (~1 min).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml

from harness_adapters.mini_swe_agent.adapter import MiniSweAgentConfig, ensure_mini_swe_agent_env
from harness_adapters.mini_swe_agent.v1 import FINISHED_EXIT_STATUSES, MiniSweAgentV1Harness
from repro.common.net import free_port
from repro.experiments.evaluate import evaluate_job
from repro.protocols import HarnessRollout
from repro.proxy import ProxyConfig
from repro.recipe.setup import Setup
from repro.rl.evaluator import EvalConfig
from repro.sandbox.local import LocalSandboxConfig
from repro.serving.stack import CpuServingConfig
from repro.store import open_store
from repro.tasks.distributions import TaskDistributionConfig
from repro.tasks.schema import Task
from repro.testing import StubChatServer, text_reply
from repro.tinymodel.model import TinyModelConfig

V1 = MiniSweAgentConfig(version="1.17.5", mode="text", step_limit=2, max_tokens=32)
TASKS = TaskDistributionConfig(seed=0, split="test", n_tasks=2, families=["packages", "procedural"])
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


@pytest.fixture(scope="module")
def v1_env():
    return ensure_mini_swe_agent_env(V1.version)


def test_bundled_tasks_through_the_proxy_are_fully_recorded(v1_env, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    setup = Setup(TinyModelConfig(vocab_size=512), CpuServingConfig(), ProxyConfig(port=0), V1, "mini-swe-agent",
                  LocalSandboxConfig())
    metrics = evaluate_job(setup, TASKS, EvalConfig(experiment="v1", max_tokens=32, concurrency=2), run_dir)
    assert metrics["n_samples"] == 2 and metrics["complete"]
    assert metrics["spec"]["harness"]["version"] == "1.17.5"
    system = yaml.safe_load((v1_env.site_packages / "minisweagent/config/mini.yaml").read_text())["agent"][
        "system_template"]
    store = open_store(run_dir / "traces.sqlite")
    reports = [json.loads(p.read_text()) for p in run_dir.glob("instances/*/sample-0/report.json")]
    assert len(reports) == 2
    for report in reports:
        assert report["harness_status"] == "finished", report["harness_reason"]
        assert report["harness_exit_status"] in FINISHED_EXIT_STATUSES
        assert store.get_rollout(report["rollout_id"]).harness_version == "1.17.5"
        calls = store.calls(report["rollout_id"])
        assert len(calls) == report["n_calls"] >= 1
        assert [c.seq for c in calls] == list(range(len(calls)))
        for call in calls:
            assert call.status in ("ok", "truncated")
            assert call.prompt_ids and call.completion_ids
            assert "tools" not in call.request  # text mode: the action is a ```bash block in the content
        # the builtin 1.x system template, rendered by Jinja (which drops one trailing newline)
        assert calls[0].request["messages"][0] == {"role": "system", "content": system.removesuffix("\n")}


@pytest.fixture(params=["fork", "exec"])
def harness(v1_env, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[MiniSweAgentV1Harness]:
    with MiniSweAgentV1Harness(V1, env=v1_env, state_dir=tmp_path / "state", launcher=request.param) as h:
        yield h


def test_submit_limit_and_dead_endpoint(harness: MiniSweAgentV1Harness, tmp_path: Path) -> None:
    replies = {"submit": f"Writing it.\n\n```bash\necho $PWD > out.txt && {SUBMIT}\n```",
               "chatty": "I will think about it, no command yet."}
    dead = f"http://127.0.0.1:{free_port()}/rollouts/down/v1"
    with StubChatServer(text_reply(replies.__getitem__)) as stub:
        rollouts = []
        for rollout_id in ("submit", "chatty", "down"):
            workdir = tmp_path / rollout_id / "work"
            workdir.mkdir(parents=True)
            task = Task(instance_id=rollout_id, repo="o/r", base_commit="0" * 40, problem_statement="Write out.txt.")
            url = dead if rollout_id == "down" else stub.url(rollout_id)
            rollouts.append(HarnessRollout(rollout_id, task, workdir, url, "stub", tmp_path / rollout_id / "out", 120))
        submit, chatty, down = harness.run(rollouts, concurrency=3)
    assert (submit.status, submit.exit_status, submit.n_model_calls) == ("finished", "Submitted", 1), submit
    jailed = harness.identity()["isolation"] == "jail"  # jailed, the working copy is at /testbed in the jail
    where = "/testbed" if jailed else str((tmp_path / "submit/work").resolve())
    assert (tmp_path / "submit/work/out.txt").read_text().strip() == where
    assert (chatty.status, chatty.exit_status, chatty.n_model_calls) == ("finished", "LimitsExceeded", 2), chatty
    messages = json.loads(Path(chatty.trajectory_path).read_text())["messages"]
    assert sum("EXACTLY ONE action" in m["content"] for m in messages if m["role"] == "user") == 2
    assert down.status == "crashed" and down.reason.startswith("uncaught error, exit status "), down
    assert down.exit_status not in FINISHED_EXIT_STATUSES and down.duration_s < 60
    assert sorted(stub.paths) == ["/rollouts/chatty/v1/chat/completions"] * 2 + ["/rollouts/submit/v1/chat/completions"]
    assert {r.info["launcher"] for r in (submit, chatty, down)} == {harness.launcher}


def test_forked_and_exec_rollouts_are_the_same_conversation(v1_env, tmp_path: Path) -> None:
    """The fork server changes how ``mini`` starts, not what it does: the same stub replies give the same
    requests, trajectory messages and exit statuses as a fresh ``mini`` process."""
    reply = "Looking.\n\n```bash\nls -a && cat nothing.txt\n```"
    seen: dict[str, list] = {}
    for launcher in ("exec", "fork"):
        with MiniSweAgentV1Harness(V1, env=v1_env, state_dir=tmp_path / launcher / "state",
                                   launcher=launcher) as h, StubChatServer(text_reply(lambda _: reply)) as stub:
            workdir = tmp_path / launcher / "work"
            workdir.mkdir(parents=True)
            (workdir / "a.txt").write_text("a\n")
            task = Task(instance_id="t", repo="o/r", base_commit="0" * 40, problem_statement="Look around.")
            rollout = HarnessRollout("r", task, workdir, stub.url("r"), "stub", tmp_path / launcher / "out", 120)
            [result] = h.run([rollout], concurrency=1)
            messages = [(m["role"], m["content"])  # (not its timestamp, nor the raw response's id and time)
                        for m in json.loads(Path(result.trajectory_path).read_text())["messages"]]
            text = json.dumps([result.status, result.exit_status, result.n_model_calls, messages])
            seen[launcher] = json.loads(text.replace(str(tmp_path / launcher), "<root>"))
    assert seen["fork"] == seen["exec"]
    assert seen["fork"][:3] == ["finished", "LimitsExceeded", 2]


def test_a_forked_rollout_past_its_timeout_is_killed(harness: MiniSweAgentV1Harness, tmp_path: Path) -> None:
    reply = "Waiting.\n\n```bash\nsleep 300\n```"
    with StubChatServer(text_reply(lambda _: reply)) as stub:
        workdir = tmp_path / "slow" / "work"
        workdir.mkdir(parents=True)
        task = Task(instance_id="slow", repo="o/r", base_commit="0" * 40, problem_statement="Wait.")
        [result] = harness.run([HarnessRollout("slow", task, workdir, stub.url("slow"), "stub",
                                               tmp_path / "slow" / "out", 8)], concurrency=1)
    assert result.status == "timeout", result
    assert not [p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [])[-2:] == ["-c", "sleep 300"]]
