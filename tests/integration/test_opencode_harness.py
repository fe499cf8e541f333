"""The real OpenCode 1.18.33 on two bundled tasks, through the recording proxy and the real CPU server (scripted
replies: ``repro.serving.scripted.scenario_script``), run by the same ``RolloutRunner`` as a frozen evaluation.

Checks: every call (OpenCode always streams) is recorded with prompt and completion token ids; the title request
is recorded with purpose ``auxiliary``; OpenCode ran its bash and write tools and finished; and what OpenCode
received is byte for byte what the proxy assembled (its stored session and the history it sends back).
Also: a dead endpoint crashes only its rollout. First use installs OpenCode (~25 s, ~450 MB).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from harness_adapters.opencode import OpenCodeConfig, OpenCodeHarness
from harness_adapters.opencode_env import ensure_opencode_env
from harness_adapters.registry import get_harness
from repro.common.net import free_port
from repro.protocols import HarnessRollout
from repro.proxy import ProxyConfig
from repro.rl.evaluator import EvalConfig, Evaluator, build_spec
from repro.sandbox.local import LocalSandbox, LocalSandboxConfig
from repro.serving.stack import CpuServingConfig, running_stack
from repro.store import open_store
from repro.tasks.distributions import TaskDistributionConfig, build_distribution
from repro.tasks.schema import Task
from repro.tinymodel.model import TinyModelConfig, build_tiny_model

TASKS = TaskDistributionConfig(seed=0, split="test", n_tasks=2, families=["packages", "procedural"])
HARNESS = OpenCodeConfig(output_limit=128)
LOOP_CONTEXT = 20_500  # the first prompt is ~19,050 tokens of the tiny tokenizer; each bash step adds ~100-600


def _call(name: str, arguments: dict[str, Any]) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


# turn i = user blocks after the first: OpenCode's title request (title prompt + task) is turn 1 as well
SCENARIOS = {"edit": [
    "Let me look at the files first.\n" + _call("bash", {"command": "ls", "description": "List files"}),
    _call("write", {"filePath": "OPENCODE_NOTES.md", "content": "Checked the repository.\n"}),
    "Done: the notes are written.",
], "loop": [_call("bash", {"command": "pwd", "description": "Print the directory"})]}


@pytest.fixture(scope="module")
def evaluation(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    ensure_opencode_env(HARNESS.version)
    root = tmp_path_factory.mktemp("opencode")
    (root / "scenarios.json").write_text(json.dumps(SCENARIOS))
    model_dir = build_tiny_model(root / "model", TinyModelConfig(vocab_size=1024), [])
    tasks = [replace(t, problem_statement=f"SCENARIO edit. {t.problem_statement}") for t in build_distribution(TASKS)]
    ev = EvalConfig(experiment="opencode", max_tokens=128, concurrency=2)
    sandbox = LocalSandbox(LocalSandboxConfig())
    try:
        with get_harness("opencode", HARNESS) as harness, \
                running_stack(model_dir, CpuServingConfig(), ProxyConfig(port=0), root,
                              server_overrides={"scenarios": root / "scenarios.json",
                                                "max_model_len": 65536}) as stack:
            spec = build_spec(harness, "bundled", tasks, LocalSandboxConfig(), ev, 0,
                              stack.served_model_name)
            assert spec.harness.settings["settings"]["model_name"] == stack.served_model_name == "tiny"
            reports = Evaluator(stack, harness, sandbox, ev, spec=spec).evaluate(tasks, root / "run").reports
            identity = harness.identity()
            limited = _run_step_limited(stack, sandbox, tasks[0], root)
    finally:
        sandbox.close()
    store = open_store(root / "traces.sqlite")
    calls = {r.rollout_id: store.calls(r.rollout_id) for r in reports}
    limited_calls = store.calls("loop")
    store.close()
    return {"reports": reports, "calls": calls, "root": root, "identity": identity, "limited": limited,
            "limited_calls": limited_calls}


def _run_step_limited(stack: Any, sandbox: LocalSandbox, task: Task, root: Path) -> Any:
    """A model that always calls bash, under ``step_limit: 2`` and a context limit that compaction soon reaches."""
    base_url = stack.client.register(rollout_id="loop", task_id=task.instance_id, mode="eval")
    task = replace(task, problem_statement=task.problem_statement.replace("SCENARIO edit.", "SCENARIO loop."))
    rollout = HarnessRollout("loop", task, sandbox.workspace(task, "loop").path,
                             base_url, stack.served_model_name, root / "loop", 120)
    limits = replace(HARNESS, step_limit=2, context_limit=LOOP_CONTEXT)
    with OpenCodeHarness(limits, state_dir=root / "loop-state") as harness:
        return harness.run([rollout], 1)[0]


def test_every_call_recorded_with_token_ids(evaluation: dict[str, Any]) -> None:
    reports = evaluation["reports"]
    assert len(reports) == 2
    for report in reports:
        assert report.harness_status == "finished", report.harness_reason
        calls = evaluation["calls"][report.rollout_id]
        policy = [c for c in calls if c.purpose == "policy"]
        assert len(policy) == 3 and [c.purpose for c in calls].count("auxiliary") == 1
        assert [c.seq for c in calls] == list(range(len(calls)))
        for call in calls:
            assert call.status == "ok" and call.streamed, (call.seq, call.status, call.error)
            assert call.prompt_ids and call.completion_ids and call.logprobs
            assert len(call.logprobs) == len(call.completion_ids)
            assert call.request["stream_options"] == {"include_usage": True}
        assert [len(c.request.get("tools") or []) > 0 for c in policy] == [True] * 3
        assert [c.finish_reason for c in policy] == ["tool_calls", "tool_calls", "stop"]


def test_title_request_is_auxiliary(evaluation: dict[str, Any]) -> None:
    for calls in evaluation["calls"].values():
        (title,) = [c for c in calls if c.purpose == "auxiliary"]
        assert "tools" not in title.request
        assert title.request["messages"][0]["content"].startswith("You are a title generator")
        assert "SCENARIO edit." in title.request["messages"][-1]["content"]


def test_tools_ran_in_the_workspace(evaluation: dict[str, Any]) -> None:
    for report in evaluation["reports"]:
        patch = (evaluation["root"] / "run" / "instances" / report.instance_id / "sample-0" / "patch.diff").read_text()
        assert "OPENCODE_NOTES.md" in patch and "+Checked the repository." in patch
        assert patch.count("diff --git") == 1  # OpenCode wrote nothing else into the working copy


def _assembled(call: Any) -> dict[str, Any]:
    return call.response["choices"][0]["message"]


def test_streamed_content_is_what_opencode_received(evaluation: dict[str, Any]) -> None:
    for report in evaluation["reports"]:
        calls = [c for c in evaluation["calls"][report.rollout_id] if c.purpose == "policy"]
        session_path = evaluation["root"] / "run" / "harness" / report.rollout_id / "session.json"
        session = json.loads(session_path.read_text())
        steps = [m for m in session["messages"] if m["info"]["role"] == "assistant"]
        assert len(steps) == len(calls)
        for call, step in zip(calls, steps, strict=True):
            message = _assembled(call)
            texts = [p["text"] for p in step["parts"] if p["type"] == "text"]
            tools = [p for p in step["parts"] if p["type"] == "tool"]
            assert "".join(texts) == (message.get("content") or "")
            recorded = message.get("tool_calls") or []
            assert [(t["callID"], t["tool"]) for t in tools] == [(c["id"], c["function"]["name"]) for c in recorded]
            assert [t["state"]["input"] for t in tools] == [json.loads(c["function"]["arguments"]) for c in recorded]
            assert all(t["state"]["status"] == "completed" for t in tools)
        for call, following in itertools.pairwise(calls):  # the history OpenCode sends back
            sent = next(m for m in reversed(following.request["messages"]) if m["role"] == "assistant")
            message = _assembled(call)
            assert (sent.get("content") or "") == (message.get("content") or "")
            # OpenCode keeps the parsed input and sends it back as JSON.stringify(input): compact separators, so the
            # next prompt does not extend the sampled tokens where the model wrote '{"a": 1}'
            assert [c["function"]["arguments"] for c in sent["tool_calls"]] == \
                [_compact(c["function"]["arguments"]) for c in message["tool_calls"]]


def _compact(arguments: str) -> str:
    return json.dumps(json.loads(arguments), separators=(",", ":"), ensure_ascii=False)


def test_identity_records_what_the_model_sees(evaluation: dict[str, Any]) -> None:
    identity = evaluation["identity"]
    assert identity["name"] == "opencode" and identity["version"] == "1.18.33"
    assert identity["packages"]["opencode-ai"] == "1.18.33" and "ripgrep (PyPI)" in identity["packages"]
    assert set(identity["files_sha256"]) == {"opencode.json", "config-deps/package-lock.json"}
    assert identity["settings"]["title"] == "auxiliary"
    assert identity["settings"]["compaction"] == {"auto": True, "prune": False}


def test_step_limit_is_advisory_and_compaction_is_a_summary_call(evaluation: dict[str, Any]) -> None:
    result, calls = evaluation["limited"], evaluation["limited_calls"]
    assert result.status == "finished", result
    policy = [c for c in calls if c.purpose == "policy"]
    assert all(c.status == "ok" and c.prompt_ids and c.completion_ids for c in calls)
    # past the limit OpenCode adds its "maximum steps" message and still offers the tools
    assert len(policy) > 2 and all(c.request.get("tools") for c in policy[:3])
    assert "MAXIMUM STEPS REACHED" in json.dumps(policy[2].request["messages"][-1])
    (summary,) = [c for c in calls if c.purpose == "summary"]
    assert summary.request["messages"][0]["content"].startswith("You are a context summarization agent")
    assert not summary.request.get("tools") and summary.streamed
    assert max(len(c.prompt_ids) for c in policy) < LOOP_CONTEXT


@pytest.mark.slow  # ~70 s: OpenCode retries a dead endpoint 5 times with backoff before it gives up
def test_dead_endpoint_crashes_only_its_rollout(tmp_path: Path) -> None:
    task = Task(instance_id="dead", repo="o/r", base_commit="0" * 40, problem_statement="Say hi.")
    workdir = tmp_path / "work"
    workdir.mkdir()
    url = f"http://127.0.0.1:{free_port()}/rollouts/dead/v1"
    with OpenCodeHarness(HARNESS, state_dir=tmp_path / "state") as harness:
        dead, slow = harness.run([HarnessRollout("dead", task, workdir, url, "tiny", tmp_path / "dead", 150),
                                  HarnessRollout("slow", task, workdir, url, "tiny", tmp_path / "slow", 5)], 2)
    assert dead.status == "crashed" and "Cannot connect to API" in dead.reason, dead
    assert dead.info["exit_code"] == 1 and dead.exit_status == "error"
    assert slow.status == "timeout" and slow.duration_s < 30, slow
