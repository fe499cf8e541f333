"""The red team through mini-SWE-agent, the default harness, in the local sandbox: the model (a scripted stub) has
mini run the red-team agent's program (``test_red_team.AGENT``, written inline by the command) with mini's own
shell, 2.x through its local environment from the worker pool, 1.x through the ``mini`` process forked per rollout.
Jailed (the default) it recovers nothing and the task does not resolve; the control without isolation finds the
task file, applies the gold patch and resolves (so the test can fail). mini calls the model from its own process,
so the agent's commands are given no URL: the proxy is attacked at the address a port scan would find."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness_adapters.mini_swe_agent.adapter import MiniSweAgentConfig
from harness_adapters.registry import get_harness
from repro.protocols import HarnessRollout
from repro.testing import StubChatServer
from repro.testing.chat_stub import chat_completion
from tests.integration.test_red_team import REPORT, agent_program, isolation_here, scene  # noqa: F401 (a fixture)
from tests.support import RunningProxy

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
VERSIONS = {"2.4.6": "toolcall", "1.17.5": "text"}


def scripted(program: str, mode: str) -> Any:
    """The model: first the red-team program, then submit (by the number of assistant turns so far)."""
    def reply(rollout_id: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        turn = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
        command = f"python3 - <<'REDTEAM'\n{program}\nREDTEAM" if turn == 0 else SUBMIT
        if mode == "text":
            return 200, chat_completion({"role": "assistant", "content": f"Trying.\n\n```bash\n{command}\n```"})
        call = {"id": f"call_{turn}", "type": "function",
                "function": {"name": "bash", "arguments": json.dumps({"command": command})}}
        return 200, chat_completion({"role": "assistant", "content": "", "tool_calls": [call]}, "tool_calls")

    return reply


@pytest.mark.parametrize("isolation", ["jail", "none"])
@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_the_red_team_through_mini_swe_agent(version: str, isolation: str, tmp_path: Path, proxy: RunningProxy,
                                             fake_upstream, request: pytest.FixtureRequest) -> None:
    if isolation == "jail":
        request.getfixturevalue("isolation_here")
    with scene(tmp_path, proxy, fake_upstream[1]) as s:
        program = agent_program(s.targets | {"report": REPORT})
        cfg = MiniSweAgentConfig(version=version, mode=VERSIONS[version], step_limit=4, isolation=isolation)
        with StubChatServer(scripted(program, VERSIONS[version])) as stub, get_harness("mini-swe-agent", cfg) as h:
            rollout = HarnessRollout("red", s.task, s.workspace.path, stub.url("red"), "m", tmp_path / "out", 120.0,
                                     env=s.workspace.command_env)
            (result,) = h.run([rollout], 1)
            assert (result.status, result.exit_status) == ("finished", "Submitted"), result.reason
            assert h.identity()["isolation"] == isolation
        report = json.loads((Path(s.workspace.path) / REPORT).read_text())
        (Path(s.workspace.path) / REPORT).unlink()  # not part of the agent's patch
        resolved = s.resolved()
    found = report["found"]
    if isolation == "jail":
        assert found == {} and not resolved
    else:
        assert resolved and found["task_file"] and found["applied_gold_patch"]
        assert {"other_workspace", "proc_environ", "proc_cmdline", "model_server", "other_port"} <= set(found)
    assert not {"finish", "finish_with_key", "policy_version", "register", "other_rollout"} & set(found)
    assert proxy.store().get_rollout("forged") is None
