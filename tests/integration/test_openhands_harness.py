"""The real OpenHands SDK 1.58.2 (default agent, local workspace) through the recording proxy and the real CPU
server with scripted replies (``repro.serving.scripted.scenario_script``).

- Two bundled tasks through ``evaluate_job`` (registry name ``openhands``): the agent runs terminal commands, edits
  a file with ``sed`` and calls ``finish``; every call is recorded with its token ids and both rollouts finish.
- The summarizing condenser (small ``max_size``): its summary call is recorded as its own call (purpose
  ``summary``), and the sample builder starts a new row after it (the prefix break); ``file_editor`` edits land.
- A rollout past its timeout is killed with its tmux server and the command running there; a dead endpoint
  crashes only its rollout.

First use builds the OpenHands env (~1 min, ~680 MB; needs Python >= 3.12).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

import repro.recipe.setup as experiment_setup
from harness_adapters.openhands import DEFAULT_TOOLS, OpenHandsConfig, OpenHandsHarness, ensure_openhands_env
from repro.common.net import free_port
from repro.common.venvs import HarnessEnvError
from repro.evaluation.reports import read_patch
from repro.experiments.evaluate import evaluate_job
from repro.protocols import HarnessRollout
from repro.proxy import ProxyConfig
from repro.recipe.setup import Setup
from repro.rl.evaluator import EvalConfig
from repro.sandbox.local import LocalSandboxConfig
from repro.serving.stack import CpuServingConfig, running_stack
from repro.store import open_store
from repro.tasks.distributions import TaskDistributionConfig, build_distribution
from repro.tasks.schema import Task
from repro.tasks.sets import TaskFileConfig
from repro.tinymodel.model import TinyModelConfig, build_tiny_model
from repro.train.samples import SampleConfig, build_rows

# OpenHands' first prompt is ~20.5k tokens of the tiny byte-level tokenizer: the model needs a longer context.
MODEL = TinyModelConfig(vocab_size=1024, max_position_embeddings=65536)
TASKS = TaskDistributionConfig(seed=0, split="test", n_tasks=2, families=["packages", "procedural"])
EDIT = "sed -i '1s/^/# looked at by the agent\\n/' \"$(git ls-files '*.py' | head -1)\" && git diff --stat"


def tool_call(name: str, **arguments: object) -> str:
    """A scripted completion calling one OpenHands tool (Hermes format, as the CPU server's parser reads it)."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


WORK = [tool_call("terminal", command="git status --short && ls", security_risk="LOW"),
        tool_call("terminal", command=EDIT, security_risk="LOW"),
        tool_call("finish", message="Edited the first Python file.")]


@pytest.fixture(scope="module")
def oh_env():
    return ensure_openhands_env()


def test_bundled_tasks_through_evaluate_job(oh_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scenarios = tmp_path / "scenarios.json"
    scenarios.write_text(json.dumps({"work": WORK}))
    tasks_file = tmp_path / "tasks.jsonl"
    tasks = [replace(t, problem_statement=f"SCENARIO work. {t.problem_statement}") for t in build_distribution(TASKS)]
    tasks_file.write_text("".join(json.dumps(t.to_row()) + "\n" for t in tasks))
    stack = experiment_setup.running_stack
    monkeypatch.setattr(experiment_setup, "running_stack", lambda *a, **kw: stack(
        *a, **kw, server_overrides={"scenarios": scenarios}))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    setup = Setup(MODEL, CpuServingConfig(default_max_tokens=256), ProxyConfig(port=0),
                  OpenHandsConfig(max_iterations=6, condenser="none"), "openhands", LocalSandboxConfig())
    metrics = evaluate_job(setup, TaskFileConfig(str(tasks_file)),
                           EvalConfig(experiment="openhands", max_tokens=256, concurrency=2), run_dir)
    assert metrics["n_samples"] == 2 and metrics["complete"]
    assert metrics["spec"]["harness"]["version"] == "1.58.2"
    store = open_store(run_dir / "traces.sqlite")
    reports = [json.loads(p.read_text()) for p in run_dir.glob("instances/*/sample-0/report.json")]
    assert len(reports) == 2
    for report in reports:
        assert (report["harness_status"], report["harness_exit_status"]) == ("finished", "finished"), report
        calls = store.calls(report["rollout_id"])
        assert len(calls) == report["n_calls"] == 3
        assert [c.seq for c in calls] == [0, 1, 2] and {c.purpose for c in calls} == {"policy"}
        for call in calls:
            assert call.status == "ok" and call.prompt_ids and call.completion_ids
            assert [t["function"]["name"] for t in call.request["tools"]] == list(DEFAULT_TOOLS)
            assert call.request["messages"][0]["role"] == "system"
        assert [c.extends_previous for c in calls[1:]] == [True, True]
        assert "+# looked at by the agent" in read_patch(run_dir, report["instance_id"], 0)
    store.close()


SLEEPY_TIMEOUT_S = 45.0  # start-up is ~7-13 s (imports), more on a loaded machine: the command must have started
SCRIPTED = OpenHandsConfig(max_iterations=10, condenser="summarizing", condenser_max_size=8, condenser_keep_first=2)


def _scenarios(work: dict[str, Path]) -> dict[str, list[str]]:
    """``after`` (its marker comes with the summary) wins over ``condense`` (the task), which wins over
    ``summary`` (a marker echoed by the first command: only the summary prompt holds it without the task)."""
    a_py = str(work["condense"] / "a.py")
    return {
        "after": [tool_call("finish", message="Done after the summary.")],
        "condense": [tool_call("terminal", command="echo 'SCENARIO summary.' && ls"),
                     tool_call("file_editor", command="str_replace", path=a_py, old_str="x = 1", new_str="x = 2"),
                     tool_call("terminal", command="sed -i 's/x = 2/x = 3/' a.py"),
                     tool_call("terminal", command="cat a.py"),
                     tool_call("terminal", command="echo unreachable")],
        "summary": ["The agent listed the files and set x to 3 in a.py. SCENARIO after."],
        "sleepy": [tool_call("terminal", command="sleep 120")],
    }


@pytest.fixture(scope="module")
def scripted(oh_env, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("openhands")
    names = ("condense", "sleepy", "down")
    work = {n: root / n / "work" for n in names}
    for path in work.values():
        path.mkdir(parents=True)
        (path / "a.py").write_text("x = 1\n")
    (root / "scenarios.json").write_text(json.dumps(_scenarios(work)))
    model_dir = build_tiny_model(root / "model", MODEL, [])
    dead = f"http://127.0.0.1:{free_port()}/rollouts/down/v1"
    with running_stack(model_dir, CpuServingConfig(default_max_tokens=256), ProxyConfig(port=0), root,
                       server_overrides={"scenarios": root / "scenarios.json"}) as stack:
        rollouts = []
        for name in names:
            base_url = stack.client.register(rollout_id=name, task_id=name, mode="train")
            task = Task(instance_id=name, repo="o/r", base_commit="0" * 40, problem_statement=f"SCENARIO {name}. Fix.")
            url = dead if name == "down" else base_url
            timeout = SLEEPY_TIMEOUT_S if name == "sleepy" else 180.0
            rollouts.append(HarnessRollout(name, task, work[name], url, stack.served_model_name,
                                           root / name / "out", timeout))
        with OpenHandsHarness(SCRIPTED, env=oh_env) as harness:
            results = dict(zip(names, harness.run(rollouts, concurrency=3), strict=True))
        store = open_store(root / "traces.sqlite")
        store.finish_rollout("condense", "finished", reward=1.0)
        calls = store.calls("condense")
        samples = build_rows(store, ["condense"], SampleConfig(mode="prefix_merge"))
        store.close()
    return {"results": results, "calls": calls, "samples": samples, "work": work}


def test_summary_call_is_recorded_and_breaks_the_prefix(scripted: dict) -> None:
    result, calls = scripted["results"]["condense"], scripted["calls"]
    assert (result.status, result.exit_status) == ("finished", "finished"), result
    assert result.info["calls_by_usage"] == {"agent": 5, "condenser": 1}
    assert [c.purpose for c in calls] == ["policy"] * 4 + ["summary", "policy"]
    assert all(c.status == "ok" and c.prompt_ids and c.completion_ids for c in calls)
    summary = calls[4]
    assert "tools" not in summary.request and [m["role"] for m in summary.request["messages"]] == ["system", "user"]
    assert calls[5].extends_previous is False  # the condensed history does not extend the last policy prompt
    rows = scripted["samples"].rollouts["condense"].rows
    assert [r.call_seqs for r in rows] == [[0, 1, 2, 3], [4], [5]]
    assert (scripted["work"]["condense"] / "a.py").read_text() == "x = 3\n"  # file_editor, then sed


def test_timeout_kills_the_tmux_server_and_its_command(scripted: dict) -> None:
    result = scripted["results"]["sleepy"]
    assert result.status == "timeout" and result.reason == f"killed after {SLEEPY_TIMEOUT_S:g} s", result
    started = result.trajectory_path and "sleep 120" in Path(result.trajectory_path).read_text()
    assert started, "the agent's command never started: the runner's start-up took the whole timeout"
    assert result.info["tmux_servers_killed"] == 1
    workdir = os.path.realpath(scripted["work"]["sleepy"])
    left = [p.info for p in psutil.process_iter(["pid", "name", "cwd"]) if p.info.get("cwd") == workdir]
    assert left == []


def test_dead_endpoint_crashes_only_its_rollout(scripted: dict) -> None:
    down = scripted["results"]["down"]
    assert down.status == "crashed" and down.exit_status == "error", down
    assert "Connection" in down.reason or "connect" in down.reason.lower(), down.reason
    assert down.duration_s < 60 and scripted["results"]["condense"].status == "finished"


def test_a_version_not_on_pypi_fails_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPRO_CACHE_DIR", str(tmp_path))  # the failed env stays out of the real cache
    with pytest.raises(HarnessEnvError, match=r"OpenHands 1\.58\.99 does not exist: PyPI has no "
                                              r"openhands-sdk==1\.58\.99.*nearest releases: .*1\.58\.2"):
        ensure_openhands_env("1.58.99")
