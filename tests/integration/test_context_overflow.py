"""A prompt that outgrows the served model's context, end to end: the real mini-SWE-agent 2.4.6 (no compaction of its
own) keeps calling a scripted CPU server whose ``max_model_len`` admits its first call only; the proxy answers the
next with OpenAI's ``context_length_exceeded``, the harness stops on it, and the rollout is graded with the
``context_exceeded`` outcome: counted apart from infrastructure failures, its refused call named in the trace
store's rollout record, where the trainer's rule (``samples.context_exceeded``) reads it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from harness_adapters.mini_swe_agent.adapter import MiniSweAgentConfig
from harness_adapters.mini_swe_agent.pool import MiniSweAgentHarness
from repro.proxy import ProxyConfig
from repro.rl.evaluator import EvalConfig, Evaluator, build_spec
from repro.sandbox.local import LocalSandbox, LocalSandboxConfig
from repro.serving.stack import CpuServingConfig, running_stack
from repro.store import open_store
from repro.tasks.distributions import TaskDistributionConfig, build_distribution
from repro.tinymodel.expert import tool_call_text
from repro.tinymodel.model import TinyModelConfig, build_tiny_model

HARNESS = MiniSweAgentConfig(step_limit=4, max_tokens=64)
TASKS = TaskDistributionConfig(seed=0, split="test", n_tasks=1, families=["procedural"], difficulty="one_step")
SCENARIOS = {"steps": [tool_call_text("ls -la")]}  # never submits: each call adds an observation


def _evaluate(root: Path, model_dir: Path, max_model_len: int, harness: MiniSweAgentHarness,
              ) -> tuple[list[Any], Any, list[Any]]:
    root.mkdir()
    tasks = [replace(t, problem_statement=f"SCENARIO steps. {t.problem_statement}") for t in build_distribution(TASKS)]
    ev = EvalConfig(experiment="overflow", max_tokens=HARNESS.max_tokens, concurrency=1)
    sandbox = LocalSandbox(LocalSandboxConfig())
    try:
        with running_stack(model_dir, CpuServingConfig(), ProxyConfig(port=0), root,
                           server_overrides={"scenarios": root.parent / "scenarios.json",
                                             "max_model_len": max_model_len}) as stack:
            spec = build_spec(harness, "bundled", tasks, LocalSandboxConfig(), ev, 0, stack.served_model_name)
            reports = Evaluator(stack, harness, sandbox, ev, spec=spec).evaluate(tasks, root / "run").reports
    finally:
        sandbox.close()
    store = open_store(root / "traces.sqlite")
    (rollout,) = store.list_rollouts()
    calls = store.calls(rollout.rollout_id)
    store.close()
    return reports, rollout, calls


@pytest.fixture(scope="module")
def overflow(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("overflow")
    (base / "scenarios.json").write_text(json.dumps(SCENARIOS))
    model_dir = build_tiny_model(base / "model", TinyModelConfig(vocab_size=1024), [])
    with MiniSweAgentHarness(HARNESS, workers=1) as harness:  # one worker pool for both servers
        _, _, roomy = _evaluate(base / "roomy", model_dir, 65536, harness)  # how long the first prompt is
        first = roomy[0].prompt_tokens
        limit = first + HARNESS.max_tokens + 1  # the first call fits with its max_tokens, the second cannot
        reports, rollout, calls = _evaluate(base / "tight", model_dir, limit, harness)
    return {"roomy": roomy, "limit": limit, "reports": reports, "rollout": rollout, "calls": calls}


def test_without_a_limit_the_rollout_runs_to_its_step_limit(overflow: dict[str, Any]) -> None:
    """Control: the same scripted rollout with room makes every call (the limit below is what stops it)."""
    assert [c.status for c in overflow["roomy"]] == ["ok"] * HARNESS.step_limit


def test_the_refused_call_is_recorded_as_context_exceeded(overflow: dict[str, Any]) -> None:
    calls = overflow["calls"]
    assert [c.status for c in calls] == ["ok", "context_exceeded"], [(c.status, c.error) for c in calls]
    assert f"maximum context length is {overflow['limit']} tokens" in calls[1].error


def test_the_rollout_ends_with_the_context_exceeded_outcome(overflow: dict[str, Any]) -> None:
    (report,) = overflow["reports"]
    assert report.context_exceeded and not report.infra_failure, report
    assert (report.context_refusals, report.context_exceeded_seq) == (1, 1)
    assert "ContextWindowExceeded" in report.harness_exit_status + report.harness_reason  # LiteLLM's own class
    rollout = overflow["rollout"]
    assert rollout.status == "finished" and rollout.reward == 0.0
    assert rollout.metadata["context_exceeded_seq"] == 1  # what samples.context_exceeded reads
