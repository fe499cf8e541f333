"""``launcher=serve`` (one ``opencode serve`` per concurrent rollout, a session per rollout) against the plain
``opencode run`` per rollout: the scripted expert (the real CPU server with ``expert_tasks``) solves the same two
``locate`` tasks through the real proxy under each launcher, and every recorded call is the same — the requests
OpenCode sent (system prompt, history, tools; each rollout's own paths and ids aside), the title call, the token
ids sampled — as are the outcomes the real grader gives. Both unjailed (serve cannot jail a rollout)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from harness_adapters.opencode import OpenCodeConfig
from harness_adapters.opencode_env import ensure_opencode_env
from harness_adapters.registry import get_harness
from repro.proxy import ProxyConfig
from repro.rl.evaluator import EvalConfig, build_spec, eval_options
from repro.rl.rollouts import RolloutRunner
from repro.sandbox.local import LocalSandbox, LocalSandboxConfig
from repro.serving.stack import CpuServingConfig, running_stack
from repro.store import open_store
from repro.tasks.distributions import TaskDistributionConfig, build_distribution
from repro.tasks.loaders import write_tasks
from repro.tinymodel.model import TinyModelConfig, build_tiny_model

TASKS = TaskDistributionConfig(seed=0, split="train", n_tasks=2, families=["procedural"], operators=["recipe"],
                               difficulty="locate")
LAUNCHERS = ("run", "serve")


def _launch(launcher: str, root: Path, tasks: list, tasks_jsonl: Path, model_dir: Path) -> dict[str, Any]:
    root.mkdir(parents=True)
    cfg = OpenCodeConfig(output_limit=256, isolation="none", launcher=launcher)
    ev = EvalConfig(experiment="opencode", max_tokens=256, concurrency=2)
    sandbox = LocalSandbox(LocalSandboxConfig())
    try:
        with get_harness("opencode", cfg) as harness, running_stack(
                model_dir, CpuServingConfig(), ProxyConfig(port=0), root, expert_tasks=tasks_jsonl,
                server_overrides={"max_model_len": 65536}) as stack:
            spec = build_spec(harness, "bundled", tasks, LocalSandboxConfig(), ev, 0, stack.served_model_name)
            runner = RolloutRunner(root / "run", root / "traces.sqlite", eval_options(spec, ev), tasks, stack,
                                   harness, sandbox, stack.served_model_name)
            try:
                reports = runner.run()
            finally:
                runner.close()
    finally:
        sandbox.close()
    store = open_store(root / "traces.sqlite")
    calls = {r.instance_id: store.calls(r.rollout_id) for r in reports}
    store.close()
    records = {r.instance_id: json.loads((root / "run" / "harness" / r.rollout_id / "harness_run.json").read_text())
               for r in reports}
    return {"reports": {r.instance_id: r for r in reports}, "calls": calls, "records": records,
            "fingerprint": spec.fingerprint()}


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    ensure_opencode_env(OpenCodeConfig().version)
    root = tmp_path_factory.mktemp("opencode-serve")
    tasks = build_distribution(TASKS)
    tasks_jsonl = write_tasks(tasks, root / "tasks.jsonl")
    model_dir = build_tiny_model(root / "model", TinyModelConfig(vocab_size=1024), [])
    return {launcher: _launch(launcher, root / launcher, tasks, tasks_jsonl, model_dir) for launcher in LAUNCHERS}


WORKDIR = re.compile(r'[^"\s\\]*repro-workspaces-[^/"\s\\]+/[^/"\s\\]+')  # a rollout's working copy
CALL_ID = re.compile(r'"call_[0-9a-f]+"')  # the server's random tool-call ids


def _workdir_free(calls: list[Any]) -> list[dict[str, Any]]:
    """What OpenCode sent and got, with each rollout's own: its working-copy path (in its system prompt) as
    ``<workdir>``, the server's random tool-call ids numbered in order of appearance."""
    text = json.dumps([{"messages": c.request["messages"], "tools": c.request.get("tools"),
                        "max_tokens": c.request.get("max_tokens"), "completion_ids": c.completion_ids,
                        "finish_reason": c.finish_reason} for c in calls])
    ids: dict[str, str] = {}
    text = CALL_ID.sub(lambda m: ids.setdefault(m.group(), f'"call_{len(ids)}"'), text)
    return json.loads(WORKDIR.sub("<workdir>", text))


def test_both_launchers_resolve_every_task(launched: dict[str, dict[str, Any]]) -> None:
    for launcher, run in launched.items():
        assert len(run["reports"]) == TASKS.n_tasks
        for report in run["reports"].values():
            assert report.harness_status == "finished", (launcher, report.harness_reason)
            assert report.outcome == "resolved", (launcher, report.reason)
        assert {r["info"]["launcher"] for r in run["records"].values()} == {launcher}
    assert launched["run"]["fingerprint"] == launched["serve"]["fingerprint"]  # one frozen spec for both


def test_serve_records_the_same_calls_as_run(launched: dict[str, dict[str, Any]]) -> None:
    for instance_id, plain in launched["run"]["calls"].items():
        served = launched["serve"]["calls"][instance_id]
        assert [c.purpose for c in plain].count("policy") == 4 and [c.purpose for c in plain].count("auxiliary") == 1
        # the title call races the first step, so calls are compared per purpose, in order
        for purpose in ("policy", "auxiliary"):
            mine = [c for c in plain if c.purpose == purpose]
            theirs = [c for c in served if c.purpose == purpose]
            assert _workdir_free(theirs) == _workdir_free(mine), (instance_id, purpose)
            assert all(c.prompt_ids and c.completion_ids for c in theirs)
