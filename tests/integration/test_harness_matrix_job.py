"""The harness matrix end to end at a small size (marked slow: ~1.5 min on 2 cores): demonstrations through
mini-SWE-agent 2.4.6 and 1.17.5 -> one SFT (from 2.4.6's own warm start, carried into the mixed tokenizer) -> the
warm start evaluated in both -> RL in each harness and in the
rebuilt loop -> every policy evaluated in both harnesses, each under its own frozen spec."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repro.store import open_store
from tests.support import SMALL, repro_cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_every_arm_is_evaluated_in_every_harness(tmp_path: Path) -> None:
    out = repro_cli("run", "experiment=harness_matrix", f"run.output_root={tmp_path}", *SMALL,
                    "warm_start.mix_init=first_harness", "+warm_start.mix_sft.epochs=1",
                    "+warm_start.mix_sft.decay_at_reproduced=0",
                    cwd=Path(__file__).parents[2], timeout=1500)
    assert out.returncode == 0, out.stderr[-3000:]
    (path,) = tmp_path.glob("harness_matrix/*/metrics.json")
    metrics, run_dir = json.loads(path.read_text()), path.parent
    assert metrics["kind"] == "harness_matrix"
    assert metrics["harnesses"] == {"mswea2": "mini-swe-agent@2.4.6", "mswea1": "mini-swe-agent@1.17.5"}
    assert len(set(metrics["fingerprints"].values())) == 2  # one frozen spec per harness
    sources = metrics["warm_start"]["sources"]
    assert [s["harness"] for s in sources] == ["mini-swe-agent@2.4.6", "mini-swe-agent@1.17.5"]
    assert [s["demo_rollouts"] for s in sources] == [12, 12]  # 24 demonstration tasks dealt out in turn
    init = metrics["warm_start"]["init"]  # 2.4.6's own warm start on all 24 tasks, carried by token text
    assert init["key"] != metrics["warm_start"]["key"] and init["carried"]["carried_tokens"] > 0
    assert init["carried"]["new_tokens"] > 0  # 1.17.5's fixed texts: tokens 2.4.6's tokenizer lacks
    assert metrics["warm_start"]["sft"]["epochs"] == 1
    own = open_store(run_dir / "demos_mswea2_own" / "traces.sqlite")  # its demonstrations apart from the mix's share
    assert len([r for r in own.list_rollouts() if r.mode == "demo"]) == 24
    for name in ("mswea2", "mswea1"):
        store = open_store(run_dir / f"demos_{name}" / "traces.sqlite")
        demos = [r for r in store.list_rollouts() if r.mode == "demo"]
        assert len(demos) == 12 and all(r.status == "finished" for r in demos)
    assert {h: m["n_samples"] for h, m in metrics["warm"].items()} == {"mswea2": 8, "mswea1": 8}
    assert set(metrics["arms"]) == {"mswea2", "mswea1", "rebuilt"}
    for arm in metrics["arms"].values():
        assert [h["step"] for h in arm["history"]] == [0, 1]
        assert {h: m["n_samples"] for h, m in arm["after"].items()} == {"mswea2": 8, "mswea1": 8}
        assert {h: m["fingerprint"] for h, m in arm["after"].items()} == metrics["fingerprints"]
    # slipped edits counted in every evaluation, in both harnesses (1.17.5's commands are read from its text)
    for habits in [metrics["warm_habits"], *(arm["habits"] for arm in metrics["arms"].values())]:
        assert {h: c["samples"] for h, c in habits.items()} == {"mswea2": 8, "mswea1": 8}
    assert metrics["arms"]["rebuilt"]["trained_in"] == "mswea2" and metrics["arms"]["rebuilt"]["loop"] == "rebuilt"
    assert set(metrics["fidelity"]) == {"mswea2", "mswea1"}  # each proxy arm's rollouts through the rebuilt loop
    for name, fid in metrics["fidelity"].items():
        assert fid["trained_in"] == name and fid["rollouts"] >= 1 and fid["turns"] >= fid["rollouts"]
    # the proxy-vs-rebuilt slice, a loop_comparison record of its own, read by `repro table`
    loop = json.loads((run_dir / "loop_comparison" / "metrics.json").read_text())
    assert (loop["kind"], loop["table"], set(loop["arms"])) == ("loop_comparison", "loop_comparison",
                                                                 {"proxy", "rebuilt"})
    assert loop["fingerprint"] == metrics["fingerprints"]["mswea2"]
    assert loop["arms"]["rebuilt"]["weights_sha256"] == metrics["arms"]["rebuilt"]["weights_sha256"]
    assert set(loop["fidelity"]) == {"2.4.6", "1.17.5"}
    assert loop["rebuilt_minus_proxy"]["n"] == len(loop["arms"]["proxy"]["per_instance"]) == 4  # paired by task
    assert (run_dir / "loop_comparison" / "overrides.txt").is_file()
