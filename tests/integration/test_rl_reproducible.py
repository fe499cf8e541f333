"""Bit-reproducible RL on one machine (issue 53): two runs of the same command train the same weights
(``repro run experiment=mini_repro rl.steps=2 tasks.n_tasks=10``). What the agent sees of the sandbox does not depend
on the run: jailed (the default), its working copy is at ``/testbed`` whatever the workspace folder's random name.
Each call's sampling seed comes from the run's seed, the task, the sample and the call's place in its rollout, never
from arrival order. The update's ratio is against the trainer's own logprobs (``trainer.old_logprobs=recompute``):
the server's recorded ones differ in their last bits with what else it batched (measured: identical tokens, rewards
and prompts in two runs, logprobs apart by up to 9e-5), which made the weights differ. SFT is deterministic on the
CPU, so the second run's warm start, from the cache, is the first's.

Slow (two runs after the miniature's default warm start, which the first run builds when the cache lacks it, ~10
min; cached, ~3 min a run): a smaller warm start solves nothing, so RL would not update and the test would prove
nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repro.execution.jail import jail_available
from tests.integration.test_red_team import REQUIRED
from tests.support import repro_cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_two_runs_of_the_same_command_train_the_same_weights(tmp_path: Path) -> None:
    if jail_available() is not None:  # unjailed, the agent reads the workspace's random folder name in tracebacks
        (pytest.fail if REQUIRED else pytest.skip)(f"no jail here: {jail_available()}")
    runs = []
    for name in ("first", "second"):
        out = repro_cli("run", "experiment=mini_repro", "rl.steps=2", "tasks.n_tasks=10",
                        f"run.output_root={tmp_path / name}", timeout=3600)
        assert out.returncode == 0, out.stderr[-3000:]
        (metrics,) = (json.loads(p.read_text()) for p in (tmp_path / name).glob("mini_repro/*/metrics.json"))
        runs.append(metrics)
    first, second = runs
    assert first["weights_sha256"]["before"] == second["weights_sha256"]["before"]
    assert any(h["update"]["updates"] for h in first["rl"]["history"])  # RL changed the weights: a real comparison
    assert first["weights_sha256"]["after"] != first["weights_sha256"]["before"]
    assert first["weights_sha256"]["after"] == second["weights_sha256"]["after"], (first["weights_sha256"],
                                                                                   second["weights_sha256"])
    assert first["per_instance"] == second["per_instance"]
    print("trained weights", first["weights_sha256"]["after"])
