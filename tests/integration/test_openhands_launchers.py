"""OpenHands' two launchers (``harness.launcher``: ``fork``, the default, and ``exec``) give the model the same
rollouts: the same tasks, run through the real SDK 1.58.2, the recording proxy and the real CPU server with scripted
replies (as in ``test_openhands_harness.py``), once per launcher at the same paths, record the same calls: request
bodies (messages, tools, settings; the conversation id aside) and prompt token ids, call by call.

One task prints the environment the agent's terminal has (its tmux server inherits the runner's), so a forked runner
in another environment than the exec'd one would send other prompts; a control run whose forked runner keeps the fork
server's environment (the request's ``env`` dropped) shows that the comparison catches it. Both under the default
isolation (a jail where this machine allows one) and without.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest

from harness_adapters.openhands import OpenHandsConfig, OpenHandsHarness, ensure_openhands_env
from repro.protocols import HarnessResult, HarnessRollout
from repro.proxy import ProxyConfig
from repro.serving.stack import CpuServingConfig, running_stack
from repro.store import open_store
from repro.tasks.schema import Task
from repro.tinymodel.model import TinyModelConfig, build_tiny_model

MODEL = TinyModelConfig(vocab_size=1024, max_position_embeddings=65536)  # OpenHands' prompts are ~20.5k tokens
# The environment as the agent's commands see it; a tmux dir is random per rollout (mkdtemp) and TMUX holds the
# server's pid: the one kept out, the other written as <tmux> (a TMUX_TMPDIR elsewhere would show as it is).
ENV_PROBE = "env | grep -v -e '^TMUX=' -e '^_=' | sort | sed -E 's#/tmp/oh-tmux-[A-Za-z0-9_]+#<tmux>#g'"
TASKS = ("envprobe", "edit")
TOOL_CALL_ID = re.compile(r"\bcall_[0-9a-f]{24}\b")  # the CPU server's, random per reply
CONVERSATION_ID = re.compile(r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}")


def tool_call(name: str, **arguments: object) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def _scenarios(root: Path) -> dict[str, list[str]]:
    a_py = str(root / "work" / "edit" / "a.py")
    return {
        "envprobe": [tool_call("terminal", command=ENV_PROBE, security_risk="LOW"),
                     tool_call("finish", message="Printed the environment.")],
        "edit": [tool_call("file_editor", command="str_replace", path=a_py, old_str="x = 1", new_str="x = 2"),
                 tool_call("terminal", command="cat a.py && pwd && echo $HOME", security_risk="LOW"),
                 tool_call("finish", message="Set x to 2.")],
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Any:
    oh_env = ensure_openhands_env()  # built on first use (~1 min), as in test_openhands_harness.py
    root = tmp_path_factory.mktemp("oh-launchers")
    (root / "scenarios.json").write_text(json.dumps(_scenarios(root)))
    model_dir = build_tiny_model(root / "model", MODEL, [])
    with running_stack(model_dir, CpuServingConfig(default_max_tokens=256), ProxyConfig(port=0), root,
                       server_overrides={"scenarios": root / "scenarios.json"}) as running:
        yield {"stack": running, "root": root, "env": oh_env}


def run_set(stack: dict, tag: str, cfg: OpenHandsConfig, drop_env: bool = False) -> dict[str, dict[str, Any]]:
    """Both tasks under ``cfg`` at the same working copies and output folders as every other set; per task its
    result and its recorded calls. ``drop_env``: the forked runners keep the fork server's environment."""
    root, running = stack["root"], stack["stack"]
    rollouts = []
    for name in TASKS:
        work, out = root / "work" / name, root / "out" / name
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
        work.mkdir(parents=True)
        (work / "a.py").write_text("x = 1\n")
        rollout_id = f"{tag}-{name}"
        base_url = running.client.register(rollout_id=rollout_id, task_id=name, mode="train")
        task = Task(instance_id=name, repo="o/r", base_commit="0" * 40, problem_statement=f"SCENARIO {name}. Fix.")
        rollouts.append(HarnessRollout(rollout_id, task, work, base_url, running.served_model_name, out, 180.0))
    with OpenHandsHarness(cfg, env=stack["env"]) as harness:
        if drop_env:
            forks = harness._launcher.fork_server()
            run = forks.run
            forks.run = lambda *args, env=None, **kwargs: run(*args, **kwargs)  # type: ignore[method-assign]
        results = harness.run(rollouts, concurrency=2)
        threads = harness._launcher._forks.threads if harness._launcher._forks else None
    store = open_store(root / "traces.sqlite")
    try:
        calls = {r.task.instance_id: store.calls(r.rollout_id) for r in rollouts}
    finally:
        store.close()
    return {r.task.instance_id: {"result": res, "calls": calls[r.task.instance_id], "threads": threads}
            for r, res in zip(rollouts, results, strict=True)}


