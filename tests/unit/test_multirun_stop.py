"""A sweep job that fails is recorded and the sweep goes on; a job stopped by SIGTERM / SIGINT (the handlers exit
128 + signal) stops the whole sweep instead of starting the next seed."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from repro.cli import multirun


def _job(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, raised: BaseException) -> str:
    hydra_cfg = SimpleNamespace(runtime=SimpleNamespace(output_dir=str(tmp_path / "0"), choices={"experiment": "x"}),
                                overrides=SimpleNamespace(task=["seed=0"]), job=SimpleNamespace(num=0))
    monkeypatch.setattr(multirun.HydraConfig, "get", staticmethod(lambda: hydra_cfg))

    def fail(*_: object) -> None:
        raise raised

    monkeypatch.setattr(multirun, "run_configured", fail)
    return multirun.sweep_job(OmegaConf.create({"run": {"name": None}}))


def test_a_failed_job_is_recorded_and_the_sweep_goes_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert _job(monkeypatch, tmp_path, SystemExit("error: bad version")) == "failed: error: bad version"
    assert json.loads((tmp_path / "0" / "error.json").read_text())["error"] == "error: bad version"


def test_a_job_stopped_by_sigterm_stops_the_sweep(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as stopped:
        _job(monkeypatch, tmp_path, SystemExit(143))
    assert stopped.value.code == 143
    assert "SIGTERM" in json.loads((tmp_path / "0" / "error.json").read_text())["error"]
