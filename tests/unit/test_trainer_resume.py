"""A trainer resumed from its saved weights and state (optimizer moments, step count, random states) continues
exactly as the uninterrupted one: the same weights, bit for bit, after the next update."""

from __future__ import annotations

from pathlib import Path

import torch

from repro.common.files import weights_sha256
from repro.testing import FakeTrainingRow
from repro.train.config import UpdateConfig
from repro.train.rl import PolicyTrainer


def _rows(offset: int) -> list[FakeTrainingRow]:
    return [FakeTrainingRow([1 + (offset + i) % 50, 2, 3 + i, 4, 5 + offset % 7, 6], 1.0 if i % 2 else -1.0)
            for i in range(6)]


def test_a_resumed_trainer_continues_bit_for_bit(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = UpdateConfig(learning_rate=1e-3, updates_per_batch=2, micro_batch_rows=4, on_policy_log_ratio_max=0.0)
    straight = PolicyTrainer(tiny_model_dir, cfg)
    for offset in (0, 1):
        straight.update(_rows(offset))
    straight.save(tmp_path / "straight")

    first = PolicyTrainer(tiny_model_dir, cfg)
    first.update(_rows(0))
    first.save(tmp_path / "half")
    first.save_state(tmp_path / "state.pt")
    torch.manual_seed(12345)  # whatever ran in between must not matter
    resumed = PolicyTrainer(tmp_path / "half", cfg)
    resumed.load_state(tmp_path / "state.pt")
    assert resumed.steps == 1
    resumed.update(_rows(1))
    resumed.save(tmp_path / "resumed")
    assert weights_sha256(tmp_path / "resumed") == weights_sha256(tmp_path / "straight")

    fresh = PolicyTrainer(tmp_path / "half", cfg)  # without the optimizer state: another result
    fresh.update(_rows(1))
    fresh.save(tmp_path / "fresh")
    assert weights_sha256(tmp_path / "fresh") != weights_sha256(tmp_path / "straight")
