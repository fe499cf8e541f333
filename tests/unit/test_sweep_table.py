"""The harness x task-distribution matrix: newest run per cell, honest warnings, routed by `layout: matrix`;
and the sweep's Hydra config (directories, callback, launchers) composes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_module

from repro.common.configs import CONFIG_MODULE
from repro.report.plots import sweep_heatmap
from repro.report.sweep_table import matrix_frame, newest_cells, sweep_cells_frame, sweep_markdown
from repro.report.tables import write_tables


def cell(harness: str, tasks: str, p: float, started: float, model: str = "policy", infra: int = 0) -> dict[str, Any]:
    return {"kind": "eval", "experiment": "harness_sweep", "table": "harness_sweep", "layout": "matrix",
            "harness": harness, "task_distribution": tasks, "model": model, "n_tasks": 50, "k": 2,
            "pass_at_1": p, "strict_pass_at_1": p, "ci": {"low": p / 2, "high": min(1.0, p * 1.5), "method": "wilson",
                                                          "confidence": 0.95},
            "counts": {"infra_failures": infra}, "cost": {"cpu_h_total": 0.1, "gpu_h_total": 0.0},
            "fingerprint": f"{abs(hash((harness, tasks))):016x}", "spec": {"harness": {"name": harness}},
            "started_at": started, "finished_at": started + 30, "complete": True}


def test_matrix_has_one_cell_per_harness_and_distribution_newest_wins() -> None:
    runs = [cell("mini-swe-agent@2.4.6", "brief", 0.40, 1), cell("mini-swe-agent@2.4.6", "brief", 0.44, 2),
            cell("mini-swe-agent@1.17.5", "brief", 0.02, 3, infra=3), cell("mini-swe-agent@2.4.6", "full", 0.1, 4)]
    cells = newest_cells(runs)
    assert len(cells) == 3 and cells[("mini-swe-agent@2.4.6", "brief")]["pass_at_1"] == 0.44
    frame = matrix_frame(cells)
    assert list(frame.columns) == ["harness", "brief", "full"]
    assert list(frame["harness"]) == ["mini-swe-agent@1.17.5", "mini-swe-agent@2.4.6"]
    assert frame.loc[0, "brief"] == "2.0% [1.0, 3.0%] n=50, 3 infra failures"
    assert frame.loc[0, "full"] == "-"  # never run: not a zero
    assert frame.loc[1, "brief"].startswith("44.0% [22.0, 66.0%]")
    assert "WARNING" not in sweep_markdown("harness_sweep", runs)


def test_each_evaluated_checkpoint_gets_its_own_matrix_newest_first() -> None:
    """Two sweeps of two checkpoints both named ``policy`` on the same cell: neither hides the other, and the one
    evaluated last leads (the checkpoint path, not the folder's name, tells them apart)."""
    old = cell("a@1.0.0", "t", 0.1, 1) | {"run_config": {"eval": {"checkpoint": "outputs/m/1/policy"}}}
    new = cell("a@1.0.0", "t", 0.5, 2) | {"run_config": {"eval": {"checkpoint": "outputs/m/2/policy"}}}
    text = sweep_markdown("s", [old, new])
    assert text.index("## `outputs/m/2/policy`") < text.index("## Earlier models") < text.index(
        "### `outputs/m/1/policy`")
    assert "10.0% [5.0, 15.0%]" in text and "50.0% [25.0, 75.0%]" in text
    assert len(newest_cells([old, new])) == 1  # control: by cell alone the older checkpoint's run is dropped
    frame = sweep_cells_frame([new, old])
    assert list(frame["model"]) == ["outputs/m/1/policy", "outputs/m/2/policy"]  # the newest last: it is drawn
    texts = [t.get_text() for t in sweep_heatmap(frame).axes[0].texts]
    assert "50.0%\nn=50" in texts and "10.0%\nn=50" not in texts


def test_repro_table_lays_out_matrix_runs_as_a_matrix(tmp_path: Path) -> None:
    for i, run in enumerate([cell("a@1.0.0", "t1", 0.5, 1), cell("a@2.0.0", "t2", 0.25, 2)]):
        run_dir = tmp_path / "outputs" / "harness_sweep" / "x" / str(i)
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.json").write_text(json.dumps(run))
        (run_dir / "overrides.txt").write_text(f"experiment=harness_sweep\nharness.version={i + 1}.0.0\n")
    written = write_tables(tmp_path / "outputs", tmp_path / "results")
    assert {p.name for p in written} == {"harness_sweep.md", "harness_sweep.csv", "harness_sweep.svg"}
    md = (tmp_path / "results" / "harness_sweep.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| harness"))
    assert [c.strip() for c in header.strip("|").split("|")][:3] == ["harness", "t1", "t2"]
    assert "50.0% [25.0, 75.0%] n=50" in md and "25.0% [12.5, 37.5%] n=50" in md
    assert "Command: `repro run -m experiment=harness_sweep harness.version=1.0.0,2.0.0`" in md


