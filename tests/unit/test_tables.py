"""`repro table` builds results/ only from metrics.json files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repro.bench.proxy_overhead import ProxyBenchConfig, summarise
from repro.report.tables import write_tables


def _row(target: str, stream: bool, conc: int, rep: int, rps: float, cpu: float | None) -> dict:
    return {"target": target, "stream": stream, "concurrency": conc, "repeat": rep, "calls": 10, "errors": 0,
            "wall_s": 10 / rps, "throughput": rps, "p50_ms": 1.0 if target == "direct" else 1.5, "p99_ms": 3.0,
            "proxy_cpu_ms_per_call": cpu}


def test_summary_takes_medians_and_ratios() -> None:
    rows = [_row("direct", False, 4, r, 100.0 + r, None) for r in range(3)]
    rows += [_row("proxy", False, 4, r, 50.0 + r, 0.5 + r) for r in range(3)]
    (line,) = summarise(rows)
    assert line["direct_rps"] == 101.0 and line["proxy_rps"] == 51.0
    assert line["throughput_ratio"] == pytest.approx(51 / 101)
    assert line["proxy_cpu_ms_per_call"] == 1.5 and line["added_p50_ms"] == pytest.approx(0.5)


def test_table_is_built_from_the_newest_metrics(tmp_path: Path) -> None:
    from dataclasses import asdict

    for i, ratio_rps in enumerate([10.0, 40.0]):
        rows = [_row("direct", True, 64, 0, 100.0, None), _row("proxy", True, 64, 0, ratio_rps, 0.9)]
        run = tmp_path / "outputs" / "bench_proxy" / f"run{i}"
        run.mkdir(parents=True)
        metrics = {"kind": "proxy_overhead", "started_at": i, "config": asdict(ProxyBenchConfig()), "rows": rows,
                   "summary": summarise(rows)}
        (run / "metrics.json").write_text(json.dumps(metrics))
    written = write_tables(tmp_path / "outputs", tmp_path / "results")
    md = (tmp_path / "results" / "proxy_overhead.md").read_text()
    assert {p.name for p in written} == {"proxy_overhead.md", "proxy_overhead.csv"}
    assert "0.400" in md and "0.100" not in md  # the newest run (ratio 0.4) is the one published
    assert "streaming" in md and "run1" in md


def test_no_metrics_means_no_tables(tmp_path: Path) -> None:
    assert write_tables(tmp_path, tmp_path / "results") == []
