"""experiment=loop_comparison end to end at a small size: one warm start, RL rollouts by the real harness and by
the rebuilt loop (tagged in the store), both evaluated in the real harness, fidelity replays of 2.4.6 and 1.17.5
recordings, and the published table."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from repro.common.files import weights_sha256
from repro.report.rollout_index import index_run
from repro.store import open_store
from tests.support import SMALL, repro_cli

pytestmark = pytest.mark.e2e

FIDELITY = ["fidelity.max_rollouts=6", "fidelity.other_tasks=2"]
TENSORBOARD = importlib.util.find_spec("tensorboard") is not None  # the dev extra installs it


def _scalars(folder: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def test_loop_comparison_runs_both_arms_and_the_fidelity_replays(tmp_path: Path) -> None:
    root = Path(__file__).parents[2]
    tracking = ["tracking=tensorboard"] if TENSORBOARD else []
    out = repro_cli("run", "experiment=loop_comparison", f"run.output_root={tmp_path}", *SMALL, *FIDELITY, *tracking,
                 cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    (metrics_path,) = tmp_path.glob("loop_comparison/*/metrics.json")
    metrics, run_dir = json.loads(metrics_path.read_text()), metrics_path.parent
    assert metrics["kind"] == "loop_comparison" and set(metrics["arms"]) == {"proxy", "rebuilt"}
    for kind, arm in metrics["arms"].items():
        assert arm["after"]["fingerprint"] == metrics["before"]["fingerprint"] == metrics["fingerprint"]
        assert arm["after"]["harness"] == "mini-swe-agent@2.4.6", kind  # both evaluated in the real harness
        assert [h["step"] for h in arm["history"]] == [0, 1]
        assert arm["weights_sha256"] == weights_sha256(run_dir / kind / "policy")
        assert [d["step"] for d in arm["diagnostics"]] == [0, 1]
        assert all(d["log_ratio_first_max"] < 1e-3 for d in arm["diagnostics"])
        lines = (run_dir / kind / "rl" / "diagnostics.jsonl").read_text().splitlines()
        assert [json.loads(line) for line in lines] == arm["diagnostics"]  # the per-step JSONL of each arm
        if TENSORBOARD:  # the same steps in the arm's tracker run, under the run's tracking folder
            got = _scalars(run_dir / "tracking" / "tensorboard" / f"rl-{kind}-{run_dir.name}", "reward_mean")
            assert [step for step, _ in got] == [0, 1]
            assert [round(v, 5) for _, v in got] == [round(d["reward_mean"], 5) for d in arm["diagnostics"]]
        store = open_store(run_dir / kind / "traces.sqlite")
        train = [r for r in store.list_rollouts() if r.mode == "train"]
        evals = [r for r in store.list_rollouts() if r.mode == "eval"]
        assert len(train) == 2 * 2 * 3 and {r.loop_kind for r in train} == {kind}
        assert {r.loop_kind for r in evals} == {"proxy"}
        endpoints = {c.endpoint for r in train for c in store.calls(r.rollout_id)}
        assert endpoints == ({"chat"} if kind == "proxy" else {"completions"})
        store.close()
    assert metrics["rebuilt_minus_proxy"]["n"] == 4 and metrics["rebuilt_minus_proxy"]["mde"] >= 0
    assert metrics["weights_sha256_before"] == weights_sha256(Path(metrics["warm_start"]["path"]))
    same, other = metrics["fidelity"]["2.4.6"], metrics["fidelity"]["1.17.5"]
    assert same["rollouts"] >= 1 and same["turns"] >= same["rollouts"]
    assert other["rollouts"] == 2 and other["first_divergent_turns"] == [0]  # text mode, no tools: differs at once
    if TENSORBOARD:  # the warm start's SFT through trl's report_to
        assert _scalars(run_dir / "tracking" / "tensorboard" / f"sft-{run_dir.name}", "train/train_loss")
    phases = {(e.phase, e.mode) for e in index_run(run_dir)}  # what `repro inspect RUN` summarises
    assert {("demos", "demo"), ("eval_before", "eval"), ("proxy/rl", "train"), ("rebuilt/rl", "train"),
            ("proxy/eval_after", "eval"), ("rebuilt/eval_after", "eval")} <= phases
    table = repro_cli("table", "--outputs", str(tmp_path), "--results", str(tmp_path / "results"), cwd=tmp_path)
    assert table.returncode == 0, table.stderr[-2000:]
    text = (tmp_path / "results" / "loop_comparison.md").read_text()
    assert "rebuilt - proxy" in text and "1.17.5" in text and metrics["fingerprint"][:8] in text
