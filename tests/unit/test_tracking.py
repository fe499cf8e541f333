"""repro.common.tracking: each backend writes what a researcher's tool reads back (TensorBoard event files, a wandb
offline
run, an MLflow SQLite store); SFT's report_to names the chosen backend; tracking=none needs no tracking package."""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from repro.common import tracking
from repro.common.tracking import TrackingConfig, scalars, trainer_reporting
from repro.train.config import SftConfig
from repro.train.sft import trl_args

STEPS = [{"step": s, "reward_mean": 0.25 * s, "mixed_group_share": 0.5, "calls_histogram": {"1": 4 - s, "2": s},
          "note": "text is dropped", "entropy": float("nan")} for s in range(3)]


def _log_steps(run_dir: Path, cfg: TrackingConfig) -> None:
    with tracking.tracked(run_dir, cfg, "rl-test") as tracker:
        for metrics in STEPS:
            tracker.log(metrics["step"], metrics)


def test_scalars_flatten_numbers_and_drop_the_rest() -> None:
    assert scalars({**STEPS[1], "ok": True, "validation": {"pass_at_1": 0.5, "ids": [1]}}) == {
        "step": 1.0, "reward_mean": 0.25, "mixed_group_share": 0.5, "calls_histogram/1": 3.0, "calls_histogram/2": 1.0,
        "ok": 1.0, "validation/pass_at_1": 0.5}


