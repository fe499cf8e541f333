"""The scripted expert's rollouts through the real mini-SWE-agent (real CPU server, real proxy), in any sandbox:
shared by the local and the docker end-to-end tests."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from harness_adapters.mini_swe_agent import MiniSweAgentConfig, is_v1
from harness_adapters.mini_swe_agent_pool import MiniSweAgentHarness
from harness_adapters.mini_swe_agent_v1 import MiniSweAgentV1Harness
from repro.jobs.stack import CpuServingConfig, running_stack
from repro.protocols import HarnessRollout
from repro.proxy import ProxyConfig
from repro.tasks.distributions import TaskDistributionConfig, build_distribution
from repro.tasks.schema import Task
from repro.tinymodel.model import TinyModelConfig
from repro.tinymodel.recipe import build_recipe_model


def _harness(cfg: MiniSweAgentConfig) -> Any:
    if is_v1(cfg.version):
        return MiniSweAgentV1Harness(cfg)
    return MiniSweAgentHarness(cfg, workers=1)


def run_expert(root: Path, config: TaskDistributionConfig, harness_cfg: MiniSweAgentConfig, sandbox: Any,
               rollout_prefix: str = "expert", while_up: Callable[[Any], None] | None = None,
               rows: list[Task] | None = None) -> dict:
    """The expert's rollouts of ``config``'s tasks in ``sandbox``'s workspaces (a container spec, where the
    workspace has one), and their grades; ``while_up(sandbox)`` runs after grading, while the harness is still up.
    ``rows``: other rows of the same tasks (same statements, e.g. in SWE-smith's schema) to run instead; the expert
    knows a task by its statement."""
    expert_tasks = build_distribution(config)
    tasks = rows if rows is not None else expert_tasks
    tasks_jsonl = root / "tasks.jsonl"
    tasks_jsonl.write_text("".join(json.dumps(t.to_row()) + "\n" for t in expert_tasks))
    model_dir = build_recipe_model(TinyModelConfig(vocab_size=1024, recipe_tokens=True), harness_cfg, expert_tasks)
    with running_stack(model_dir, CpuServingConfig(), ProxyConfig(), root, expert_tasks=tasks_jsonl) as stack, \
            _harness(harness_cfg) as harness:
        rollouts, workspaces = [], []
        for i, task in enumerate(tasks):
            rollout_id = f"{rollout_prefix}-{i}"
            resp = httpx.post(f"{stack.proxy_url}/rollouts", json={"rollout_id": rollout_id,
                                                                   "task_id": task.instance_id, "mode": "eval"})
            assert resp.status_code == 201, resp.text
            workspace = sandbox.workspace(task, rollout_id)
            workspaces.append(workspace)
            rollouts.append(HarnessRollout(rollout_id, task, workspace.path,
                                           f"{stack.proxy_url}/rollouts/{rollout_id}/v1",
                                           stack.served_model_name, root / "harness" / rollout_id, 120.0,
                                           container=getattr(workspace, "container_spec", None)))
        results = harness.run(rollouts, concurrency=3)
        for workspace, result in zip(workspaces, results, strict=True):
            if hasattr(workspace, "adopt"):
                workspace.adopt(result)
        grades = [sandbox.grade(task, workspace) for task, workspace in zip(tasks, workspaces, strict=True)]
        if while_up is not None:
            while_up(sandbox)
    return {"tasks": tasks, "results": results, "grades": grades, "workspaces": workspaces,
            "store": root / "traces.sqlite", "model_dir": model_dir}
