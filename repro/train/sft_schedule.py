"""A warm-up / constant / linear-decay schedule whose decay waits for a measure: the training loss
(``warm_start.sft.decay_at_loss``) or the held-out reproduction of the expert's later actions
(``warm_start.sft.decay_at_reproduced``, :mod:`repro.train.sft_holdout`).

On the miniature's demonstrations the tiny model learns to copy text (line numbers, code) in a sudden drop of the
loss, and the step at which the drop comes varies by seed: about step 1,500 for seed 1, about 2,600 for seed 2 at
batch 8 (issue 30). A fixed schedule that starts its decay at 70% of the steps catches the late seed mid-drop and
leaves a warm start that cannot copy. Here the decay starts at its planned step only if the logged training loss is
below ``threshold`` by then (for ``metric="reproduced"``: at or above it); otherwise the constant phase runs on until
it is, or until the decay must start to end by ``max_steps``. Training stops when the decay ends. The rule and where
it fired are recorded with the warm start.

The loss turned out a poor sign of copying (issue 30): seeds reach 0.25-0.30 and resolve 0-1% or 7-11% of
held-out tasks; held-out reproduction of the later actions separates them (0.10 -> 1%, 0.29 -> 19% on validation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from transformers import TrainerCallback


@dataclass
class GatedDecay:
    """The learning-rate factor per step, and when the decay started (``trigger``: the metric's name or ``cap``);
    ``metric``: ``loss`` (ready below ``threshold``) or ``reproduced`` (ready at or above it)."""

    planned_steps: int
    warmup_steps: int
    decay_steps: int
    min_lr_ratio: float
    threshold: float
    max_steps: int
    decay_start: int | None = None
    trigger: str = ""
    metric: str = "loss"

    def __post_init__(self) -> None:
        if self.metric not in ("loss", "reproduced"):
            raise ValueError(f"unknown gate metric {self.metric!r} (loss | reproduced)")
        if not 0 < self.decay_steps <= self.planned_steps <= self.max_steps:
            raise ValueError(f"need 0 < decay steps ({self.decay_steps}) <= planned steps ({self.planned_steps}) <= "
                             f"max steps ({self.max_steps})")

    def factor(self, step: int) -> float:
        """The learning rate at ``step`` as a share of the peak."""
        if step < self.warmup_steps:
            return step / max(1, self.warmup_steps)
        if self.decay_start is None or step < self.decay_start:
            return 1.0
        progress = min(1.0, (step - self.decay_start) / self.decay_steps)
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * (1.0 - progress)

    def ready(self, value: float) -> bool:
        """Whether ``value`` of the metric lets the decay start."""
        return value < self.threshold if self.metric == "loss" else value >= self.threshold

    def observe(self, step: int, value: float) -> None:
        """A measured value of the metric: the decay starts once it is ready, from the planned step on."""
        if self.decay_start is None and step >= self.planned_steps - self.decay_steps and self.ready(value):
            self._start(step, self.metric)

    def tick(self, step: int) -> None:
        """After each step: the decay starts at the latest step that still lets it end by ``max_steps``."""
        if self.decay_start is None and step >= self.max_steps - self.decay_steps:
            self._start(step, "cap")

    def expected_end(self, step: int) -> int:
        """The step training ends at, as known at ``step``: the decay's end once it started, else the earliest end
        still possible (the planned one, or a decay starting now), never past the cap."""
        if self.decay_start is not None:
            return self.decay_start + self.decay_steps
        return min(self.max_steps, max(self.planned_steps, step + self.decay_steps))

    def finished(self, step: int) -> bool:
        return self.decay_start is not None and step >= self.decay_start + self.decay_steps

    def _start(self, step: int, trigger: str) -> None:
        self.decay_start, self.trigger = step, trigger

    def record(self) -> dict[str, Any]:
        """What the rule did, for the warm start's record."""
        return {f"decay_at_{self.metric}": self.threshold, "planned_steps": self.planned_steps,
                "max_steps": self.max_steps, "decay_start": self.decay_start, "decay_trigger": self.trigger or "none"}


def step_cap(planned_steps: int, max_steps_factor: float) -> int:
    """The most steps a gated schedule may take: ``max_steps_factor`` x the planned ones, never fewer."""
    return max(planned_steps, math.ceil(planned_steps * max_steps_factor))


def gated_decay(planned_steps: int, warmup_steps: int, decay_fraction: float, min_lr_ratio: float,
                threshold: float, max_steps_factor: float, metric: str = "loss") -> GatedDecay:
    """The schedule for ``planned_steps`` (the steps of the configured epochs) and its cap."""
    decay = max(1, int(planned_steps * decay_fraction))
    return GatedDecay(planned_steps, min(warmup_steps, planned_steps // 2), decay, min_lr_ratio, threshold,
                      step_cap(planned_steps, max_steps_factor), metric=metric)


class GateCallback(TrainerCallback):
    """Feeds the logged loss to a loss gate, starts the decay at the cap, stops training when the decay ends (a
    ``reproduced`` gate is fed by :class:`repro.train.sft_holdout.HoldoutCallback`)."""

    def __init__(self, gate: GatedDecay) -> None:
        self.gate = gate

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **_: Any) -> None:
        if self.gate.metric == "loss" and logs and "loss" in logs:
            self.gate.observe(state.global_step, float(logs["loss"]))

    def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        self.gate.tick(state.global_step)
        if self.gate.finished(state.global_step):
            control.should_training_stop = True


def with_gated_schedule(trainer_class: type) -> type:
    """``trainer_class`` whose scheduler is the instance's ``gate`` (a LambdaLR over :meth:`GatedDecay.factor`)."""

    class GatedScheduleTrainer(trainer_class):  # type: ignore[misc, valid-type]
        gate: GatedDecay

        def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
            import torch

            if self.lr_scheduler is None:
                self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer or self.optimizer, self.gate.factor)
            return self.lr_scheduler

    GatedScheduleTrainer.__name__ = f"Gated{trainer_class.__name__}"
    return GatedScheduleTrainer
