"""The loss-gated decay: planned when the loss is low in time, later when it is not, never past the cap; and SFT
follows it (steps taken, learning rates, the record)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from repro.train.config import SftConfig
from repro.train.sft import SftProgress, sft_train
from repro.train.sft_schedule import LossGatedDecay, gated_decay


def _run(gate: LossGatedDecay, losses: dict[int, float]) -> int:
    """Steps the trainer's loop would take (log at the steps in ``losses``); returns the last step."""
    step = 0
    while step < gate.max_steps:
        step += 1
        if step in losses:
            gate.observe(step, losses[step])
        gate.tick(step)
        if gate.finished(step):
            break
    return step


def test_a_low_loss_in_time_keeps_the_planned_schedule() -> None:
    gate = gated_decay(100, 10, 0.3, 0.1, threshold=0.5, max_steps_factor=2.0)
    assert (gate.decay_steps, gate.max_steps) == (30, 200)
    end = _run(gate, {s: 0.2 for s in range(10, 201, 10)})
    assert (gate.decay_start, gate.trigger, end) == (70, "loss", 100)


def test_a_late_drop_moves_the_decay_after_it() -> None:
    gate = gated_decay(100, 10, 0.3, 0.1, threshold=0.5, max_steps_factor=2.0)
    end = _run(gate, {s: (1.0 if s < 130 else 0.3) for s in range(10, 201, 10)})
    assert (gate.decay_start, gate.trigger, end) == (130, "loss", 160)


def test_no_drop_ends_at_the_cap() -> None:
    gate = gated_decay(100, 10, 0.3, 0.1, threshold=0.5, max_steps_factor=2.0)
    end = _run(gate, {s: 1.0 for s in range(10, 201, 10)})
    assert (gate.decay_start, gate.trigger, end) == (170, "cap", 200)


@given(start=st.integers(0, 400), step=st.integers(0, 600))
def test_the_factor_is_warmup_then_one_then_a_linear_decay_to_the_floor(start: int, step: int) -> None:
    gate = LossGatedDecay(300, 10, 90, 0.1, 0.5, 600, decay_start=max(start, 10))
    value = gate.factor(step)
    assert 0.0 <= value <= 1.0
    if step < 10:
        assert value == pytest.approx(step / 10)
    elif step <= gate.decay_start:
        assert value == 1.0
    elif step >= gate.decay_start + 90:
        assert value == pytest.approx(0.1)
    else:
        assert 0.1 < value < 1.0


def test_bad_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="decay steps"):
        LossGatedDecay(10, 0, 20, 0.1, 0.5, 30)


@dataclass
class Demo:
    input_ids: list[int]
    loss_mask: list[int]


@pytest.mark.parametrize(("threshold", "steps", "trigger"), [(100.0, 16, "loss"), (1e-9, 32, "cap")])
def test_sft_stops_when_the_decay_ends(tiny_model_dir: Path, tmp_path: Path, threshold: float, steps: int,
                                       trigger: str) -> None:
    """A loss always below the threshold: the planned 16 steps; never below: the cap of 2 x 16."""
    prompt, answer = list(range(10, 30)), [40, 41, 42, 43]
    rows = [Demo(prompt + answer, [0] * len(prompt) + [1] * len(answer))] * 32
    cfg = SftConfig(epochs=4, batch_size=8, learning_rate=1e-2, warmup_steps=2, logging_steps=1,
                    decay_at_loss=threshold, max_steps_factor=2.0)
    stats = sft_train(tiny_model_dir, rows, tmp_path / "warm", cfg)
    assert stats["steps"] == steps and stats["schedule"]["decay_trigger"] == trigger
    assert stats["schedule"]["planned_steps"] == 16 and stats["schedule"]["max_steps"] == 32
    # the optimizer followed the gate: near the floor when the decay ended (a schedule planned over the cap's 32
    # steps would still be at the peak at step 16)
    assert stats["learning_rate_last"] < 0.4 * cfg.learning_rate


def test_progress_counts_to_the_expected_end_and_names_the_cap_while_the_decay_waits() -> None:
    gate = gated_decay(100, 10, 0.3, 0.1, threshold=0.5, max_steps_factor=2.0)
    progress = SftProgress(gate)
    assert progress.line(20, 200, 1.0).startswith("step 20/100 (20%, at most 200), loss 1.000")
    assert progress.line(150, 200, 1.0).startswith("step 150/180 (83%, at most 200)")  # a decay starting now
    gate.observe(150, 0.3)
    assert gate.expected_end(150) == 180
    assert progress.line(160, 200, 0.3).startswith("step 160/180 (89%), loss 0.300")
    assert SftProgress().line(20, 200, 1.0).startswith("step 20/200 (10%), loss 1.000")
