"""One nested configuration of an RL run (:class:`RLConfig`): the schedule and its decoding at the top, the reward,
the policy update, the sample builder and the task filter nested in it. The Hydra groups ``rl``, ``trainer``,
``samples`` and ``rl_filter`` fill its parts (:func:`rl_config`); a library user builds it directly."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from repro.train.config import UpdateConfig
from repro.train.reward import RewardConfig
from repro.train.samples import SampleConfig
from repro.train.task_filter import TaskFilterConfig

RL_MODES = ("sync", "one_step_off")
NESTED = ("update", "samples", "task_filter")  # recorded apart in metrics.json (trainer, samples, probe)


@dataclass
class RLConfig:
    """An RL run: ``steps`` x ``tasks_per_step`` tasks x ``samples_per_task`` samples (one GRPO group per task),
    sampled at ``temperature`` 1 (the importance ratio needs the policy's own distribution).

    ``epochs`` > 0: as many steps as that many passes over the tasks take, capped at ``steps``;
    ``checkpoint_every``: steps between resumable checkpoints (optimizer state; the weights are saved every step for
    the server to load); ``mode=one_step_off``: the next step's rollouts run during this step's update, so part of
    their calls are served by weights one update old (each call records its policy version).
    ``reward``: which tests count and the turn / prompt penalties; ``update``: the optimizer step
    (:class:`~repro.train.config.UpdateConfig`); ``samples``: stored calls -> rows (its weighting is the update's);
    ``task_filter``: the probe step that picks which tasks RL trains on (off by default)."""

    steps: int = 12  # policy updates (the cap when epochs > 0)
    mode: str = "sync"  # sync | one_step_off (next step's rollouts run during this step's update)
    epochs: float = 0.0  # > 0: passes over the tasks that decide the steps
    checkpoint_every: int = 1  # steps between resumable copies of weights + optimizer state
    tasks_per_step: int = 16  # GRPO groups a step
    samples_per_task: int = 8  # rollouts a group
    temperature: float = 1.0  # must be 1: the ratio needs the policy's own distribution
    top_p: float = 1.0  # must be 1, likewise
    max_tokens: int = 96  # forced on every call by the proxy
    concurrency: int = 16  # rollouts in flight
    grading_threads: int = 2  # rollouts graded at once as they end
    seed: int = 0  # the training seed: task order, each rollout's sampling seed, the update's
    reward: RewardConfig = field(default_factory=RewardConfig)
    extra_sampling: dict[str, Any] = field(default_factory=dict)  # e.g. chat_template_kwargs (thinking off)
    reshuffle_each_epoch: bool = False  # a new seeded order of the tasks every pass (verl's sampler); False: one
    update: UpdateConfig = field(default_factory=UpdateConfig)
    samples: SampleConfig = field(default_factory=SampleConfig)
    task_filter: TaskFilterConfig = field(default_factory=TaskFilterConfig)

    def __post_init__(self) -> None:
        if self.mode not in RL_MODES:
            raise ValueError(f"rl.mode must be one of {RL_MODES}, got {self.mode!r}")
        if self.checkpoint_every < 1:
            raise ValueError(f"rl.checkpoint_every must be >= 1, got {self.checkpoint_every}")
        for name, kind in (("reward", RewardConfig), ("update", UpdateConfig), ("samples", SampleConfig),
                           ("task_filter", TaskFilterConfig)):
            if isinstance(getattr(self, name), dict):
                setattr(self, name, kind(**getattr(self, name)))
        for name in ("temperature", "top_p"):
            if getattr(self, name) != 1.0:
                raise ValueError(
                    f"rl.{name}={getattr(self, name)} is not supported: the trainer's importance ratio compares the "
                    "policy's own distribution (temperature 1, no top-p cut) with the recorded sampling logprobs, "
                    f"so RL rollouts must sample from it; use rl.{name}=1.0")

    @property
    def sampling(self) -> dict[str, Any]:
        """What every RL call is forced to (besides its seed)."""
        return {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens,
                **self.extra_sampling}

    @property
    def rows(self) -> SampleConfig:
        """The sample builder's settings for RL: the update's weighting, the calls of ``train`` rollouts only."""
        return dataclasses.replace(self.samples, weighting=self.update.weighting, include_modes=("train",))

    def schedule(self) -> dict[str, Any]:
        """The schedule as recorded in ``metrics.json`` (``rl.config``): every field but the nested parts."""
        return {k: v for k, v in asdict(self).items() if k not in NESTED}

    def with_steps_for(self, n_tasks: int) -> RLConfig:
        """This config with ``steps`` resolved: ``epochs`` passes over ``n_tasks`` at ``tasks_per_step`` a step,
        capped at ``steps`` (``epochs`` 0: as given)."""
        if self.epochs <= 0:
            return self
        return dataclasses.replace(self, steps=max(1, min(self.steps, math.ceil(self.epochs * n_tasks /
                                                                                  self.tasks_per_step))))


def rl_config(schedule: RLConfig, update: UpdateConfig | None = None, samples: SampleConfig | None = None,
              task_filter: TaskFilterConfig | None = None) -> RLConfig:
    """The Hydra groups ``rl`` (``schedule``), ``trainer``, ``samples`` and ``rl_filter`` as one :class:`RLConfig`."""
    parts = {"update": update, "samples": samples, "task_filter": task_filter}
    return dataclasses.replace(schedule, **{k: v for k, v in parts.items() if v is not None})
