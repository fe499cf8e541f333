"""RL on rollouts that OpenHands' condenser branches, end to end at a small size (marked slow): the mixed warm start
of mini-SWE-agent 2.4.6 and OpenHands -> the probe on RL tasks in the overridden harness (condensing by its token
count) -> the warm start evaluated -> each arm (rollout / fragment weighting, the condenser off in training) RL'd
and evaluated with the condenser on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness_adapters.openhands import ensure_openhands_env
from repro.common.venvs import HarnessEnvError
from repro.store import open_store
from tests.support import SMALL, repro_cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_every_arm_trains_and_is_evaluated_at_the_probed_window(tmp_path: Path) -> None:
    try:
        ensure_openhands_env("1.58.2")
    except HarnessEnvError as exc:
        pytest.skip(f"OpenHands env unavailable: {exc}")
    out = repro_cli("run", "experiment=context_training_tokens", f"run.output_root={tmp_path}", *SMALL,
                    "warm_start.mix_sft.epochs=1", "context.rl_seeds=[0]", "context.probe_tasks=4",
                    "context.arms=[{name: rollout}, {name: fragment, weighting: fragment}, "
                    "{name: no_condenser, condenser: none}]",
                    cwd=Path(__file__).parents[2], timeout=1500)
    assert out.returncode == 0, out.stderr[-3000:]
    (path,) = tmp_path.glob("context_training/*/metrics.json")
    metrics, run_dir = json.loads(path.read_text()), path.parent
    assert metrics["kind"] == "context_training" and metrics["harness"] == "openhands@1.58.2"
    w = metrics["window"]
    assert (w["probe_rollouts"], w["rule"], w["window"]) == (4, "room", None)  # the model's own context
    assert metrics["context"]["overrides"]["condenser_max_tokens"] == 7100
    probe = open_store(run_dir / "window_probe" / "traces.sqlite")
    assert len(probe.list_rollouts()) == 4  # RL tasks, apart from every held-out evaluation
    assert metrics["warm"]["n_samples"] == 8
    assert [(a["arm"], a["seed"]) for a in metrics["arms"]] == [("rollout", 0), ("fragment", 0), ("no_condenser", 0)]
    assert [a["weighting"] for a in metrics["arms"]] == ["rollout", "fragment", "rollout"]
    for arm in metrics["arms"]:
        assert [h["step"] for h in arm["history"]] == [0, 1]
        assert arm["after"]["n_samples"] == 8 and arm["after"]["fingerprint"] == metrics["fingerprint"]
        assert arm["training"]["rollouts"] == 2 * 2 * 3 and arm["training"]["rows_mean"] >= 1
        assert set(arm["paired_vs_warm"]) >= {"delta", "mde"}
    assert metrics["skipped_for_budget"] == []
