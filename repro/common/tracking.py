"""Experiment tracking researchers already use: ``tracking=tensorboard|wandb|mlflow`` (default ``none``).

One interface for the RL loop's per-step metrics: :func:`open` ``(run_dir, cfg, run_name)`` returns a tracker with
``log(step, metrics)`` and ``close()``. SFT goes through trl's own ``report_to`` instead, pointed at the same
folder by :func:`trainer_reporting`. Everything lands under ``<run dir>/tracking/`` (``tracking.dir`` moves it):
``tensorboard/<run name>/`` event files, ``wandb/`` (offline runs: ``wandb sync`` uploads them), ``mlflow.db``
(an MLflow SQLite store: ``mlflow ui --backend-store-uri sqlite:///<that file>``). Each backend's package is
imported only when it is selected; a missing one is one line naming the extra that installs it. The per-step
JSONL (``rl/diagnostics.jsonl``) is written whatever the backend.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import math
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

BACKENDS = ("none", "tensorboard", "wandb", "mlflow")
_PACKAGES = {"tensorboard": ("tensorboard", "tracking-tensorboard"), "wandb": ("wandb", "wandb"),
             "mlflow": ("mlflow", "mlflow")}  # backend -> (module, the repro extra that installs it)
TRACKING_DIR = "tracking"
MLFLOW_DB = "mlflow.db"


@dataclass
class TrackingConfig:
    """Which tracker gets the metrics. ``project``: wandb project / MLflow experiment; ``mode``: wandb's mode
    (``offline``, ``online``; None: ``WANDB_MODE`` or wandb's default); ``dir``: where trackers write (None:
    ``<run dir>/tracking``)."""

    backend: str = "none"
    project: str = "repro"
    mode: str | None = None
    dir: str | None = None

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"tracking.backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.enabled and importlib.util.find_spec(_PACKAGES[self.backend][0]) is None:  # found, not imported
            raise ValueError(missing_message(self.backend))  # before the run starts, not hours in

    @property
    def enabled(self) -> bool:
        return self.backend != "none"

    def root(self, run_dir: Path) -> Path:
        return Path(self.dir) if self.dir else Path(run_dir) / TRACKING_DIR


class Tracker(Protocol):
    def log(self, step: int, metrics: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


def missing_message(backend: str) -> str:
    module, extra = _PACKAGES[backend]
    return f"tracking={backend} needs the {module} package: pip install 'repro[{extra}]' (or tracking=none)"


def require(backend: str) -> ModuleType:
    """The backend's package, or SystemExit naming the extra to install."""
    try:
        return importlib.import_module(_PACKAGES[backend][0])
    except ImportError:
        raise SystemExit(f"error: {missing_message(backend)}") from None


def scalars(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers of ``metrics`` (nested dicts flattened to ``a/b``; booleans as 0/1; NaN, text, lists dropped)."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(scalars(value, name + "/"))
        elif isinstance(value, bool | int | float) and not (isinstance(value, float) and math.isnan(value)):
            out[name] = float(value)
    return out


class NullTracker:
    """tracking=none: nothing is imported, nothing is written."""

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


class TensorBoardTracker:
    def __init__(self, root: Path, run_name: str) -> None:
        require("tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(root / "tensorboard" / run_name))

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        for name, value in scalars(metrics).items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(self, root: Path, cfg: TrackingConfig, run_name: str) -> None:
        wandb = require("wandb")
        (root / "wandb").mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=cfg.project, name=run_name, dir=str(root), mode=cfg.mode,
                              reinit="create_new")

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.run.log(scalars(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    def __init__(self, root: Path, cfg: TrackingConfig, run_name: str) -> None:
        require("mlflow")
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=mlflow_uri(root))
        experiment_id = mlflow_experiment(self.client, root, cfg.project)
        self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric

        stamp = int(1000 * time.time())
        self.client.log_batch(self.run_id, [Metric(k, v, stamp, step) for k, v in scalars(metrics).items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def mlflow_uri(root: Path) -> str:
    """An SQLite store in the tracking folder (MLflow 3 refuses new file stores by default)."""
    Path(root).mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(Path(root) / MLFLOW_DB).resolve()}"


def mlflow_experiment(client: Any, root: Path, name: str) -> str:
    """The experiment's id, created with its artifacts in the tracking folder (not the working directory)."""
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return str(experiment.experiment_id)
    return str(client.create_experiment(name, artifact_location=(Path(root).resolve() / "mlartifacts").as_uri()))


def open(run_dir: Path, cfg: TrackingConfig | None, run_name: str) -> Tracker:
    """A tracker for one run of metrics (an RL phase, an arm) named ``run_name``."""
    if cfg is None or not cfg.enabled:
        return NullTracker()
    root = cfg.root(run_dir)
    if cfg.backend == "tensorboard":
        return TensorBoardTracker(root, run_name)
    if cfg.backend == "wandb":
        return WandbTracker(root, cfg, run_name)
    return MlflowTracker(root, cfg, run_name)


@contextlib.contextmanager
def tracked(run_dir: Path, cfg: TrackingConfig | None, run_name: str) -> Iterator[Tracker]:
    """:func:`open` as a context manager: the tracker is closed when the block ends, however it ends."""
    tracker = open(run_dir, cfg, run_name)
    try:
        yield tracker
    finally:
        tracker.close()


def trainer_env(cfg: TrackingConfig, run_dir: Path, run_name: str) -> dict[str, str]:
    """Environment for transformers' own integrations: the folders :func:`open` uses (the run's name goes in the
    trainer's ``run_name``)."""
    root = cfg.root(run_dir)
    if cfg.backend == "tensorboard":
        return {"TENSORBOARD_LOGGING_DIR": str(root / "tensorboard" / run_name)}
    if cfg.backend == "wandb":
        (root / "wandb").mkdir(parents=True, exist_ok=True)
        env = {"WANDB_DIR": str(root), "WANDB_PROJECT": cfg.project}
        return {**env, "WANDB_MODE": cfg.mode} if cfg.mode else env
    if cfg.backend == "mlflow":
        return {"MLFLOW_TRACKING_URI": mlflow_uri(root), "MLFLOW_EXPERIMENT_NAME": cfg.project}
    return {}


@contextlib.contextmanager
def trainer_reporting(cfg: TrackingConfig | None, run_dir: Path, run_name: str) -> Iterator[str]:
    """transformers' ``report_to`` for ``cfg`` ("none" without tracking); inside the block the integration's
    environment points into the run's tracking folder (restored afterwards)."""
    if cfg is None or not cfg.enabled:
        yield "none"
        return
    require(cfg.backend)
    if cfg.backend == "mlflow":  # created here, so that its artifacts stay in the run too
        from mlflow.tracking import MlflowClient

        mlflow_experiment(MlflowClient(tracking_uri=mlflow_uri(cfg.root(run_dir))), cfg.root(run_dir), cfg.project)
    env = trainer_env(cfg, run_dir, run_name)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield cfg.backend
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
