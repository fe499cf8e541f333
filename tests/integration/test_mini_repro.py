"""The miniature reproduction end to end at a small size: expert demonstrations through the real harness ->
SFT -> frozen eval -> RL steps on proxy-recorded rollouts (weights pushed to the live server) -> frozen eval."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from repro.store import open_store

SMALL = ["warm_start.n_demo_tasks=24", "train_tasks.n_tasks=30", "warm_start.sft.epochs=1", "rl.steps=2",
         "rl.tasks_per_step=2", "rl.samples_per_task=3", "tasks.n_tasks=4", "warm_start.use_cache=false", "eval.k=2"]


def _repro(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "repro.cli", *args], capture_output=True, text=True, timeout=900,
                          cwd=cwd, env=env)


def test_mini_repro_runs_every_phase_through_the_proxy(tmp_path: Path) -> None:
    root = Path(__file__).parents[2]
    out = _repro("run", "experiment=mini_repro", f"run.output_root={tmp_path}", *SMALL, cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    (metrics_path,) = tmp_path.glob("mini_repro/*/metrics.json")
    metrics, run_dir = json.loads(metrics_path.read_text()), metrics_path.parent
    assert metrics["kind"] == "before_after" and metrics["paired"]["n"] == 4
    assert metrics["before"]["fingerprint"] == metrics["after"]["fingerprint"] == metrics["fingerprint"]
    assert metrics["before"]["n_samples"] == metrics["after"]["n_samples"] == 4 * 2
    assert 0 < metrics["paired"]["sign_flip_p"] <= 1
    assert not metrics["warm_start"]["cached"] and metrics["warm_start"]["demo_rollouts"] == 24
    assert set(metrics["compute"]["phases"]) >= {"warm_start_demos", "warm_start_sft", "eval_before", "rl_rollouts",
                                                  "rl_training", "eval_after"}
    store = open_store(run_dir / "traces.sqlite")
    rollouts = store.list_rollouts()
    demos = [r for r in rollouts if r.mode == "demo"]
    train = [r for r in rollouts if r.mode == "train"]
    assert len(demos) == 24 and all(r.status == "finished" for r in demos)
    for demo in demos:  # the expert acts through the real harness: one recorded call with token ids each
        (call,) = store.calls(demo.rollout_id)
        assert call.prompt_ids and call.completion_ids
    assert len(train) == 2 * 2 * 3 and all(r.reward in (0.0, 1.0) for r in train if r.status == "finished")
    history = metrics["rl"]["history"]
    assert [h["step"] for h in history] == [0, 1]
    for step in history:  # every token the model sampled in the step's rollouts reaches a row, once
        calls = [c for r in train if r.run_id == f"step_{step['step']:03d}" for c in store.calls(r.rollout_id)]
        usable = [c for c in calls if c.status in ("ok", "truncated") and c.prompt_ids and c.completion_ids]
        assert step["samples"]["rollouts"] == 6
        assert step["samples"]["sampled_tokens"] == sum(len(c.completion_ids) for c in usable)
    assert (run_dir / "policy" / "model.safetensors").exists()
    assert metrics["fingerprint"][:8] in out.stdout
    table = _repro("table", "--outputs", str(tmp_path), "--results", str(tmp_path / "results"), cwd=tmp_path)
    assert table.returncode == 0, table.stderr[-2000:]
    assert metrics["fingerprint"][:8] in (tmp_path / "results" / "mini_repro.md").read_text()
