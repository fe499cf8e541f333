"""Replay a finished RL run's steps through :class:`repro.rl.loop.RLLoop` and print the weights' sha256 after
each step.

Each step's reports are read back from the run's ``rl/step_NNN/instances/`` and its rows rebuilt from the run's
traces (``traces.sqlite``) by the trainer itself (:meth:`RLLoop.train`: task order, rows, update, save,
checkpoint, record), with the run's RL, trainer and sample settings (``config.yaml``), starting from the run's cached
warm start. The recorded rollouts stand in for the model server (nothing is sampled or loaded), which isolates the
update from serving: the same run replayed twice gives the same hashes, and the last equals the run's
``weights_sha256.after`` (a 2-step miniature: 676030ee...). The baseline for changing the trainer's code without
changing what it computes (issue 33).

    python scripts/trainer_replay.py outputs/mini_repro/RUN_ID /tmp/replay
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from repro.common.files import cache_dir, weights_sha256
from repro.evaluation import read_reports
from repro.rl.checkpoints import stage_policy
from repro.rl.config import RLConfig
from repro.rl.loop import RLLoop
from repro.train.config import UpdateConfig
from repro.train.samples import SampleConfig


@dataclass
class RecordedServer:
    """The run's recorded rollouts in place of a model server: nothing is served, so a sync loads nothing."""

    model_dir: Path
    reload_checks: list[Any] = field(default_factory=list)

    def sync_weights(self, model_dir: Path, version: int | None = None, scorer: Any = None) -> float:
        return 0.0

    def set_policy_version(self, version: int) -> None:
        pass


def group(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    return {k: v for k, v in cfg[name].items() if k != "_target_"}


def rl_config(run: Path) -> RLConfig:
    """The run's RL, trainer and sample settings as one :class:`RLConfig` (without Hydra's ``_target_``)."""
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    update = group(cfg, "trainer")
    update["adam_betas"] = tuple(update.get("adam_betas", (0.9, 0.99)))
    return RLConfig(**group(cfg, "rl"), update=UpdateConfig(**update), samples=SampleConfig(**group(cfg, "samples")))


def replay(run: Path, out: Path) -> list[str]:
    """The sha256 of the weights after each replayed step."""
    key = json.loads((run / "metrics.json").read_text())["warm_start"]["key"]
    policy = stage_policy(cache_dir() / "warm_start" / f"warm-{key}", out)
    trainer = RLLoop(RecordedServer(policy), None, None, rl_config(run), out)
    hashes = []
    for step_dir in sorted((run / "rl").glob("step_*")):
        step = int(step_dir.name.split("_")[1])
        trainer.store_path = run / "traces.sqlite"
        record = trainer.train(step, read_reports(step_dir), 0.0)
        hashes.append(weights_sha256(policy))
        print(step_dir.name, record["rollouts"], record["update"]["rows"], hashes[-1], flush=True)
    return hashes


if __name__ == "__main__":
    replay(Path(sys.argv[1]), Path(sys.argv[2]))
