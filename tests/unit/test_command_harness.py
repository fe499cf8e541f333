"""harness=command: templates, the agent's environment, and how a run ends (finished / crashed / timeout)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from harness_adapters.command import CommandConfig, CommandHarness, gave_up_after_truncation
from harness_adapters.registry import get_harness
from repro.protocols import HarnessRollout
from repro.tasks.schema import Task

SHOW = ("import json, os, pathlib, sys; print(json.dumps({{'argv': sys.argv[1:], 'cwd': os.getcwd(), "
        "'env': dict(os.environ), 'task': pathlib.Path(os.environ['REPRO_TASK_FILE']).read_text()}}))")


def _rollout(tmp_path: Path, timeout_s: float = 30) -> HarnessRollout:
    workdir = tmp_path / "repo"
    workdir.mkdir(exist_ok=True)
    task = Task(instance_id="t1", repo="o/r", base_commit="0", problem_statement="Fix add().")
    return HarnessRollout(rollout_id="r1", task=task, workdir=workdir, base_url="http://127.0.0.1:9/rollouts/r1/v1",
                          model_name="tiny", output_dir=tmp_path / "out", timeout_s=timeout_s,
                          env={"PATH": "/sandbox/bin:/usr/bin"})


def _run(tmp_path: Path, cfg: CommandConfig, timeout_s: float = 30):
    with get_harness("command", cfg) as harness:
        (result,) = harness.run([_rollout(tmp_path, timeout_s)], concurrency=1)
    return result


@pytest.mark.parametrize(("api", "base"), [("chat", "http://127.0.0.1:9/rollouts/r1/v1"),
                                           ("responses", "http://127.0.0.1:9/rollouts/r1/v1"),
                                           ("messages", "http://127.0.0.1:9/rollouts/r1")])
def test_templates_env_and_cwd_reach_the_agent(tmp_path: Path, monkeypatch, api: str, base: str) -> None:
    monkeypatch.setenv("SOME_SECRET_API_KEY", "sk-real-never-passed")
    cfg = CommandConfig(command=[sys.executable, "-c", SHOW, "{base_url}", "{model}", "{task}", "{workdir}"],
                        api=api, env={"AGENT_URL": "{anthropic_base_url}/x"})
    result = _run(tmp_path, cfg)
    assert result.status == "finished" and result.reason == "exit 0"
    seen = json.loads((tmp_path / "out" / "stdout.log").read_text())
    assert seen["argv"] == [base, "tiny", "Fix add().", str((tmp_path / "repo").resolve())]
    assert seen["cwd"] == str((tmp_path / "repo").resolve()) and seen["task"] == "Fix add()."
    env = seen["env"]
    assert env["OPENAI_BASE_URL"] == "http://127.0.0.1:9/rollouts/r1/v1"
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9/rollouts/r1"
    assert env["AGENT_URL"] == "http://127.0.0.1:9/rollouts/r1/x" and env["REPRO_MODEL"] == "tiny"
    assert env["PATH"] == "/sandbox/bin:/usr/bin" and env["HOME"] == str((tmp_path / "out" / "home").resolve())
    assert "SOME_SECRET_API_KEY" not in env


def test_a_failing_agent_is_crashed_with_its_last_words(tmp_path: Path) -> None:
    cfg = CommandConfig(command=[sys.executable, "-c", "import sys; sys.exit('agent gave up: no model')"])
    result = _run(tmp_path, cfg)
    assert result.status == "crashed" and result.reason == "exit code 1: agent gave up: no model"
    record = json.loads((tmp_path / "out" / "command_result.json").read_text())
    assert record["status"] == "crashed" and record["identity"]["name"] == "command"


def test_a_hung_agent_is_killed_as_a_timeout(tmp_path: Path) -> None:
    cfg = CommandConfig(command="sh -c 'sleep 60 & sleep 60'")
    result = _run(tmp_path, cfg, timeout_s=1)
    assert result.status == "timeout" and result.duration_s < 30


def test_an_agent_that_cannot_start_is_crashed(tmp_path: Path) -> None:
    result = _run(tmp_path, CommandConfig(command=["/nonexistent/agent"]))
    assert result.status == "crashed" and "could not start" in result.reason


@pytest.mark.parametrize(("cfg", "message"), [
    ({"command": []}, "needs harness.command"),
    ({"command": ["x", "{nope}"]}, "its fields are"),
    ({"command": ["python", "-c", "print({'a': 1})"]}, "a literal brace is written {{"),
    ({"command": ["x"], "env": {"A": "{base_url"}}, "is not valid"),
    ({"command": ["x"], "api": "grpc"}, "harness.api must be one of chat, responses, messages"),
])
def test_bad_configs_fail_before_anything_runs(cfg: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CommandConfig(**cfg)


def test_identity_changes_with_what_defines_the_agent() -> None:
    a = CommandHarness(CommandConfig(command="python agent.py {task_file}")).identity()
    b = CommandHarness(CommandConfig(command="python agent.py {task_file}", api="messages")).identity()
    assert a["settings"]["command"] == ["python", "agent.py", "{task_file}"]
    assert a["files_sha256"] != b["files_sha256"]


GIVE_UP = ("import json, os, sys, urllib.request; body = json.dumps({{'model': 'm', 'max_tokens': N_TOKENS, "
           "'messages': [{{'role': 'user', 'content': 'hi'}}]}}).encode(); "
           "urllib.request.urlopen(urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions', body, "
           "{{'content-type': 'application/json'}})).read(); sys.exit('the reply was cut, giving up')")


@pytest.mark.parametrize(("max_tokens", "status"), [(4, "finished"), (64, "crashed")], ids=["cut", "whole"])
def test_giving_up_after_a_cut_reply_is_the_models_doing(tmp_path: Path, proxy, max_tokens: int,
                                                         status: str) -> None:
    """An agent that exits 1 after the model's last reply hit the token limit (Claude Code, Codex) finished: the
    model's outcome, not an infrastructure failure; the same exit after a whole reply is a crash."""
    base = proxy.new_rollout("r1")
    rollout = replace(_rollout(tmp_path), base_url=base)
    cfg = CommandConfig(command=[sys.executable, "-c", GIVE_UP.replace("N_TOKENS", str(max_tokens))])
    with get_harness("command", cfg) as harness:
        (result,) = harness.run([rollout], concurrency=1)
    assert result.status == status, result.reason
    assert "the reply was cut, giving up" in result.reason and result.n_model_calls == 1
    assert result.info["call_outcomes"]["last_status"] == ("truncated" if status == "finished" else "ok")


