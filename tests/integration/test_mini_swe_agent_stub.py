"""The real mini-SWE-agent 2.4.6 (isolated env) against a scripted OpenAI-compatible stub on 127.0.0.1.

Development check only: the stub is not the project's proxy. First run builds the harness env (~1 min).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from harness_adapters.mini_swe_agent.adapter import (
    MiniSweAgentConfig,
    ensure_mini_swe_agent_env,
    run_mini_swe_agent,
)
from repro.common.venvs import HarnessEnv
from repro.testing import StubChatServer, text_reply, tool_call_reply

SUBMIT = "echo hi > out.txt && echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


@pytest.fixture(scope="module")
def harness_env() -> HarnessEnv:
    return ensure_mini_swe_agent_env()


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "work"
    path.mkdir()
    yield path


def run(stub: StubChatServer, env: HarnessEnv, workdir: Path, out: Path, cfg: MiniSweAgentConfig, timeout_s=60.0):
    return run_mini_swe_agent(
        task="Write hi into out.txt.",
        workdir=workdir,
        base_url=stub.url("r-1"),
        model_name="stub-model",
        cfg=cfg,
        output_dir=out,
        timeout_s=timeout_s,
        env=env,
    )


def test_tool_call_submits_and_writes_in_workdir(harness_env: HarnessEnv, workdir: Path, tmp_path: Path) -> None:
    with StubChatServer(tool_call_reply(SUBMIT)) as stub:
        result = run(stub, harness_env, workdir, tmp_path / "out", MiniSweAgentConfig(temperature=0.5))
    assert result.status == "finished", result
    assert result.reason == "Submitted"
    assert result.exit_code == 0
    assert (workdir / "out.txt").read_text() == "hi\n"
    assert result.trajectory_path is not None
    trajectory = json.loads(result.trajectory_path.read_text())
    assert trajectory["info"]["exit_status"] == "Submitted"
    assert [r["path"] for r in stub.requests] == ["/rollouts/r-1/v1/chat/completions"]
    request = stub.requests[0]
    headers = {k.lower(): v for k, v in request["headers"].items()}
    assert headers["x-stainless-retry-count"] == "0"
    assert headers["authorization"].startswith("Bearer ")
    assert not request["body"].get("stream")
    assert [t["function"]["name"] for t in request["body"]["tools"]] == ["bash"]
    assert request["body"]["temperature"] == 0.5
    assert "num_retries" not in request["body"]
    assert result.identity.version == "2.4.6"
    assert len(result.identity.config_sha256) == 64


def test_plain_text_reply_ends_without_crash(harness_env: HarnessEnv, workdir: Path, tmp_path: Path) -> None:
    cfg = MiniSweAgentConfig(step_limit=5)
    with StubChatServer(text_reply("I am not going to call a tool.")) as stub:
        result = run(stub, harness_env, workdir, tmp_path / "out", cfg)
    assert result.status == "finished", result
    assert result.reason in ("RepeatedFormatError", "LimitsExceeded")
    assert 1 <= len(stub.requests) <= cfg.step_limit
    assert all(r["path"] == "/rollouts/r-1/v1/chat/completions" for r in stub.requests)


def test_text_mode_parses_fenced_command(harness_env: HarnessEnv, workdir: Path, tmp_path: Path) -> None:
    reply = text_reply(f"THOUGHT: done.\n\n```mswea_bash_command\n{SUBMIT}\n```")
    with StubChatServer(reply) as stub:
        result = run(stub, harness_env, workdir, tmp_path / "out", MiniSweAgentConfig(mode="text"))
    assert result.status == "finished", result
    assert result.reason == "Submitted"
    assert (workdir / "out.txt").exists()
    assert "tools" not in stub.requests[0]["body"]


def test_server_error_fails_fast_with_one_request(harness_env: HarnessEnv, workdir: Path, tmp_path: Path) -> None:
    with StubChatServer(lambda rollout_id, body: (500, {"error": {"message": "boom"}})) as stub:
        result = run(stub, harness_env, workdir, tmp_path / "out", MiniSweAgentConfig())
    assert result.status == "crashed"
    assert result.exit_code == 1
    assert len(stub.requests) == 1
    assert result.duration_s < 30


def test_timeout_kills_harness_and_agent_command(harness_env: HarnessEnv, workdir: Path, tmp_path: Path) -> None:
    cfg = MiniSweAgentConfig(command_timeout_s=120)
    with StubChatServer(tool_call_reply("echo $$ > pid.txt && sleep 120")) as stub:
        result = run(stub, harness_env, workdir, tmp_path / "out", cfg, timeout_s=10)
    assert result.status == "timeout"
    assert result.exit_code is None
    assert result.duration_s < 20
    assert not _alive(int((workdir / "pid.txt").read_text()))


def _alive(pid: int) -> bool:
    """True when ``pid`` runs (a zombie awaiting its reaper counts as dead)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
