"""The miniature's RL phase with ``trainer=verl_cpu`` at the suite's small size: the real mini-SWE-agent through the
proxy and the CPU server, rows from the recorded calls, every update by verl's actor (a worker in verl's
environment), its weights saved into the served policy and reloaded by the server, evaluated before and after."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support import SMALL, repro_cli


def test_the_miniatures_rl_runs_on_verls_actor(tmp_path: Path, verl_python: Path) -> None:
    out = repro_cli("run", "experiment=mini_repro", "trainer=verl_cpu", f"run.output_root={tmp_path}", *SMALL,
                    cwd=Path(__file__).parents[2], timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    (path,) = tmp_path.glob("mini_repro/*/metrics.json")
    metrics = json.loads(path.read_text())
    history = metrics["rl"]["history"]
    assert [h["step"] for h in history] == [0, 1]
    for step in history:
        update = step["update"]
        assert update["engine"] == "verl" and update["rows"] > 0  # verl's worker answered for every step
        if update["updates"]:  # the first update is on policy: verl's log-probs are the server's
            assert update["old_logprob_mismatch"]["max"] < 1e-3
    assert metrics["trainer"]["strategy"] == "fsdp2"
    checks = [h["reload_check"] for h in history if h.get("reload_check")]
    assert all(c["passed"] for c in checks)  # the server serves what verl saved: its probe scored by verl's actor
    assert metrics["after"]["n_samples"] == metrics["before"]["n_samples"] > 0
