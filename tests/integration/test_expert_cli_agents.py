"""The scripted expert through Claude Code, Codex CLI and Qwen Code, unchanged: the CPU server started with the tasks
(``expert_tasks``, as warm starts record demonstrations), the recording proxy in each CLI's dialect, the same
``RolloutRunner`` as an evaluation. On ``locate`` tasks each CLI gets the three steps as calls of its own shell tool
(``Bash`` {command}, ``exec_command`` {cmd}, ``run_shell_command`` {command}), runs them in the working copy, then
exits on the expert's plain reply; the real grader finds every task resolved. Skipped (one line why) where a CLI
cannot be installed; CI requires them (``REPRO_REQUIRE_NPM=1``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from harness_adapters.node_cli_env import SPECS
from harness_adapters.registry import get_harness
from repro.recipe.expert_runs import expert_stack, locate_tasks, run_tasks
from repro.store import open_store
from tests.support import installed_node_cli

N_TASKS = 2
# harness -> (the API it speaks, its shell tool, the argument that takes the command)
CLIS = {"claude-code": ("messages", "Bash", "command"),
        "codex": ("responses", "exec_command", "cmd"),
        "qwen-code": ("chat", "run_shell_command", "command")}


@pytest.fixture(scope="module", params=[pytest.param(k, marks=pytest.mark.slow) if k == "qwen-code" else k
                                        for k in sorted(CLIS)])  # Qwen Code: ~5 CPU-s a rollout
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    name = request.param
    installed_node_cli(SPECS[name])  # skipped (one line why) where npm cannot install it; CI requires it
    root = tmp_path_factory.mktemp(name)
    tasks = locate_tasks(N_TASKS)
    with get_harness(name) as harness, expert_stack(tasks, root) as stack:
        reports = run_tasks(harness, stack, tasks, root / "run", root / "traces.sqlite", experiment=name)
    store = open_store(root / "traces.sqlite")
    calls = {r.rollout_id: [c for c in store.calls(r.rollout_id) if c.purpose == "policy"] for r in reports}
    store.close()
    return {"name": name, "tasks": {t.instance_id: t for t in tasks}, "reports": reports, "calls": calls}


def test_the_expert_resolves_every_task_through_the_cli(run: dict[str, Any]) -> None:
    assert len(run["reports"]) == N_TASKS
    for report in run["reports"]:
        assert report.harness_status == "finished", (report.instance_id, report.harness_reason)
        assert report.outcome == "resolved", (report.instance_id, report.reason)


def test_each_step_is_a_call_of_the_clis_own_shell_tool(run: dict[str, Any]) -> None:
    """Look up, edit by number, check: three calls of the CLI's shell tool in its argument shape, each step once; then
    a plain reply ends the run (no submit sentinel, no further call)."""
    api, tool, key = CLIS[run["name"]]
    for report in run["reports"]:
        calls = run["calls"][report.rollout_id]
        assert [c.endpoint for c in calls] == [api] * 4 and all(c.status == "ok" for c in calls)
        steps = [c.response["choices"][0]["message"].get("tool_calls") or [] for c in calls]
        assert [len(s) for s in steps] == [1, 1, 1, 0] and calls[-1].finish_reason == "stop"
        assert {s[0]["function"]["name"] for s in steps[:3]} == {tool}
        commands = [json.loads(s[0]["function"]["arguments"])[key] for s in steps[:3]]
        assert [c.split(" ", 1)[0] for c in commands] == ["grep", "sed", "python"], commands
        task = run["tasks"][report.instance_id]
        assert commands[1].startswith(f"sed -i '{task.extra['line']}s|")
        assert any(f"{task.extra['line']}:" in json.dumps(m) for m in calls[1].request["messages"][-2:]), \
            "the grep's output went back to the model"
