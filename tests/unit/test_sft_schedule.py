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
from repro.train.sft_schedule import GatedDecay, gated_decay


def _run(gate: GatedDecay, losses: dict[int, float]) -> int:
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
    gate = GatedDecay(300, 10, 90, 0.1, 0.5, 600, decay_start=max(start, 10))
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
        GatedDecay(10, 0, 20, 0.1, 0.5, 30)


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


def test_a_reproduction_gate_waits_for_a_high_score_not_a_low_one() -> None:
    gate = gated_decay(100, 10, 0.3, 0.1, threshold=0.2, max_steps_factor=2.0, metric="reproduced")
    end = _run(gate, {s: (0.1 if s < 120 else 0.25) for s in range(10, 201, 10)})
    assert (gate.decay_start, gate.trigger, end) == (120, "reproduced", 150)
    assert gate.record()["decay_at_reproduced"] == 0.2
    with pytest.raises(ValueError, match="unknown gate metric"):
        gated_decay(100, 10, 0.3, 0.1, threshold=0.2, max_steps_factor=2.0, metric="accuracy")


def test_a_reproduction_gate_needs_held_out_rows_and_excludes_the_loss_gate() -> None:
    from repro.train.sft import gate_metric

    assert gate_metric(SftConfig(holdout_every=25, decay_at_reproduced=0.2)) == ("reproduced", 0.2)
    assert gate_metric(SftConfig(decay_at_loss=0.6)) == ("loss", 0.6) and gate_metric(SftConfig()) is None
    with pytest.raises(ValueError, match="holdout_every"):
        gate_metric(SftConfig(decay_at_reproduced=0.2))
    with pytest.raises(ValueError, match="not both"):
        gate_metric(SftConfig(holdout_every=25, decay_at_reproduced=0.2, decay_at_loss=0.6))


@pytest.mark.parametrize(("threshold", "steps", "trigger"), [(0.5, 14, "reproduced"), (1.01, 28, "cap")])
def test_sft_on_held_out_rows_follows_the_reproduction_gate(tiny_model_dir: Path, tmp_path: Path, threshold: float,
                                                            steps: int, trigger: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Every 8th of 32 rows held out: 28 trained, 14 planned steps; a share reached (the score made 0.5 from step
    5 on) ends there, one never reached (above 1, real scores) at the cap; the scores are recorded."""
    import repro.train.sft_holdout as holdout

    if threshold < 1:
        real = holdout.score_holdout
        calls: list[int] = []

        def scored(*args: object, **kwargs: object) -> holdout.HoldoutScore:
            calls.append(1)
            return holdout.HoldoutScore(0.5, 0.5, 0.5) if len(calls) >= 5 else real(*args, **kwargs)

        monkeypatch.setattr(holdout, "score_holdout", scored)
    prompt, answer = list(range(10, 30)), [40, 41, 42, 43]
    rows = [Demo(prompt + answer, [0] * len(prompt) + [1] * len(answer))] * 32
    cfg = SftConfig(epochs=4, batch_size=8, learning_rate=1e-2, warmup_steps=2, logging_steps=1,
                    holdout_every=8, holdout_steps=1, decay_at_reproduced=threshold, max_steps_factor=2.0)
    stats = sft_train(tiny_model_dir, rows, tmp_path / "warm", cfg)
    assert stats["rows"] == 28 and stats["holdout"]["rows"] == 4
    assert stats["steps"] == steps and stats["schedule"]["decay_trigger"] == trigger
    assert [h[0] for h in stats["holdout"]["history"]] == list(range(1, steps + 1))
    assert 0.0 <= stats["holdout"]["final"]["later_actions"] <= 1.0
