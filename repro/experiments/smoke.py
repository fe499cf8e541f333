"""The main job at this stage: tiny model -> CPU server -> proxy -> real mini-SWE-agent -> recorded rollout.

Whatever the (random-init) tiny model says, the harness run ends within its step limit and every call it
made is in the trace store with token ids; the job prints the rollout and writes ``metrics.json``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from harness_adapters.mini_swe_agent.adapter import ensure_mini_swe_agent_env, run_mini_swe_agent
from repro.recipe.setup import Setup
from repro.report.inspect import calls_table, console, rollouts_table
from repro.store import open_store
from repro.tinymodel.recipe import tiny_model


@dataclass
class DemoTask:
    """A one-file bug for the smoke run (real task distributions arrive with issue 3)."""

    task_id: str = "demo-add"
    filename: str = "calc.py"
    source: str = "def add(a, b):\n    return a - b\n"
    statement: str = "add(2, 3) returns -1 instead of 5. Fix `add` in calc.py."
    timeout_s: float = 300.0


def _corpus(task: DemoTask, harness_env_root: Path) -> list[str]:
    """Tokenizer training text: the harness's own prompt templates and the task."""
    texts = [task.statement, task.source]
    for path in sorted(harness_env_root.rglob("minisweagent/config/*.yaml")):
        texts.append(path.read_text())
    return texts


def smoke_job(setup: Setup, task: DemoTask, run_dir: Path) -> dict:
    """``task`` in the real mini-SWE-agent (``setup.harness``, run here: no sandbox) against the tiny model
    (``setup.model``) on ``setup.serving`` behind ``setup.proxy``; prints the recorded rollout."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # swebench's import turns on INFO logging globally
    run_dir, harness = Path(run_dir), setup.harness
    started = time.time()
    env = ensure_mini_swe_agent_env(harness.version)
    model_dir, cached = tiny_model(setup.model, _corpus(task, env.root))
    store = open_store(run_dir / "traces.sqlite")
    store.create_run(run_dir.name, yaml.safe_load((run_dir / "config.yaml").read_text()))
    store.close()
    workdir = run_dir / "workdir"
    workdir.mkdir()
    (workdir / task.filename).write_text(task.source)
    with setup.server(model_dir, run_dir) as stack:
        rollout_id = "smoke-0"
        base_url = stack.client.register(rollout_id=rollout_id, run_id=run_dir.name, task_id=task.task_id,
                                         harness="mini-swe-agent", harness_version=harness.version, mode="eval")
        result = run_mini_swe_agent(task.statement, workdir, base_url, stack.served_model_name, harness,
                                    run_dir / "harness", task.timeout_s, env=env)
        status = "finished" if result.status == "finished" else "failed"
        reason = None if status == "finished" else f"harness {result.status}: {result.reason}"
        stack.client.finish(rollout_id, status=status, failure_reason=reason)
    metrics = _metrics(run_dir, rollout_id, result, model_dir, cached, time.time() - started)
    (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    store = open_store(run_dir / "traces.sqlite")
    out = console()
    out.print(rollouts_table(store))
    out.print(calls_table(store, rollout_id))
    out.print(f"harness: {result.status} ({result.exit_status or result.reason}); "
                  f"{metrics['calls']} calls recorded with token ids: {metrics['calls_with_token_ids']}; "
                  f"run directory {run_dir}")
    return metrics


def _metrics(run_dir: Path, rollout_id: str, result, model_dir: Path, cached: bool, duration_s: float) -> dict:
    store = open_store(run_dir / "traces.sqlite")
    calls = store.calls(rollout_id)
    return {
        "kind": "smoke",
        "started_at": time.time() - duration_s,
        "duration_s": duration_s,
        "harness": result.as_dict(),
        "calls": len(calls),
        "harness_reported_calls": result.n_model_calls,
        "calls_with_token_ids": sum(1 for c in calls if c.prompt_ids and c.completion_ids is not None),
        "prompt_tokens": sum(len(c.prompt_ids or []) for c in calls),
        "completion_tokens": sum(len(c.completion_ids or []) for c in calls),
        "drift": asdict(store.drift_summary(rollout_id)),
        "model_dir": str(model_dir),
        "model_cached": cached,
    }
