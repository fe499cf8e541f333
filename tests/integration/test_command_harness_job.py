"""`repro run experiment=eval_bundled harness=command` end to end with the README's example agent
(examples/minimal_agent.py): the real CPU server, the recording proxy, the local sandbox, grading; and an agent that
crashes is an infrastructure failure, not an unresolved task."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repro.store import open_store
from tests.support import repro_cli

ROOT = Path(__file__).parents[2]


@pytest.mark.e2e
def test_the_readme_example_agent_runs_as_a_harness(tmp_path: Path) -> None:
    out = repro_cli("run", "experiment=eval_bundled", "harness=command", "tasks.n_tasks=2",
                    f"run.output_root={tmp_path}", cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    (metrics_path,) = tmp_path.glob("eval_bundled/*/metrics.json")
    metrics = json.loads(metrics_path.read_text())
    assert metrics["complete"] and metrics["n_samples"] == 2 and metrics["infra_failures"] == []
    assert metrics["harness"] == "command@1" and "| command@1" in out.stdout
    store = open_store(metrics_path.parent / "traces.sqlite")
    rollouts = store.list_rollouts(metrics_path.parent.name)
    assert len(rollouts) == 2
    for rollout in rollouts:
        calls = store.calls(rollout.rollout_id)
        assert calls and all(c.endpoint == "chat" and c.prompt_ids and c.completion_ids for c in calls)
        assert calls[0].request["tools"][0]["function"]["name"] == "bash"
        result = json.loads(next(metrics_path.parent.glob(f"harness/{rollout.rollout_id}/command_result.json"))
                            .read_text())
        assert result["status"] == "finished" and result["n_model_calls"] == len(calls)
        assert result["identity"]["label"] == "minimal-agent"


@pytest.mark.e2e
def test_a_crashing_agent_is_an_infrastructure_failure(tmp_path: Path) -> None:
    out = repro_cli("run", "experiment=eval_bundled", "harness=command", "tasks.n_tasks=1",
                    "harness.command=[python3,-c,\"import sys; sys.exit('no luck')\"]", f"run.output_root={tmp_path}",
                    cwd=ROOT)
    assert out.returncode != 0  # every sample an infrastructure failure: the run measured nothing
    assert "1 x harness crashed: exit code 1: no luck" in out.stderr
    (report,) = tmp_path.glob("eval_bundled/*/instances/*/sample-0/report.json")
    assert json.loads(report.read_text())["harness_status"] == "crashed"
