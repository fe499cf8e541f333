"""The miniature reproduction end to end at a small size: expert demonstrations through the real harness ->
SFT -> frozen eval -> RL steps on proxy-recorded rollouts (weights pushed to the live server) -> frozen eval."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from repro.common.files import weights_sha256
from repro.store import open_store
from tests.support import SMALL, repro_cli

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(("experiment", "demo_calls"), [
    ("mini_repro", {3, 4}),
    # ~60 s: the same phases as the default's; its one-call expert runs in test_expert_mini_swe_agent
    pytest.param("mini_repro_one_call", {1}, marks=pytest.mark.slow)])
def test_mini_repro_runs_every_phase_through_the_proxy(tmp_path: Path, experiment: str, demo_calls: set[int]) -> None:
    root = Path(__file__).parents[2]
    out = repro_cli("run", f"experiment={experiment}", f"run.output_root={tmp_path}", *SMALL, cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    (metrics_path,) = tmp_path.glob(f"{experiment}/*/metrics.json")
    metrics, run_dir = json.loads(metrics_path.read_text()), metrics_path.parent
    assert metrics["kind"] == "before_after" and metrics["paired"]["n"] == 4
    assert metrics["before"]["fingerprint"] == metrics["after"]["fingerprint"] == metrics["fingerprint"]
    assert metrics["before"]["n_samples"] == metrics["after"]["n_samples"] == 4 * 2
    assert 0 < metrics["paired"]["sign_flip_p"] <= 1
    assert metrics["probe"] is None  # the filter is off here (tests/integration/test_probe_filter.py runs it)
    assert metrics["habits"]["before"]["samples"] == metrics["habits"]["after"]["samples"] == 4 * 2
    assert sum(metrics["before"]["calls_histogram"].values()) == 4 * 2
    assert not metrics["warm_start"]["cached"] and metrics["warm_start"]["demo_rollouts"] == 24
    assert set(metrics["compute"]["phases"]) >= {"warm_start_demos", "warm_start_sft", "eval_before", "rl_rollouts",
                                                  "rl_training", "eval_after"}
    store = open_store(run_dir / "traces.sqlite")
    rollouts = store.list_rollouts()
    demos = [r for r in rollouts if r.mode == "demo"]
    train = [r for r in rollouts if r.mode == "train"]
    assert len(demos) == 24 and all(r.status == "finished" for r in demos)
    for demo in demos:  # the expert acts through the real harness: one call, or (locate) look, edit, check (a 4th
        calls = store.calls(demo.rollout_id)  # after a slip); each recorded with token ids
        assert len(calls) in demo_calls and all(c.prompt_ids and c.completion_ids for c in calls)
    if experiment == "mini_repro":  # demonstrations and RL: locate tasks only, as evaluated
        assert all("-lc-" in r.task_id for r in rollouts if r.mode in ("train", "demo"))
    assert len(train) == 2 * 2 * 3 and all(r.reward in (0.0, 1.0) for r in train if r.status == "finished")
    history = metrics["rl"]["history"]
    assert [h["step"] for h in history] == [0, 1]
    for step in history:  # every token the model sampled in the step's rollouts reaches a row, once
        calls = [c for r in train if r.run_id == f"step_{step['step']:03d}" for c in store.calls(r.rollout_id)]
        usable = [c for c in calls if c.status in ("ok", "truncated") and c.prompt_ids and c.completion_ids]
        assert step["samples"]["rollouts"] == 6
        assert step["samples"]["sampled_tokens"] == sum(len(c.completion_ids) for c in usable)
    assert (run_dir / "policy" / "model.safetensors").exists()
    weights = metrics["weights_sha256"]
    assert weights["after"] == weights_sha256(run_dir / "policy")
    assert weights["before"] == weights_sha256(Path(metrics["warm_start"]["path"]))
    trained = any(h["update"]["updates"] for h in history)  # all-equal groups (no advantage) leave the weights
    assert (weights["after"] != weights["before"]) == trained
    steps = [json.loads(line) for line in (run_dir / "rl" / "diagnostics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [0, 1] and steps == metrics["diagnostics"]
    for step in steps:  # the on-policy check held, and every diagnostic is a number in its range
        assert step["log_ratio_first_max"] < 1e-3 and step["entropy"] > 0 and step["calls_per_rollout"] >= 1
        assert 0 <= step["mixed_group_share"] <= 1 and 0 <= step["clip_fraction"] <= 1
    assert "rl step 2/2: reward" in out.stdout and "phase eval_after" in out.stdout
    assert "done, " in out.stdout and " resolved" in out.stdout
    assert metrics["fingerprint"][:8] in out.stdout
    sha = json.loads((run_dir / "manifest.json").read_text())["git_sha"]
    assert sha is None or f"at commit `{sha[:7]}`" in out.stdout  # the printed protocol line names the run's commit
    table = repro_cli("table", "--outputs", str(tmp_path), "--results", str(tmp_path / "results"), cwd=tmp_path)
    assert table.returncode == 0, table.stderr[-2000:]
    assert metrics["fingerprint"][:8] in (tmp_path / "results" / f"{experiment}.md").read_text()


@pytest.mark.slow  # ~2 min: Hydra's multirun path runs in test_harness_sweep, the pooled row in test_sweep_table
def test_seeds_multirun_prints_a_row_per_seed_and_a_pooled_row(tmp_path: Path) -> None:
    tiny = [*SMALL, "rl.steps=1", "warm_start.use_cache=true"]
    out = repro_cli("run", "-m", "experiment=mini_repro", f"run.output_root={tmp_path}", "seed=0,1", *tiny,
                    env={**os.environ, "REPRO_CACHE_DIR": str(tmp_path / "cache")})
    assert out.returncode == 0, out.stderr[-3000:]
    runs = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("mini_repro/*/*/metrics.json"))]
    assert [r["seed"] for r in runs] == [0, 1]
    assert runs[0]["warm_start"]["key"] != runs[1]["warm_start"]["key"]  # the seed trains its own warm start
    (sweep_md,) = tmp_path.glob("mini_repro/*/sweep.md")
    text = sweep_md.read_text()
    assert "pooled (2 seeds)" in text and " 0,1 " in text and text.strip() in out.stdout
