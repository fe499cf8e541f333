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
from repro.recipe.expert_runs import expert_stack, locate_tasks, run_tasks
from repro.rl.evaluator import EvalConfig, build_spec
from repro.sandbox.local import LocalSandboxConfig
from repro.store import open_store

N_TASKS = 2
LAUNCHERS = ("run", "serve")


def _launch(launcher: str, root: Path, tasks: list) -> dict[str, Any]:
    cfg = OpenCodeConfig(output_limit=256, isolation="none", launcher=launcher)
    with get_harness("opencode", cfg) as harness, expert_stack(tasks, root) as stack:
        reports = run_tasks(harness, stack, tasks, root / "run", root / "traces.sqlite", experiment="opencode",
                            concurrency=2)
        fingerprint = build_spec(harness, "bundled", tasks, LocalSandboxConfig(), EvalConfig(experiment="opencode",
                                 max_tokens=256, concurrency=2), 0, stack.served_model_name).fingerprint()
    store = open_store(root / "traces.sqlite")
    calls = {r.instance_id: store.calls(r.rollout_id) for r in reports}
    store.close()
    records = {r.instance_id: json.loads((root / "run" / "harness" / r.rollout_id / "harness_run.json").read_text())
               for r in reports}
    return {"reports": {r.instance_id: r for r in reports}, "calls": calls, "records": records,
            "fingerprint": fingerprint}


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    ensure_opencode_env(OpenCodeConfig().version)
    root = tmp_path_factory.mktemp("opencode-serve")
    tasks = locate_tasks(N_TASKS)
    return {launcher: _launch(launcher, root / launcher, tasks) for launcher in LAUNCHERS}


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
        assert len(run["reports"]) == N_TASKS
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