def _hydra(overrides: list[str]) -> Any:
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        return compose(config_name="config", overrides=overrides, return_hydra_config=True)


def test_sweep_config_names_its_directory_and_callback() -> None:
    cfg = _hydra(["experiment=harness_sweep", "run.output_root=/tmp/o"])
    assert cfg.hydra.callbacks.sweep_table._target_ == "repro.report.sweep.SweepTableCallback"
    assert cfg.eval.layout == "matrix" and cfg.job.setup.harness_name is None


@pytest.mark.parametrize(("launcher", "target", "setting"), [
    ("joblib_local", "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher", ("n_jobs", 2)),
    ("slurm", "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher", ("gpus_per_node", 1)),
])
def test_launcher_configs_compose(launcher: str, target: str, setting: tuple[str, int]) -> None:
    pytest.importorskip(target.rsplit(".", 2)[0])
    cfg = _hydra(["experiment=harness_sweep", f"hydra/launcher={launcher}"])
    assert cfg.hydra.launcher._target_ == target
    assert cfg.hydra.launcher[setting[0]] == setting[1]


def test_published_tables_name_repo_relative_run_dirs(tmp_path: Path, monkeypatch) -> None:
    """A multirun records its job directories absolute; the tables must not publish a machine's paths."""
    monkeypatch.chdir(tmp_path)  # the repository root, as when `repro table` runs
    run_dir = tmp_path / "outputs" / "harness_sweep" / "x" / "0"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.json").write_text(json.dumps({**cell("a@1.0.0", "t1", 0.5, 1), "run_dir": str(run_dir)}))
    (run_dir / "overrides.txt").write_text("experiment=harness_sweep\n")
    write_tables(Path("outputs"), Path("results"))
    published = (tmp_path / "results" / "harness_sweep.md").read_text() + \
        (tmp_path / "results" / "harness_sweep.csv").read_text()
    assert str(tmp_path) not in published and "outputs/harness_sweep/x/0" in published
    assert "Command: `repro run -m experiment=harness_sweep`" in published  # overrides.txt still found


def test_the_sweep_dir_comes_from_the_jobs_not_a_second_reading_of_now(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from repro.report.sweep import SeedsTableCallback

    started = tmp_path / "mini_repro" / "20261201-100000"
    (started / "0").mkdir(parents=True)
    (started / "multirun.yaml").write_text("{}")
    later = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "mini_repro" / "20261201-101500")}}})
    callback = SeedsTableCallback()
    assert callback.sweep_dir(later) == started  # `now` read again names a directory that does not exist
    job = SimpleNamespace(hydra_cfg=OmegaConf.create({"hydra": {"runtime": {"output_dir": str(started / "0")}}}))
    callback.on_job_end(OmegaConf.create({}), job_return=job)
    (tmp_path / "mini_repro" / "20261201-110000").mkdir()
    (tmp_path / "mini_repro" / "20261201-110000" / "multirun.yaml").write_text("{}")  # a newer sweep elsewhere
    assert callback.sweep_dir(later) == started


def test_each_cell_is_broken_down_by_task_family() -> None:
    from repro.report.sweep_table import family_matrix

    prefix = "repro-bundled__procedural-s3-test-"
    swap, flip = f"{prefix}a.b-operator_swap-lc-1", f"{prefix}c.d-comparison_flip-lc-2"
    run = cell("a@1.0.0", "locate", 0.5, 1) | {"per_task": {swap: 0.0, swap + "x": 0.0, flip: 1.0, flip + "x": 1.0}}
    frame = family_matrix(newest_cells([run]))
    rows = {r["family"]: r["locate"] for r in frame.to_dict("records")}
    assert rows["operator_swap"].startswith("0.0%") and rows["comparison_flip"].startswith("100.0%")
    assert rows["comparison_flip"].endswith("n=2")
    assert "### By task family" in sweep_markdown("s", [run])


def test_a_sweep_of_runs_with_a_table_of_their_own_says_they_finished(tmp_path: Path, capsys) -> None:
    from omegaconf import OmegaConf

    from repro.report.sweep import SeedsTableCallback

    sweep = tmp_path / "context_training_tokens" / "20261207-112401"
    (sweep / "0").mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("{}")
    cfg = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}})
    SeedsTableCallback().on_multirun_end(cfg)
    assert "No finished runs (no metrics.json)" in (sweep / "sweep.md").read_text()  # nothing finished yet
    (sweep / "0" / "metrics.json").write_text(json.dumps({"kind": "context_training", "experiment": "ct"}))
    SeedsTableCallback().on_multirun_end(cfg)
    text = (sweep / "sweep.md").read_text()
    assert "No finished runs" not in text
    assert "1 of kind `context_training`" in text and "`repro table` publishes them" in text
    capsys.readouterr()
