"""The front door's refusals and ownership, before anything starts: a missing checkpoint or an empty task list is a
clear error; the sandbox the trainer made is closed with it, one passed in is left to its owner."""

from __future__ import annotations

from pathlib import Path

import pytest

from repro import RLTrainer
from repro.sandbox.local import LocalSandbox
from repro.tasks.distributions import TaskDistributionConfig, build_distribution
from repro.testing import FakeHarness

TASKS = build_distribution(TaskDistributionConfig(split="train", n_tasks=2))


def checkpoint(tmp_path: Path) -> Path:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    return tmp_path / "ckpt"


def test_a_missing_checkpoint_or_no_tasks_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="transformers checkpoint folder"):
        RLTrainer(tmp_path / "nope", FakeHarness(), TASKS, output_dir=tmp_path / "run")
    with pytest.raises(ValueError, match="at least one training task"):
        RLTrainer(checkpoint(tmp_path), FakeHarness(), [], output_dir=tmp_path / "run")
    with RLTrainer(tmp_path / "ckpt", FakeHarness(), TASKS, output_dir=tmp_path / "run") as trainer, \
            pytest.raises(ValueError, match="nothing to evaluate"):
        trainer.evaluate()
    assert not (tmp_path / "run").exists()  # nothing was written


def test_the_trainer_closes_the_sandbox_it_made_and_not_one_it_was_given(tmp_path: Path) -> None:
    model = checkpoint(tmp_path)
    with RLTrainer(model, FakeHarness(), TASKS, output_dir=tmp_path / "a") as trainer:
        own = trainer.sandbox
        assert isinstance(own, LocalSandbox) and own.root.exists()
    assert not own.root.exists()
    with LocalSandbox() as given:
        with RLTrainer(model, FakeHarness(), TASKS, sandbox=given, output_dir=tmp_path / "b"):
            pass
        assert given.root.exists()
    assert not given.root.exists()
