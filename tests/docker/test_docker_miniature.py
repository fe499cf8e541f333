"""The miniature's every phase with ``sandbox=docker`` at a tiny size: expert demonstrations, the frozen evaluations
and the RL rollouts all run with the unchanged mini-SWE-agent acting inside task containers (images from
``repro images build`` on the same overrides), every call recorded through the proxy; no container outlives it."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from repro.sandbox.docker_engine import LABEL_RUN
from repro.store import open_store
from tests.docker_support import docker_engine
from tests.support import repro_cli

pytestmark = pytest.mark.e2e

TINY = ["experiment=mini_repro", "sandbox=docker", "warm_start.n_demo_tasks=6", "train_tasks.n_tasks=9",
        "warm_start.sft.epochs=1", "rl.steps=1", "rl.tasks_per_step=2", "rl.samples_per_task=2", "tasks.n_tasks=2",
        "warm_start.use_cache=false", "eval.k=1", "rl_filter.enabled=false"]


def test_the_miniature_runs_every_phase_inside_task_containers(tmp_path: Path) -> None:
    engine = docker_engine()
    built = repro_cli("images", "build", *TINY)
    assert built.returncode == 0, built.stderr[-2000:]
    run_id = f"repro-test-miniature-{uuid.uuid4().hex[:8]}"  # its containers' label (other tests run beside it)
    out = repro_cli("run", *TINY, f"sandbox.run_id={run_id}", f"run.output_root={tmp_path}")
    assert out.returncode == 0, out.stderr[-3000:]
    (metrics_path,) = tmp_path.glob("mini_repro/*/metrics.json")
    metrics, run_dir = json.loads(metrics_path.read_text()), metrics_path.parent
    assert metrics["before"]["fingerprint"] == metrics["after"]["fingerprint"]
    assert "_target_: repro.sandbox.docker.DockerSandboxConfig" in (run_dir / "config.yaml").read_text()
    assert metrics["before"]["spec"]["sandbox"]["kind"] == "docker"
    store = open_store(run_dir / "traces.sqlite")
    rollouts = store.list_rollouts()
    by_mode = {mode: [r for r in rollouts if r.mode == mode] for mode in ("demo", "eval", "train")}
    assert len(by_mode["demo"]) == 6 and len(by_mode["train"]) == 4 and len(by_mode["eval"]) == 2 * 2
    assert all(store.calls(r.rollout_id) for r in rollouts)
    trajectories = list(run_dir.rglob("trajectory.traj.json"))
    assert len(trajectories) >= len(rollouts)
    for path in trajectories:
        info = json.loads(path.read_text())["info"]["config"]
        assert info["environment_type"] == "minisweagent.environments.docker.DockerEnvironment", path
    assert engine.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run_id}"}) == []
