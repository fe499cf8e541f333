"""rl.checkpoint_every > 1: a resumable checkpoint (weights + trainer state) every N steps and at the end; a rerun
drops the steps after the last checkpoint (the weights that sampled them are gone) and restarts from it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import repro.rl.loop as rl_loop
from repro.rl.checkpoints import CHECKPOINT, POLICY_STEP, TRAINER_STATE, RunState, stage_policy
from repro.rl.config import RLConfig
from repro.rl.loop import RLLoop
from repro.train.config import UpdateConfig


class StubTrainer:
    def __init__(self, *args: object) -> None:
        pass

    def save_state(self, path: Path) -> Path:
        Path(path).write_text("state")
        return Path(path)


def _finish_step(loop: RunState, policy: Path, step: int) -> None:
    """What RLLoop.train leaves behind after an update: weights marked with the step, the checkpoint, the record."""
    (policy / "model.safetensors").write_text(f"weights after step {step}")
    loop.mark_weights(step)
    loop.save(step, StubTrainer())
    loop.write_step(step, {"step": step})


def _loop(run_dir: Path, policy: Path, every: int, steps: int = 6) -> RunState:
    return RunState(run_dir, policy, steps, every)


def _trainer(run_dir: Path, policy: Path, cfg: RLConfig, monkeypatch) -> RLLoop:
    monkeypatch.setattr(rl_loop, "PolicyTrainer", StubTrainer)  # no model: these tests stop before an update
    return RLLoop(SimpleNamespace(model_dir=policy), None, None, cfg, run_dir)


def _warm(tmp_path: Path) -> Path:
    warm = tmp_path / "warm"
    warm.mkdir()
    (warm / "config.json").write_text("{}")
    (warm / "model.safetensors").write_text("warm weights")
    return warm


def test_a_rerun_restarts_from_the_last_checkpoint_and_drops_later_steps(tmp_path: Path) -> None:
    run_dir = tmp_path / "arm"
    policy = stage_policy(_warm(tmp_path), run_dir)
    loop = _loop(run_dir, policy, every=2)
    for step in range(5):  # checkpoints after steps 1 and 3; step 4 finished but is not resumable
        _finish_step(loop, policy, step)
    checkpoint = run_dir / "rl" / CHECKPOINT
    assert json.loads((checkpoint / POLICY_STEP).read_text())["step"] == 3
    assert (checkpoint / TRAINER_STATE).exists() and not (run_dir / "rl" / TRAINER_STATE).exists()

    restaged = stage_policy(tmp_path / "warm", run_dir)  # the rerun: the policy comes back from the checkpoint
    assert (restaged / "model.safetensors").read_text() == "weights after step 3"
    assert not (restaged / TRAINER_STATE).exists()
    records = _loop(run_dir, restaged, every=2).completed_steps()
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert not (run_dir / "rl" / "step_004").exists()


def test_without_a_checkpoint_a_rerun_starts_over(tmp_path: Path) -> None:
    run_dir = tmp_path / "arm"
    policy = stage_policy(_warm(tmp_path), run_dir)
    loop = _loop(run_dir, policy, every=4)
    _finish_step(loop, policy, 0)
    restaged = stage_policy(tmp_path / "warm", run_dir)
    assert (restaged / "model.safetensors").read_text() == "warm weights"
    assert _loop(run_dir, restaged, every=4).completed_steps() == []
    assert not (run_dir / "rl" / "step_000").exists()


def test_the_last_step_is_always_a_checkpoint(tmp_path: Path) -> None:
    run_dir = tmp_path / "arm"
    policy = stage_policy(_warm(tmp_path), run_dir)
    loop = _loop(run_dir, policy, every=4, steps=3)
    for step in range(3):
        _finish_step(loop, policy, step)
    assert json.loads((run_dir / "rl" / CHECKPOINT / POLICY_STEP).read_text())["step"] == 2


def test_checkpoint_every_must_be_positive() -> None:
    with pytest.raises(ValueError, match="checkpoint_every"):
        RLConfig(checkpoint_every=0)


def test_one_step_off_needs_the_on_policy_check_off(tmp_path: Path, monkeypatch) -> None:
    cfg = RLConfig(mode="one_step_off", update=UpdateConfig(on_policy_log_ratio_max=1e-3))
    with pytest.raises(ValueError, match="on_policy_log_ratio_max=0"):
        _trainer(tmp_path, tmp_path, cfg, monkeypatch)
    with pytest.raises(ValueError, match=r"rl\.mode must be one of"):
        RLConfig(mode="async")


def test_a_steps_rows_are_built_in_task_order_not_completion_order(tmp_path: Path, monkeypatch) -> None:
    import random

    seen: list[list[str]] = []

    class Stop(Exception):
        pass

    def build_rows(store, ids, config):
        seen.append(list(ids))
        raise Stop

    monkeypatch.setattr(rl_loop, "build_rows", build_rows)
    monkeypatch.setattr(rl_loop, "open_store", lambda path: SimpleNamespace(close=lambda: None))
    reports = [SimpleNamespace(instance_id=f"task-{t}", sample=k, rollout_id=f"r-{t}-{k}")
               for t in range(5) for k in range(4)]
    trainer = _trainer(tmp_path / "arm", tmp_path / "policy", RLConfig(), monkeypatch)
    for seed in range(3):
        shuffled = random.Random(seed).sample(reports, len(reports))
        with pytest.raises(Stop):
            trainer.train(0, shuffled, 0.0)
    assert seen[0] == [r.rollout_id for r in reports] and seen[0] == seen[1] == seen[2]
