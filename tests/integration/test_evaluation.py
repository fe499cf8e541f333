"""Frozen evaluation end to end: the real mini-SWE-agent on bundled tasks through the proxy and the CPU server,
graded in the local sandbox; determinism under the same spec; gold / empty patch validation."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from harness_adapters.mini_swe_agent.adapter import MiniSweAgentConfig
from repro.experiments.evaluate import evaluate_job
from repro.proxy import ProxyConfig
from repro.recipe.setup import Setup
from repro.rl.evaluator import EvalConfig
from repro.sandbox.local import LocalSandbox, LocalSandboxConfig
from repro.serving.stack import CpuServingConfig
from repro.store import open_store
from repro.tasks.distributions import TaskDistributionConfig, build_distribution
from repro.tinymodel.model import TinyModelConfig

TASKS = TaskDistributionConfig(seed=0, split="test", n_tasks=3, families=["packages", "procedural"])
SETUP = Setup(TinyModelConfig(vocab_size=512), CpuServingConfig(), ProxyConfig(port=0),
              MiniSweAgentConfig(step_limit=2, max_tokens=32), "mini-swe-agent", LocalSandboxConfig())


def _evaluate(run_dir: Path, **eval_overrides) -> dict:
    run_dir.mkdir(parents=True)
    return evaluate_job(SETUP, TASKS, EvalConfig(experiment="it", max_tokens=32, concurrency=3, **eval_overrides),
                        run_dir)


def _completions(run_dir: Path) -> dict[str, list[list[int]]]:
    store = open_store(run_dir / "traces.sqlite")
    reports = [json.loads(p.read_text()) for p in run_dir.glob("instances/*/sample-0/report.json")]
    return {r["instance_id"]: [c.completion_ids for c in store.calls(r["rollout_id"])] for r in reports}


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> tuple[Path, dict, Path, dict]:
    root = tmp_path_factory.mktemp("eval")
    first = _evaluate(root / "a")
    second = _evaluate(root / "b")
    return root / "a", first, root / "b", second


def test_every_harness_call_is_recorded_under_its_rollout(two_runs) -> None:
    run_dir, metrics, _, _ = two_runs
    assert metrics["n_samples"] == 3 and metrics["complete"]
    assert sum(metrics["counts"][o] for o in ("resolved", "unresolved", "error", "timeout")) == 3
    store = open_store(run_dir / "traces.sqlite")
    for path in run_dir.glob("instances/*/sample-0/report.json"):
        report = json.loads(path.read_text())
        rollout = store.get_rollout(report["rollout_id"])
        assert rollout.task_id == report["instance_id"] and rollout.mode == "eval"
        calls = store.calls(report["rollout_id"])
        assert report["harness_status"] == "finished"
        assert len(calls) == report["n_calls"] >= 1
        assert all(c.prompt_ids and c.completion_ids for c in calls)
        assert all(c.sampling_overrides["temperature"] == 0.0 for c in calls)
    preds = json.loads((run_dir / "preds.json").read_text())
    assert sorted(p["instance_id"] for p in preds) == sorted(metrics["spec"]["tasks"]["instance_ids"])


def test_same_spec_twice_gives_identical_outcomes_and_tokens(two_runs) -> None:
    run_a, metrics_a, run_b, metrics_b = two_runs
    assert metrics_a["fingerprint"] == metrics_b["fingerprint"]
    assert metrics_a["per_task"] == metrics_b["per_task"]
    assert _completions(run_a) == _completions(run_b)  # greedy decoding: the very same tokens


def test_rerun_of_a_finished_run_skips_everything(two_runs) -> None:
    run_dir, metrics, _, _ = two_runs
    again = evaluate_job(SETUP, TASKS, EvalConfig(experiment="it", max_tokens=32, concurrency=3), run_dir)
    assert again["extra"]["samples_run_now"] == 0
    assert again["per_task"] == metrics["per_task"]


@pytest.mark.parametrize("families", [["packages"], ["procedural"]])
def test_gold_patch_resolves_and_empty_patch_does_not(families: list[str]) -> None:
    tasks = build_distribution(replace(TASKS, families=families, n_tasks=4))
    sandbox = LocalSandbox(LocalSandboxConfig())
    try:
        for task in tasks:
            assert sandbox.grade_patch(task, task.patch).outcome == "resolved", task.instance_id
            assert sandbox.grade_patch(task, "").outcome == "unresolved", task.instance_id
            workspace = sandbox.workspace(task, "history-check")
            history = subprocess.run(["git", "log", "--all", "--format=%H"], cwd=workspace.path,
                                     capture_output=True, text=True, check=True).stdout.split()
            assert history == [workspace.base_commit], "the workspace's git history must not reveal the fix"
            trees = [subprocess.run(["git", "rev-parse", f"{c}^{{tree}}"], cwd=cwd, capture_output=True, text=True,
                                    check=True).stdout for c, cwd in ((workspace.base_commit, workspace.path),
                                                                       (task.base_commit, task.repo_path))]
            assert trees[0] == trees[1]  # the base files, under a commit of their own
            workspace.cleanup()
    finally:
        sandbox.close()