@pytest.mark.parametrize(("outcomes", "gave_up"), [
    ({"by_status": {"ok": 2, "truncated": 1}, "last_status": "truncated"}, True),
    ({"by_status": {"truncated": 1, "error": 1}, "last_status": "truncated"}, False),
    ({"by_status": {"ok": 1}, "last_status": "ok"}, False),
    ({}, False),
])
def test_gave_up_after_truncation_needs_every_call_answered(outcomes: dict, gave_up: bool) -> None:
    assert gave_up_after_truncation({"call_outcomes": outcomes}) is gave_up


def test_a_key_in_the_agents_env_never_reaches_its_identity() -> None:
    """The identity goes into the frozen spec and the published records: a key given in ``env`` is redacted
    there (the agent still gets it)."""
    cfg = CommandConfig(command="python agent.py", env={"MY_AGENT_API_KEY": "sk-real-123", "MODE": "fast"})
    identity = CommandHarness(cfg).identity()
    assert "sk-real-123" not in json.dumps(identity)
    assert identity["settings"]["env"] == {"MODE": "fast", "MY_AGENT_API_KEY": "<redacted>"}


def test_a_key_in_a_clis_extra_env_never_reaches_its_identity() -> None:
    from harness_adapters.cli_agents import ClaudeCodeConfig, ClaudeCodeHarness
    from harness_adapters.node_cli_env import CLAUDE_CODE, node_cli_env

    cfg = ClaudeCodeConfig(extra_env={"ANTHROPIC_API_KEY": "sk-ant-real-9"})
    identity = ClaudeCodeHarness(cfg, env=node_cli_env(CLAUDE_CODE)).identity()  # paths only: nothing installed
    assert "sk-ant-real-9" not in json.dumps(identity)
    assert identity["settings"]["extra_env"] == {"ANTHROPIC_API_KEY": "<redacted>"}
