"""Replay a finished RL run's steps through the trainer alone and print the weights' sha256 after each step.

Each step's rows are rebuilt from the run's traces (``traces.sqlite``) in the RL loop's order (task, sample, rollout
id), with the run's trainer and sample settings (``config.yaml``), starting from the run's cached warm start. This
isolates the update from serving: the same run replayed twice gives the same hashes, and the last equals the run's
``weights_sha256.after`` (checked on a 2-step miniature: 676030ee...). A baseline for changing the trainer's code
without changing what it computes (issue 33).

    python scripts/trainer_replay.py outputs/mini_repro/RUN_ID /tmp/replay
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from repro.files import cache_dir, weights_sha256
from repro.samples import SampleConfig
from repro.samples.build import build_rows
from repro.store import open_store
from repro.train.config import RlConfig
from repro.train.rl import PolicyTrainer


def settings(run: Path) -> tuple[RlConfig, dict]:
    """The run's trainer settings and sample settings (without Hydra's ``_target_``)."""
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    trainer = {k: v for k, v in cfg["trainer"].items() if k != "_target_"}
    if isinstance(trainer.get("adam_betas"), list):
        trainer["adam_betas"] = tuple(trainer["adam_betas"])
    return RlConfig(**trainer), {k: v for k, v in cfg["samples"].items() if k != "_target_"}


def sample_index(rollout_id: str) -> int:
    return int(rollout_id.rsplit("--s", 1)[1].split("-")[0])


def replay(run: Path, out: Path) -> list[str]:
    """The sha256 of the weights after each replayed step."""
    rl_cfg, samples = settings(run)
    key = json.loads((run / "metrics.json").read_text())["warm_start"]["key"]
    trainer = PolicyTrainer(cache_dir() / "warm_start" / f"warm-{key}", rl_cfg)
    sample_cfg = SampleConfig(**{**samples, "weighting": rl_cfg.weighting, "include_modes": ("train",)})
    store = open_store(run / "traces.sqlite")
    hashes = []
    try:
        for step_dir in sorted((run / "rl").glob("step_*")):
            rollouts = sorted(store.list_rollouts(step_dir.name),
                              key=lambda r: (r.task_id, sample_index(r.rollout_id), r.rollout_id))
            rows = build_rows(store, [r.rollout_id for r in rollouts], sample_cfg).rows
            trainer.update(rows, trainer.plan(rows))
            hashes.append(weights_sha256(trainer.save(out / step_dir.name)))
            print(step_dir.name, len(rollouts), len(rows), hashes[-1], flush=True)
    finally:
        store.close()
    return hashes


if __name__ == "__main__":
    replay(Path(sys.argv[1]), Path(sys.argv[2]))
