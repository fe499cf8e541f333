"""Benchmark jobs callable from `repro run experiment=bench_*`."""

from __future__ import annotations

import json
from pathlib import Path

from repro.experiments.bench.proxy_overhead import ProxyBenchConfig, run_proxy_benchmark
from repro.report.tables import proxy_overhead_markdown


def bench_proxy_job(bench: ProxyBenchConfig, run_dir: Path) -> dict:
    """Run the proxy benchmark, write ``metrics.json`` and print the table."""
    run_dir = Path(run_dir)
    metrics = run_proxy_benchmark(bench, run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    metrics.update(run_dir=str(run_dir), git_sha=manifest["git_sha"], cpu_count=manifest["cpu_count"])
    (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    print(proxy_overhead_markdown([metrics]))
    return metrics
