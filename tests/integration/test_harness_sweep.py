"""`repro run -m experiment=harness_sweep ...`: the real CLI, Hydra multirun, real harnesses (mini-SWE-agent 2.4.6
and 1.17.5) x two task distributions at a tiny size; one run and one fingerprint per cell, the matrix at the end
and in `repro table`; a version that does not exist fails its cell with a message naming it, the others run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from repro.report.tables import write_tables
from tests.support import ROOT, repro_cli

pytestmark = pytest.mark.e2e


def test_sweep_of_two_versions_by_two_distributions(tmp_path: Path) -> None:
    out, checkpoint = tmp_path / "outputs", tmp_path / "checkpoint"
    build = subprocess.run([sys.executable, "-m", "repro.cli.commands", "build-model", "--out", str(checkpoint),
                            "--vocab-size", "512"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    proc = repro_cli("run", "-m", "experiment=harness_sweep", f"eval.checkpoint={checkpoint}",
                     "harness=mini_swe_agent,mini_swe_agent_v1",
                     "tasks.difficulty=one_step_brief,one_step", "tasks.n_tasks=2", "eval.k=1",
                     "eval.max_tokens=24", f"run.output_root={out}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    metrics = [json.loads(p.read_text()) for p in sorted(out.glob("harness_sweep/*/*/metrics.json"))]
    cells = {(m["harness"], m["task_distribution"].split(":")[3]) for m in metrics}
    assert cells == {(h, t) for h in ("mini-swe-agent@2.4.6", "mini-swe-agent@1.17.5")
                     for t in ("one_step_brief", "one_step")}
    assert len({m["fingerprint"] for m in metrics}) == 4  # the harness and the tasks are both in the spec
    assert all(m["complete"] and m["n_samples"] == 2 and m["layout"] == "matrix" for m in metrics)
    (sweep_md,) = out.glob("harness_sweep/*/sweep.md")
    matrix = sweep_md.read_text()
    assert re.search(r"^\| mini-swe-agent@1\.17\.5 +\|", matrix, re.M)
    assert re.search(r"^\| mini-swe-agent@2\.4\.6 +\|", matrix, re.M)
    assert "WARNING" not in matrix  # one checkpoint in every cell, all complete
    assert matrix in proc.stdout  # printed when the last job ended
    written = write_tables(out, tmp_path / "results")
    assert {p.name for p in written} == {"harness_sweep.md", "harness_sweep.csv", "harness_sweep.svg"}


def test_a_version_that_does_not_exist_fails_its_cell_and_names_it(tmp_path: Path) -> None:
    out = tmp_path / "outputs"
    proc = repro_cli("run", "-m", "experiment=harness_sweep", "model=tiny", "harness.version=2.4.99,2.4.6",
                     "tasks.n_tasks=1", "eval.k=1", "eval.max_tokens=16", f"run.output_root={out}")
    assert proc.returncode != 0
    assert "mini-swe-agent 2.4.99 does not exist" in proc.stdout + proc.stderr
    assert "1 of 2 sweep jobs failed" in proc.stderr
    assert len(list(out.glob("harness_sweep/*/*/metrics.json"))) == 1  # the good cell still ran
    single = repro_cli("run", "experiment=eval_bundled", "harness=mini_swe_agent_v1", "harness.version=3.0.0",
                       f"run.output_root={out}", timeout=120)
    assert single.returncode != 0
    assert "error: the harness registry refuses mini-swe-agent 3.0.0" in single.stderr
    assert "Traceback" not in single.stderr
