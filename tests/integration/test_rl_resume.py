"""RL resumes mid-run: a miniature killed (SIGKILL) after its first RL step finishes, rerun on the same run
directory, keeps that step (its record, rollouts and update are not redone), loads the trainer's state, runs the
second step and evaluates. Slow (three runs of the small miniature); the trainer's bit-exact resume is a unit test
(tests/unit/test_trainer_resume.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import SMALL

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def test_a_killed_rl_run_resumes_after_its_last_finished_step(tmp_path: Path) -> None:
    root = Path(__file__).parents[2]
    env = {**os.environ, "REPRO_CACHE_DIR": str(tmp_path / "cache")}
    args = [sys.executable, "-m", "repro.cli.commands", "run", "experiment=mini_repro", *SMALL,
            "warm_start.use_cache=true", f"run.output_root={tmp_path}"]
    proc = subprocess.Popen(args, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 900
    for line in proc.stdout:
        if line.startswith("rl step 1/2: reward") or time.monotonic() > deadline:
            break
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    (run_dir,) = tmp_path.glob("mini_repro/*")
    first_record = (run_dir / "rl" / "step_000" / "step_record.json").read_text()
    assert not (run_dir / "rl" / "step_001" / "step_record.json").exists()
    resumed = subprocess.run([*args, f"run.dir={run_dir}"], cwd=root, env=env, capture_output=True, text=True,
                             timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "rl: resuming after step 1/2" in resumed.stdout
    assert (run_dir / "rl" / "step_000" / "step_record.json").read_text() == first_record
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert [h["step"] for h in metrics["rl"]["history"]] == [0, 1]
