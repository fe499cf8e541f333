"""`repro table` builds results/ only from metrics.json files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repro.experiments.bench.proxy_overhead import ProxyBenchConfig, summarise
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


def test_summary_keeps_each_api_apart_in_route_order() -> None:
    rows = []
    for api, cpu in (("responses", 0.9), ("chat", 0.3), ("messages", 0.6)):
        rows += [{**_row("direct", False, 4, 0, 100.0, None), "api": api},
                 {**_row("proxy", False, 4, 0, 50.0, cpu), "api": api}]
    lines = summarise(rows)
    assert [(line["api"], line["proxy_cpu_ms_per_call"]) for line in lines] == [
        ("chat", 0.3), ("messages", 0.6), ("responses", 0.9)]
    old = [_row("proxy", False, 4, 0, 50.0, 0.5), _row("direct", False, 4, 0, 9.0, None)]  # before the api field
    assert summarise(old)[0]["api"] == "chat"


def test_table_is_built_from_the_newest_metrics(tmp_path: Path) -> None:
    from dataclasses import asdict

    for i, ratio_rps in enumerate([10.0, 40.0]):
        rows = [_row("direct", True, 64, 0, 100.0, None), _row("proxy", True, 64, 0, ratio_rps, 0.9)]
        run = tmp_path / "outputs" / "bench_proxy" / f"run{i}"
        run.mkdir(parents=True)
        metrics = {"kind": "proxy_overhead", "started_at": i, "config": asdict(ProxyBenchConfig()), "rows": rows,
                   "summary": summarise(rows)}
        (run / "metrics.json").write_text(json.dumps(metrics))
        (run / "config.yaml").write_text("job:\n  repeats: 99\n")  # a run's config file never hides its metrics
    written = write_tables(tmp_path / "outputs", tmp_path / "results")
    md = (tmp_path / "results" / "proxy_overhead.md").read_text()
    assert {p.name for p in written} == {"proxy_overhead.md", "proxy_overhead.csv"}
    assert "0.400" in md and "0.100" not in md  # the newest run (ratio 0.4) is the one published
    assert "streaming" in md and "run1" in md


def test_no_metrics_means_no_tables(tmp_path: Path) -> None:
    assert write_tables(tmp_path, tmp_path / "results") == []


# eval tables ------------------------------------------------------------------------------------------------


def _eval_run(outputs: Path, name: str, experiment: str, started: float, *, temperature: float = 0.0,
              resolved: int = 3, table: str | None = None, k: int = 1, complete: bool = True) -> dict:
    from repro.evaluation import (
        Cost,
        EvalSpec,
        HarnessSpec,
        InstanceReport,
        SamplingSpec,
        TaskSetSpec,
        eval_metrics,
        write_metrics,
    )

    ids = [f"t{i}" for i in range(5)]
    spec = EvalSpec(HarnessSpec("mini-swe-agent", "2.4.6", {"swebench.yaml": "ab"}), TaskSetSpec("bundled", ids, "ff"),
                    SamplingSpec(temperature=temperature), k=k)
    outcomes = ["resolved"] * resolved + ["unresolved"] * (4 - resolved) + ["error"]
    reports = [InstanceReport(i, s, f"{name}-{i}-{s}", o, harness_status="finished")
               for i, o in zip(ids, outcomes, strict=True) for s in range(k)]
    if not complete:
        reports = reports[:-1]
    metrics = eval_metrics(reports, spec, experiment, "tiny@1", table=table, cost=Cost({"rollouts": 0.5}),
                           started_at=started)
    run = outputs / experiment / name
    write_metrics(run, metrics)
    return metrics


def test_eval_table_has_one_row_per_experiment_and_fingerprint(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    _eval_run(outputs, "old", "eval_tiny", 1.0, resolved=1)
    newest = _eval_run(outputs, "new", "eval_tiny", 2.0, resolved=3)
    written = write_tables(outputs, tmp_path / "results")
    assert {p.name for p in written} == {"eval_tiny.md", "eval_tiny.csv", "eval_tiny.svg"}
    md = (tmp_path / "results" / "eval_tiny.md").read_text()
    assert "WARNING" not in md
    assert "75.0%" in md and "25.0%" not in md  # newest run of the (experiment, fingerprint) pair wins
    assert newest["fingerprint"][:8] in md and "mini-swe-agent@2.4.6" in md and "bundled" in md
    assert "60.0%" in md  # strict Pass@1: 3 of 5 with the infrastructure failure counted
    import pandas as pd

    frame = pd.read_csv(tmp_path / "results" / "eval_tiny.csv")
    assert len(frame) == 1 and frame.loc[0, "runs"] == 2 and frame.loc[0, "pass_at_1"] == 0.75
    assert frame.loc[0, "infra_failures"] == 1 and frame.loc[0, "cpu_h"] == 0.5
    assert frame.loc[0, "fingerprint"] == newest["fingerprint"] and pd.isna(frame.loc[0, "warning"])


def test_mixed_fingerprints_are_never_silently_one_comparison(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    a = _eval_run(outputs, "a", "baseline", 1.0, table="ablation")
    b = _eval_run(outputs, "b", "trained", 2.0, table="ablation", temperature=1.0)
    c = _eval_run(outputs, "c", "trained", 3.0, table="ablation")
    write_tables(outputs, tmp_path / "results")
    md = (tmp_path / "results" / "ablation.md").read_text()
    warning = next(line for line in md.splitlines() if "NOT ONE COMPARISON" in line)
    assert warning.startswith("> WARNING")
    assert "sampling.temperature" in warning and b["fingerprint"][:8] in warning and a["fingerprint"][:8] in warning
    assert "Experiment `trained` was run under 2 different specs" in md
    assert md.index("NOT ONE COMPARISON") < md.index("| experiment")  # above the rows, not a footnote
    assert a["fingerprint"] == c["fingerprint"] != b["fingerprint"]
    import pandas as pd

    frame = pd.read_csv(tmp_path / "results" / "ablation.csv")
    assert len(frame) == 3 and frame["warning"].str.contains("NOT ONE COMPARISON").all()


def test_eval_table_flags_incomplete_runs_and_tampered_fingerprints(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    _eval_run(outputs, "a", "partial", 1.0, complete=False)
    path = outputs / "partial" / "a" / "metrics.json"
    metrics = json.loads(path.read_text())
    metrics["spec"]["k"] = 2
    path.write_text(json.dumps(metrics))
    write_tables(outputs, tmp_path / "results")
    md = (tmp_path / "results" / "partial.md").read_text()
    assert "(incomplete)" in md and "is incomplete: 1 samples have no result" in md
    assert "does not match its recorded spec" in md


def test_pass_at_k_column_and_proxy_tables_coexist(tmp_path: Path) -> None:
    from dataclasses import asdict

    outputs = tmp_path / "outputs"
    _eval_run(outputs, "k", "eval_k4", 1.0, k=4)
    rows = [_row("direct", False, 4, 0, 100.0, None), _row("proxy", False, 4, 0, 50.0, 0.5)]
    bench = outputs / "bench_proxy" / "r"
    bench.mkdir(parents=True)
    (bench / "metrics.json").write_text(json.dumps({"kind": "proxy_overhead", "started_at": 0, "rows": rows,
                                                    "config": asdict(ProxyBenchConfig()), "summary": summarise(rows)}))
    written = {p.name for p in write_tables(outputs, tmp_path / "results")}
    assert written == {"eval_k4.md", "eval_k4.csv", "eval_k4.svg", "proxy_overhead.md", "proxy_overhead.csv"}
    assert "@2 75.0%, @4 75.0%" in (tmp_path / "results" / "eval_k4.md").read_text()
