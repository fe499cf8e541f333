"""``experiment=bench_harnesses`` at its smallest: the real mini-SWE-agent 2.4.6 pool, the expert server, proxy and
grader, one warm-up and two measured rollouts; the record has what the table needs and the table renders it."""

from __future__ import annotations

import json
from pathlib import Path

from repro.experiments.bench.harnesses import HarnessBenchConfig, bench_harnesses_job
from repro.report.harness_bench_table import harness_bench_frame, write_harness_bench_tables


def test_bench_measures_each_arm_and_publishes(tmp_path: Path) -> None:
    arms = [{"label": "mini-SWE-agent 2.4.6, worker pool", "harness": "mini-swe-agent", "config": {}},
            {"label": "mini-SWE-agent 2.4.6, unjailed", "harness": "mini-swe-agent", "config": {"isolation": "none"}}]
    metrics = bench_harnesses_job(HarnessBenchConfig(arms=arms, rollouts=2, warmup=1), tmp_path / "run")
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["kind"] == "harness_bench"
    for arm in metrics["arms"]:
        assert (arm["rollouts"], arm["resolved"], arm["finished"]) == (2, 2, 2), arm  # the expert did the work
        assert arm["calls_per_rollout"] == 3  # look up, edit, check and submit
        assert arm["cpu_s"] >= arm["harness_side_cpu_s"] > 0 and arm["server_cpu_s"] >= 0 and arm["wall_s"] > 0
    assert [a["isolation"] for a in metrics["arms"]] == ["jail", "none"] or metrics["arms"][0]["isolation"] == "none"
    frame = harness_bench_frame(metrics)
    assert list(frame["harness and launcher"]) == [a["label"] for a in arms] and frame["x_reference"][0] == 1.0
    (tmp_path / "results").mkdir()
    md, csv = write_harness_bench_tables([metrics], tmp_path / "results")
    assert "mini-SWE-agent 2.4.6, unjailed" in md.read_text() and csv.read_text().count("\n") == 3
