"""`repro report` and the plots of `repro table`: deterministic SVGs, failed/solved pairing, the fingerprint refusal.
(The whole report of real runs in a real browser: tests/integration/test_report_browser.py.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from repro.evaluation import EvalSpec, HarnessSpec, InstanceReport, SamplingSpec, TaskSetSpec, eval_metrics
from repro.evaluation import write_metrics as write_eval_metrics
from repro.report import plots
from repro.report.html_report import build_report, refusal
from repro.report.run_data import FAILED, INFRA, SOLVED, UNGRADED, Run, Sample
from repro.report.table_plots import replot
from repro.report.tables import write_tables
from repro.report.trajectories import TaskSamples, by_task

IDS = [f"t{i}" for i in range(4)]
DIAGNOSTICS = [{"step": s, "reward_mean": 0.1 * s, "mixed_group_share": 0.5, "clip_fraction": 0.01 * s,
                "entropy": 1.0 - 0.1 * s, "calls_per_rollout": 1.5, "calls_histogram": {"1": 2, "3": 2},
                "log_ratio_first_max": 2e-6, "log_ratio_max": 0.1} for s in range(3)]


def _eval_metrics(name: str, solved: int, temperature: float = 0.0, layout: str = "rows",
                  harness: str = "2.4.6") -> dict:
    spec = EvalSpec(HarnessSpec("mini-swe-agent", harness, {}), TaskSetSpec("bundled", IDS, "ff"),
                    SamplingSpec(temperature=temperature), k=2)
    reports = [InstanceReport(i, s, f"{name}-{i}-{s}", "resolved" if n < solved else "unresolved",
                              harness_status="finished", n_calls=1 + n) for n, i in enumerate(IDS) for s in range(2)]
    metrics = eval_metrics(reports, spec, "eval_tiny", "tiny@1", started_at=float(len(name)))
    metrics["layout"] = layout
    return metrics


def _write_run(folder: Path, metrics: dict) -> Path:
    write_eval_metrics(folder, metrics)
    return folder


def test_plots_are_byte_identical_for_the_same_inputs_and_differ_for_others() -> None:
    frame = pd.DataFrame(DIAGNOSTICS)
    figures = {
        "rl": lambda f: plots.rl_diagnostics(f),
        "before_after": lambda f: plots.before_after_outcomes({"a": 0.0, "b": 0.5},
                                                              {"a": f["entropy"].iloc[0], "b": f["entropy"].iloc[1]}),
        "pass_at_k": lambda f: plots.pass_at_k({"run": {"1": f["reward_mean"].iloc[1], "2": 0.3}}),
        "calls": lambda f: plots.calls_histogram({"run": {"1": int(10 * f["entropy"].iloc[1]), "3": 2}}),
        "bars": lambda f: plots.pass_at_1_bars(pd.DataFrame([{"experiment": "x", "pass_at_1": f["entropy"].iloc[1],
                                                              "ci_low": 0.1, "ci_high": 0.95}])),
        "heatmap": lambda f: plots.sweep_heatmap(pd.DataFrame([{"harness": "h", "tasks": "t", "n_tasks": 4,
                                                                "pass_at_1": f["entropy"].iloc[1]}])),
    }
    changed = frame.assign(entropy=frame["entropy"] / 2, reward_mean=frame["reward_mean"] + 0.05)
    for name, make in figures.items():
        first, second = plots.svg_bytes(make(frame)), plots.svg_bytes(make(frame))
        assert first == second, name
        assert b"<dc:date>" not in first and first.startswith(b"<?xml"), name
        assert plots.svg_bytes(make(changed)) != first, name


def _table_outputs(outputs: Path) -> None:
    """Run dirs of an eval table, a two-cell sweep and a before/after run with RL diagnostics."""
    _write_run(outputs / "eval_tiny" / "a", _eval_metrics("a", 2))
    for job, harness in enumerate(("2.4.6", "1.17.0")):
        sweep = _eval_metrics(f"s{job}", job + 1, harness=harness, layout="matrix")
        _write_run(outputs / "sweep" / "t" / str(job), {**sweep, "table": "harness_sweep"})
    before_after = {"kind": "before_after", "experiment": "mini_repro", "table": "mini_repro", "fingerprint": "ab" * 8,
                    "task_distribution": "bundled:test", "train_tasks": "bundled:train",
                    "before": {"pass_at_1": 0.2, "ci": {"low": 0.1, "high": 0.3}},
                    "after": {"pass_at_1": 0.4, "ci": {"low": 0.3, "high": 0.5}},
                    "paired": {"n": 4, "delta": 0.2, "delta_low": 0.0, "delta_high": 0.4, "mcnemar_p": 0.5},
                    "samples": {"mode": "prefix_merge", "weighting": "rollout"},
                    "rl": {"config": {"seed": 0, "steps": 3, "tasks_per_step": 2, "samples_per_task": 2}},
                    "trainer": {"learning_rate": 1e-4}, "warm_start": {"key": "k" * 16, "demo_rollouts": 8},
                    "diagnostics": DIAGNOSTICS, "started_at": 5.0}
    (outputs / "mini_repro" / "b").mkdir(parents=True)
    (outputs / "mini_repro" / "b" / "metrics.json").write_text(json.dumps(before_after))


def test_repro_table_links_its_plots_and_regenerating_changes_no_byte(tmp_path: Path) -> None:
    outputs, results = tmp_path / "outputs", tmp_path / "results"
    _table_outputs(outputs)
    written = write_tables(outputs, results)
    svgs = {p.name for p in written if p.suffix == ".svg"}
    assert svgs == {"eval_tiny.svg", "harness_sweep.svg", "mini_repro_diagnostics.svg"}
    assert "](eval_tiny.svg)" in (results / "eval_tiny.md").read_text()
    assert "](harness_sweep.svg)" in (results / "harness_sweep.md").read_text()
    assert "](mini_repro_diagnostics.svg)" in (results / "mini_repro.md").read_text()
    assert "](mini_repro_diagnostics.svg)" in (results / "mini_repro_diagnostics.md").read_text()
    first = {p.name: p.read_bytes() for p in results.iterdir() if p.is_file()}  # the tables (runs/: records)
    assert write_tables(outputs, results) == written
    assert {p.name: p.read_bytes() for p in results.iterdir() if p.is_file()} == first


def _sample(run: str, phase: str, outcome: str, sample: int = 0, mode: str = "eval", instance: str = "t0") -> Sample:
    report = InstanceReport(instance, sample, f"{run}-{phase}-{instance}-{sample}", outcome, harness_status="finished")
    return Sample(run, phase, report, None, Path("."), mode)


def test_samples_are_solved_failed_infra_or_ungraded() -> None:
    assert _sample("r", ".", "resolved").category == SOLVED
    assert _sample("r", ".", "unresolved").category == FAILED
    assert _sample("r", ".", "error").category == INFRA
    assert _sample("r", "demos", "unresolved", mode="demo").category == UNGRADED  # recorded, never graded


def test_a_task_pairs_a_failed_and_a_solved_rollout_of_one_run_and_phase_when_it_can() -> None:
    other_run_fail = _sample("a", ".", "unresolved")
    solved = _sample("b", "eval_after", "resolved")
    same_phase_fail = _sample("b", "eval_after", "unresolved", sample=1)
    task = TaskSamples("t0", [other_run_fail, solved, same_phase_fail, _sample("b", "demos", "unresolved",
                                                                                mode="demo")])
    assert task.pair() == (same_phase_fail, solved) and task.note() is None
    assert task.counts() == {SOLVED: 1, FAILED: 2, INFRA: 0, UNGRADED: 1}
    only_failed = TaskSamples("t1", [_sample("a", ".", "unresolved", instance="t1")])
    assert only_failed.pair()[1] is None and "no solved rollout" in only_failed.note()
    only_solved = TaskSamples("t2", [_sample("a", ".", "resolved", instance="t2")])
    assert only_solved.pair()[0] is None and "no failed rollout" in only_solved.note()
    demos = TaskSamples("t3", [_sample("a", "demos", "unresolved", mode="demo", instance="t3")])
    assert demos.pair() == (None, None) and "no graded rollout" in demos.note()
    samples = [*only_failed.samples, *task.samples, *only_solved.samples]
    assert [t.instance_id for t in by_task(samples)] == ["t0", "t2", "t1"]  # paired first, then ones with a solve


def test_runs_whose_fingerprints_differ_are_not_compared(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a = _write_run(tmp_path / "eval_tiny" / "a", _eval_metrics("a", 1))
    b = _write_run(tmp_path / "eval_tiny" / "b", _eval_metrics("b", 3, temperature=1.0))
    report = build_report([a, b], tmp_path / "report")
    assert report.refused and "fingerprints differ" in report.refused and "sampling.temperature" in report.refused
    page = report.index.read_text()
    assert 'id="refused"' in page and "sampling.temperature" in page and "Comparison" not in page
    assert "repro report: refusing to compare" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the command fails after writing the page
        from repro.cli.commands import main

        main(["report", str(a), str(b), "--out", str(tmp_path / "cli")])
    assert (tmp_path / "cli" / "index.html").exists()


def test_runs_of_one_fingerprint_are_compared_paired_over_instances(tmp_path: Path) -> None:
    a = _write_run(tmp_path / "eval_tiny" / "a", _eval_metrics("a", 1))
    b = _write_run(tmp_path / "eval_tiny" / "b", _eval_metrics("bb", 3))
    report = build_report([a, b], tmp_path / "report")
    assert report.refused is None
    page = report.index.read_text()
    assert "Comparison" in page and "eval_tiny/b - eval_tiny/a" in page and "+50.0 [" in page  # 3 of 4 vs 1 of 4
    assert 'src="plots/pass_at_k.svg"' in page and (tmp_path / "report" / "plots" / "before_after.svg").exists()
    assert "no graded samples" in page  # no instances/ folders in these runs


def test_a_sweep_directory_is_its_cells_and_not_a_refused_comparison(tmp_path: Path) -> None:
    for job, harness in enumerate(("2.4.6", "1.17.0")):
        _write_run(tmp_path / "sweep" / str(job), _eval_metrics(f"s{job}", job, harness=harness, layout="matrix"))
    assert refusal([[Run(tmp_path, "x", {"fingerprint": "a"}), Run(tmp_path, "y", {"fingerprint": "b"})]]) is None
    report = build_report([tmp_path / "sweep"], tmp_path / "report")
    assert report.refused is None and (tmp_path / "report" / "plots" / "sweep_matrix.svg").exists()


def test_replot_redraws_the_plots_from_the_csvs_alone_as_repro_table_draws_them(tmp_path: Path) -> None:
    outputs, results = tmp_path / "outputs", tmp_path / "results"
    _table_outputs(outputs)
    write_tables(outputs, results)
    published = {p.name: p.read_bytes() for p in results.iterdir() if p.is_file()}
    shutil.rmtree(outputs)  # the runs are gone; results/ holds the CSVs and Markdown
    for svg in results.glob("*.svg"):
        svg.unlink()
    replot(results)
    assert {p.name: p.read_bytes() for p in results.iterdir() if p.is_file()} == published  # same bytes, links there

    # a table published before plots existed: its links are added, in the places repro table puts them
    for name in ("eval_tiny.md", "mini_repro.md", "mini_repro_diagnostics.md"):
        md = results / name
        md.write_text("\n".join(line for line in md.read_text().split("\n") if ".svg)" not in line))
    replot(results)
    diagnostics = (results / "mini_repro_diagnostics.md").read_text()
    assert diagnostics.index("](mini_repro_diagnostics.svg)") < diagnostics.index("| run")
    assert (results / "eval_tiny.md").read_text().rstrip().endswith("](eval_tiny.svg)")
    assert "](mini_repro_diagnostics.svg) (every step in" in (results / "mini_repro.md").read_text()
    again = {p.name: p.read_bytes() for p in results.iterdir() if p.is_file()}
    replot(results)
    assert {p.name: p.read_bytes() for p in results.iterdir() if p.is_file()} == again  # idempotent


def test_the_report_of_a_before_after_run_shows_what_changed_by_family(tmp_path: Path) -> None:
    ids = [f"repro-bundled__procedural-s0-test-f{i}.g-{op}-lc-{i:08x}"
           for i, op in enumerate(["off_by_one"] * 4 + ["operator_swap"] * 6)]
    run = {"kind": "before_after", "experiment": "mini_repro", "table": "mini_repro", "fingerprint": "ab" * 8,
           "task_distribution": "bundled:test", "train_tasks": "bundled:train", "run_dir": "x",
           "before": {"pass_at_1": 0.0, "ci": {"low": 0.0, "high": 0.3}},
           "after": {"pass_at_1": 0.4, "ci": {"low": 0.1, "high": 0.7}},
           "paired": {"n": 10, "delta": 0.4, "delta_low": 0.1, "delta_high": 0.7, "mcnemar_p": 0.1},
           "samples": {"mode": "prefix_merge", "weighting": "rollout"},
           "rl": {"config": {"seed": 0, "steps": 3, "tasks_per_step": 2, "samples_per_task": 2}},
           "trainer": {"learning_rate": 1e-4}, "warm_start": {"key": "k" * 16, "demo_rollouts": 8},
           "per_instance": {"before": dict.fromkeys(ids, 0.0),
                            "after": {i: float("off_by_one" in i) for i in ids}},
           "habits": {"before": {"by_operator": {"off_by_one": [4, 4], "operator_swap": [0, 6]}, "share": 0.4},
                      "after": {"by_operator": {"off_by_one": [0, 4], "operator_swap": [0, 6]}, "share": 0.0}}}
    (tmp_path / "mini_repro" / "b").mkdir(parents=True)
    (tmp_path / "mini_repro" / "b" / "metrics.json").write_text(json.dumps(run))
    page = build_report([tmp_path / "mini_repro" / "b"], tmp_path / "report").index.read_text()
    assert "What changed, by task family" in page
    assert "off_by_one" in page and "+100.0 [" in page and "100.0% -&gt; 0.0%" in page  # the slip, gone
    assert "identical on every instance" in page  # operator_swap did not move