def comparable(calls: list[Any]) -> list[dict[str, Any]]:
    """What the model was shown, call by call: the request without the conversation id (the prompt cache key) and
    with the tool-call ids the server drew numbered in order, the prompt and completion token ids."""
    rows, numbers = [], {}
    for call in calls:
        body = json.dumps({k: v for k, v in call.request.items() if k != "prompt_cache_key"})
        assert not CONVERSATION_ID.search(body), "a per-conversation id reached the request body"
        body = TOOL_CALL_ID.sub(lambda m: numbers.setdefault(m.group(), f"call_{len(numbers)}"), body)
        rows.append({"purpose": call.purpose, "status": call.status, "request": json.loads(body),
                     "prompt_ids": call.prompt_ids, "completion_ids": call.completion_ids})
    return rows


def _finished(result: HarnessResult, launcher: str) -> None:
    assert (result.status, result.exit_status) == ("finished", "finished"), result
    assert result.info["launcher"] == launcher


@pytest.mark.parametrize("isolation", ["auto", pytest.param("none", marks=pytest.mark.slow)])
def test_fork_and_exec_send_the_same_requests(stack: dict, isolation: str) -> None:
    runs = {launcher: run_set(stack, f"{launcher}-{isolation}", OpenHandsConfig(
        max_iterations=6, condenser="none", isolation=isolation, launcher=launcher)) for launcher in ("exec", "fork")}
    for name in TASKS:
        exec_run, fork_run = runs["exec"][name], runs["fork"][name]
        _finished(exec_run["result"], "exec")
        _finished(fork_run["result"], "fork")
        assert exec_run["result"].info["isolation"] == fork_run["result"].info["isolation"]
        assert exec_run["result"].info["calls_by_usage"] == fork_run["result"].info["calls_by_usage"]
        assert comparable(fork_run["calls"]) == comparable(exec_run["calls"])
    assert runs["fork"]["envprobe"]["threads"] == 1  # importing the SDK started no thread: safe to fork
    probe = comparable(runs["fork"]["envprobe"]["calls"])[1]["request"]["messages"][-1]
    shown = json.dumps(probe)
    assert f"HOME={stack['root'] / 'out' / 'envprobe' / 'home'}" in shown and "TMUX_TMPDIR=<tmux>" in shown
    assert (stack["root"] / "work" / "edit" / "a.py").read_text() == "x = 2\n"
    left = [p.info for p in psutil.process_iter(["pid", "name", "cwd"])
            if str(p.info.get("cwd") or "").startswith(os.path.realpath(stack["root"] / "work"))]
    assert left == []  # no tmux server or command outlived its rollout


def test_the_comparison_catches_a_forked_runner_in_another_environment(stack: dict) -> None:
    cfg = OpenHandsConfig(max_iterations=6, condenser="none", isolation="none")
    reference = run_set(stack, "ctl-exec", replace(cfg, launcher="exec"))["envprobe"]
    wrong = run_set(stack, "ctl-fork", cfg, drop_env=True)["envprobe"]
    _finished(wrong["result"], "fork")
    ours, theirs = comparable(wrong["calls"]), comparable(reference["calls"])
    assert ours[0] == theirs[0]  # the first prompt holds no environment
    assert ours[1]["prompt_ids"] != theirs[1]["prompt_ids"] and ours != theirs
    assert "repro-openhands-" in json.dumps(ours[1]["request"]["messages"][-1])  # the fork server's HOME