def test_tensorboard_event_files_read_back_with_their_steps(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="not installed: pip install 'repro[tracking-tensorboard]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _log_steps(tmp_path, TrackingConfig("tensorboard"))
    events = EventAccumulator(str(tmp_path / "tracking" / "tensorboard" / "rl-test"))
    events.Reload()
    assert "note" not in events.Tags()["scalars"] and "entropy" not in events.Tags()["scalars"]
    assert [(e.step, e.value) for e in events.Scalars("reward_mean")] == [(0, 0.0), (1, 0.25), (2, 0.5)]
    assert [e.value for e in events.Scalars("calls_histogram/2")] == [0.0, 1.0, 2.0]


def _wandb_records(path: Path) -> Iterator[object]:
    """The protobuf records of a ``.wandb`` file: a 7-byte header, then LevelDB-log chunks in 32 KiB blocks, each
    with a 7-byte header (crc32c, length, type: 1 full, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data, block, pos, parts = path.read_bytes(), 32768, 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        length, kind = struct.unpack("<HB", data[pos + 4 : pos + 7]) if left >= 7 else (0, 0)
        if kind == 0:  # block trailer padding
            pos += left
            continue
        parts += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            parts = b""
            yield record


def test_wandb_offline_run_holds_the_logged_history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb", reason="wandb is not installed (pip install 'repro[wandb]')")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    _log_steps(tmp_path, TrackingConfig("wandb", mode="offline"))
    (run_file,) = (tmp_path / "tracking" / "wandb").glob("offline-run-*/run-*.wandb")
    history = [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
               for r in _wandb_records(run_file) if r.WhichOneof("record_type") == "history"]
    assert [(h["_step"], h["reward_mean"], h["calls_histogram/1"]) for h in history] == [(0, 0, 4), (1, 0.25, 3),
                                                                                         (2, 0.5, 2)]
    assert all("note" not in h for h in history)


def test_mlflow_store_holds_the_metric_history(tmp_path: Path) -> None:
    pytest.importorskip("mlflow", reason="mlflow is not installed (pip install 'repro[mlflow]')")
    from mlflow.tracking import MlflowClient

    _log_steps(tmp_path, TrackingConfig("mlflow", project="unit"))
    client = MlflowClient(tracking_uri=tracking.mlflow_uri(tmp_path / "tracking"))
    (run,) = client.search_runs([client.get_experiment_by_name("unit").experiment_id])
    assert run.info.run_name == "rl-test" and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "reward_mean")
    assert sorted((m.step, m.value) for m in history) == [(0, 0.0), (1, 0.25), (2, 0.5)]


def test_a_missing_backend_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if not installed: imports fail, find_spec says None
    assert importlib.util.find_spec("mlflow") is None
    with pytest.raises(ValueError, match=r"tracking=mlflow needs the mlflow package: pip install 'repro\[mlflow\]'"):
        TrackingConfig("mlflow")
    with pytest.raises(SystemExit, match=r"pip install 'repro\[mlflow\]'"):
        tracking.require("mlflow")
    with pytest.raises(ValueError, match=r"tracking\.backend must be one of"):
        TrackingConfig("neptune")


def test_sft_report_to_is_the_chosen_backend(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="tensorboard is not installed")
    assert trl_args(SftConfig(), 8, tmp_path / "work").report_to in ("none", [], ["none"])  # the default: none
    before = os.environ.get("TENSORBOARD_LOGGING_DIR")
    with trainer_reporting(TrackingConfig("tensorboard"), tmp_path, "sft-run") as report_to:
        args = trl_args(SftConfig(), 8, tmp_path / "work", report_to, "sft-run")
        assert os.environ["TENSORBOARD_LOGGING_DIR"] == str(tmp_path / "tracking" / "tensorboard" / "sft-run")
    assert args.report_to == ["tensorboard"] and args.run_name == "sft-run"
    assert os.environ.get("TENSORBOARD_LOGGING_DIR") == before  # restored after the block
    with trainer_reporting(None, tmp_path, "sft-run") as report_to:
        assert report_to == "none"


def test_trainer_env_points_each_backend_into_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())  # as if every backend were installed
    assert tracking.trainer_env(TrackingConfig(), tmp_path, "x") == {}
    env = tracking.trainer_env(TrackingConfig("wandb", project="p", mode="offline"), tmp_path, "x")
    assert env == {"WANDB_DIR": str(tmp_path / "tracking"), "WANDB_PROJECT": "p", "WANDB_MODE": "offline"}
    env = tracking.trainer_env(TrackingConfig("mlflow", project="p", dir=str(tmp_path / "elsewhere")), tmp_path, "x")
    assert env == {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'elsewhere' / 'mlflow.db'}",
                   "MLFLOW_EXPERIMENT_NAME": "p"}


def test_tracking_none_needs_no_tracking_package(tmp_path: Path) -> None:
    """With every tracking package made unimportable, the RL loop and the warm start import and track nothing."""
    code = f"""
import sys
for name in ("wandb", "mlflow", "tensorboard", "torch.utils.tensorboard"):
    sys.modules[name] = None
import repro.rl.loop, repro.recipe.warm_start
from pathlib import Path
from repro.common import tracking
with tracking.tracked(Path({str(tmp_path)!r}), tracking.TrackingConfig(), "rl") as tracker:
    tracker.log(0, {{"reward_mean": 1.0}})
with tracking.trainer_reporting(tracking.TrackingConfig(), Path({str(tmp_path)!r}), "sft") as report_to:
    assert report_to == "none"
print("ok")
"""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
    assert not (tmp_path / "tracking").exists()


def test_sft_logs_its_loss_to_tensorboard_in_the_run(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A two-step SFT through trl's report_to: the event files land in the run (trl's work folder is removed)."""
    pytest.importorskip("tensorboard", reason="tensorboard is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from repro.train.sft import sft_train

    @dataclass
    class Row:
        input_ids: list[int]
        loss_mask: list[int]

    rows = [Row(list(range(10, 20)), [0] * 6 + [1] * 4)] * 8
    cfg = SftConfig(epochs=1, batch_size=4, warmup_steps=0, logging_steps=1)
    with trainer_reporting(TrackingConfig("tensorboard"), tmp_path, "sft-test") as report_to:
        sft_train(tiny_model_dir, rows, tmp_path / "warm", cfg, report_to, "sft-test")
    events = EventAccumulator(str(tmp_path / "tracking" / "tensorboard" / "sft-test"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2]
