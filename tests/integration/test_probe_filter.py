"""The RL task filter's probe step end to end: k rollouts per candidate in the real mini-SWE-agent through the
proxy (mode ``probe``), graded, classified and cached. The policy is the scripted expert slipping on a seeded half
of the tasks, so which tasks fail every probe is known in advance; the three-call ``locate`` procedure runs."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness_adapters.mini_swe_agent.adapter import MiniSweAgentConfig
from harness_adapters.mini_swe_agent.pool import MiniSweAgentHarness
from repro.common.files import weights_sha256
from repro.evaluation.habits import slip_share
from repro.proxy import ProxyConfig
from repro.rl.task_probe import filter_rl_tasks
from repro.sandbox.local import LocalSandbox, LocalSandboxConfig
from repro.serving.stack import CpuServingConfig, running_stack
from repro.store import open_store
from repro.tasks.distributions import TaskDistributionConfig, build_distribution
from repro.tinymodel.expert import slipped
from repro.tinymodel.model import TinyModelConfig
from repro.tinymodel.recipe import build_recipe_model
from repro.train.task_filter import ALL_FAIL, ALL_PASS, TaskFilterConfig

TASKS = TaskDistributionConfig(seed=0, split="validation", n_tasks=6, families=["procedural"], operators=["recipe"],
                               difficulty="locate")
HARNESS = MiniSweAgentConfig(step_limit=4)
SLIP = 0.5


def test_probes_classify_the_tasks_and_are_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPRO_CACHE_DIR", str(tmp_path / "cache"))
    tasks = build_distribution(TASKS)
    failing = {t.instance_id for t in tasks if slipped(t.instance_id, SLIP)}
    assert 0 < len(failing) < len(tasks)
    tasks_jsonl = tmp_path / "tasks.jsonl"
    tasks_jsonl.write_text("".join(json.dumps(t.to_row()) + "\n" for t in tasks))
    model_dir = build_recipe_model(TinyModelConfig(vocab_size=1024, recipe_tokens=True), HARNESS, tasks)
    cfg = TaskFilterConfig(enabled=True, pool=len(tasks), k=2, all_fail_share=0.5, min_tasks=0, concurrency=4)
    sampling = {"temperature": 1.0, "max_tokens": 96}
    box, sha = LocalSandbox(LocalSandboxConfig()), weights_sha256(model_dir)  # the probing weights: the cache key
    try:
        with running_stack(model_dir, CpuServingConfig(), ProxyConfig(port=0), tmp_path, expert_tasks=tasks_jsonl,
                           server_overrides={"expert_slip_rate": SLIP}) as stack, \
                MiniSweAgentHarness(HARNESS, workers=1) as agent:
            kept, summary = filter_rl_tasks(tmp_path, tasks, cfg, sampling, sha, stack, agent, box)
            again, cached = filter_rl_tasks(tmp_path / "again", tasks, cfg, sampling, sha, stack, agent, box)
            strict = TaskFilterConfig(**{**cfg.__dict__, "min_tasks": 1, "fallback": "error"})
            with pytest.raises(SystemExit, match=r"rl_filter\.min_tasks"):
                filter_rl_tasks(tmp_path, tasks, strict, sampling, sha, stack, agent, box)
            fallen, fell = filter_rl_tasks(tmp_path, tasks, TaskFilterConfig(**{**cfg.__dict__, "min_tasks": 1}),
                                           sampling, sha, stack, agent, box)
    finally:
        box.close()
    counts = summary["counts"]
    assert counts == {"mixed": 0, ALL_FAIL: len(failing), ALL_PASS: len(tasks) - len(failing), "kept": 0,
                      "kept_all_fail": 0}  # no mixed task: nothing to set the all-fail share against
    assert kept == [] and summary["pass_at_k"]["1"] == pytest.approx(1 - len(failing) / len(tasks))
    assert summary["calls_per_rollout"] == {"3": 2 * (len(tasks) - len(failing)), "4": 2 * len(failing)}
    assert not summary["reused"] and cached["reused"] and cached["counts"] == counts and again == kept
    assert fallen == tasks and "fallback" not in summary  # fewer than min_tasks kept: every probed task, recorded
    assert fell["fallback"] == {"rule": "unfiltered", "kept_by_filter": 0, "min_tasks": 1, "tasks": len(tasks)}
    store = open_store(tmp_path / "traces.sqlite")
    probes = [r for r in store.list_rollouts() if r.mode == "probe"]
    assert len(probes) == 2 * len(tasks) and not (tmp_path / "again" / "probe").exists()
    assert len({r.metadata["sampling"]["seed"] for r in probes}) == len(probes)  # a seed per (task, sample)
    reports = [SimpleNamespace(rollout_id=r.rollout_id, instance_id=r.task_id) for r in probes]
    habit = slip_share(tmp_path / "traces.sqlite", reports, {t.instance_id: t.operator for t in tasks})
    assert (habit["slipped"], habit["samples"]) == (2 * len(failing), len(probes))  # counted from the commands
    assert sum(n for n, _ in habit["by_operator"].values()) == habit["slipped"]
