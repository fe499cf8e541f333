"""The README's main job, `repro run`, end to end on the real stack (tiny model, CPU server, proxy, mini-SWE-agent)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repro.store import open_store
from tests.support import repro_cli


@pytest.mark.e2e
def test_frozen_eval_run_evaluates_and_prints_the_table(tmp_path: Path) -> None:
    root = Path(__file__).parents[2]
    out = repro_cli("run", "experiment=eval_bundled", f"run.output_root={tmp_path}", "tasks.n_tasks=2",
                    "harness.step_limit=2", cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    (metrics_path,) = tmp_path.glob("eval_bundled/*/metrics.json")
    metrics = json.loads(metrics_path.read_text())
    assert metrics["kind"] == "eval" and metrics["complete"] and metrics["n_samples"] == 2
    assert "| eval_bundled" in out.stdout and metrics["fingerprint"][:8] in out.stdout
    run_dir = metrics_path.parent
    assert len(json.loads((run_dir / "preds.json").read_text())) == 2
    shown = repro_cli("inspect", str(run_dir), cwd=tmp_path)
    assert shown.returncode == 0 and "2 rollouts in 1 phase" in shown.stdout
    table = repro_cli("table", "--outputs", str(tmp_path), "--results", str(tmp_path / "results"), cwd=tmp_path)
    assert table.returncode == 0, table.stderr[-2000:]
    assert metrics["fingerprint"][:8] in (tmp_path / "results" / "eval_bundled.md").read_text()


@pytest.mark.e2e
def test_smoke_run_records_every_harness_call(tmp_path: Path) -> None:
    out = repro_cli("run", "experiment=smoke", f"run.output_root={tmp_path}", "harness.step_limit=2",
                    cwd=Path(__file__).parents[2])
    assert out.returncode == 0, out.stderr[-3000:]
    (metrics_path,) = tmp_path.glob("smoke/*/metrics.json")
    metrics = json.loads(metrics_path.read_text())
    assert metrics["harness"]["status"] == "finished"
    assert metrics["calls"] == metrics["harness_reported_calls"] >= 1
    assert metrics["calls_with_token_ids"] == metrics["calls"]
    assert "calls of rollout smoke-0" in out.stdout
    run_dir = metrics_path.parent
    assert {"config.yaml", "manifest.json", "traces.sqlite"} <= {p.name for p in run_dir.iterdir()}
    store = open_store(run_dir / "traces.sqlite")
    (rollout,) = store.list_rollouts(run_dir.name)  # the rollout belongs to this run's row
    assert rollout.harness == "mini-swe-agent" and rollout.status == "finished"
    assert store.conn.execute("SELECT count(*) FROM runs WHERE run_id=?", (run_dir.name,)).fetchone()[0] == 1
    shown = repro_cli("inspect", str(run_dir), cwd=tmp_path)
    assert shown.returncode == 0 and "smoke-0" in shown.stdout and "finished" in shown.stdout
    missing = repro_cli("inspect", str(tmp_path / "nope"), cwd=tmp_path)
    assert missing.returncode != 0 and "no trace store" in missing.stderr


def test_bad_inputs_fail_with_a_message_naming_the_fix(tmp_path: Path) -> None:
    root = Path(__file__).parents[2]
    ev = ["run", "experiment=eval_bundled", f"run.output_root={tmp_path}"]
    cases = [
        (["run", "experiment=nope"], "unknown experiment 'nope'"),
        ([*ev, "tasks=file", f"tasks.source={tmp_path}/missing.jsonl"],
         "does not exist"),
        ([*ev, "job.setup.harness_name=nope"], "known harnesses: claude-code, codex, command, mini-swe-agent"),
    ]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instance_id": "a", "repo": "o/r", "base_commit": "abc", "problem_statement": "x"}\n{oops\n')
    cases.append(([*ev, "tasks=file", f"tasks.source={bad}"], "bad.jsonl:2"))
    for args, fragment in cases:
        out = repro_cli(*args, cwd=root)
        assert out.returncode != 0, args
        assert fragment in out.stderr + out.stdout, (args, out.stderr[-1500:])
        assert "Traceback" not in out.stderr, args
