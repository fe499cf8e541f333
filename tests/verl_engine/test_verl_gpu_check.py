"""``scripts/gpu_check.sh --server cpu --trainer verl``, the CPU dry run of the GPU check's verl steps: verl's actor
on the rows real mini-SWE-agent rollouts recorded through the proxy (its log-probs equal to the ones the server
sampled with; one update over 2 gloo processes)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_the_gpu_checks_verl_steps_pass_on_cpu(tmp_path: Path, verl_python: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "GPU_CHECK_BUDGET_S": "400"}
    command = [str(ROOT / "scripts" / "gpu_check.sh"), "--server", "cpu", "--trainer", "verl", "--n-rollouts", "4",
               "--allow-skips"]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=560)
    report = json.loads((out / "gpu_check.json").read_text())
    steps = {name: step["status"] for name, step in report["steps"].items()}
    assert proc.returncode == 0, (steps, proc.stdout[-3000:])
    assert steps["verl_env"] == steps["verl_actor"] == steps["rollouts"] == "passed"
    actor = report["steps"]["verl_actor"]
    assert actor["rows"] >= 4 and actor["max_abs_vs_served"] <= actor["tolerance"] and actor["processes"] == 2
    assert steps["verl_loop"] == "skipped" and "no GPU" in report["steps"]["verl_loop"]["reason"]
