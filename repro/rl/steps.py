"""What one RL step is made of, as pure functions: which tasks it draws, how its rollouts are run (mode, seeds,
decoding), the order its rows are built in, and the diagnostics a reader checks per step."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from repro.common.seeding import rl_seed
from repro.rl.config import RLConfig
from repro.rl.rollouts import RolloutOptions
from repro.tasks.schema import Task
from repro.train.task_filter import MIXED, outcome_class, outcomes_by_task


def epoch_order(tasks: list[Task], seed: int, epoch: int) -> list[Task]:
    """The tasks in the seeded order of one pass (epoch 0: the order a single shuffle gives)."""
    order = list(tasks)
    random.Random(seed if epoch == 0 else f"{seed}:{epoch}").shuffle(order)
    return order


def step_tasks(tasks: list[Task], cfg: RLConfig, step: int) -> list[Task]:
    """The tasks of one step: consecutive slices of a seeded shuffle (each task once before any repeats); with
    ``reshuffle_each_epoch`` every pass has its own order, and a step across two passes takes the end of one and
    the start of the next, without taking a task twice."""
    n = max(1, len(tasks))
    start = step * cfg.tasks_per_step
    epoch, offset = divmod(start, n)
    if not cfg.reshuffle_each_epoch:
        order = epoch_order(tasks, cfg.seed, 0)
        return (order + order)[offset : offset + cfg.tasks_per_step][: len(order)]
    picked = epoch_order(tasks, cfg.seed, epoch)[offset : offset + cfg.tasks_per_step]
    ids = {id(t) for t in picked}
    rest = [t for t in epoch_order(tasks, cfg.seed, epoch + 1) if id(t) not in ids]
    return picked + rest[: cfg.tasks_per_step - len(picked)]


def rollout_options(cfg: RLConfig, step: int, identity: dict[str, Any]) -> RolloutOptions:
    """Mode ``train``, the schedule's decoding, and a seed per (training seed, step, instance, sample)."""
    return RolloutOptions(
        mode="train", k=cfg.samples_per_task, seed_of=partial(rl_seed, cfg.seed, step),
        concurrency=cfg.concurrency, sampling=cfg.sampling,
        grading_threads=cfg.grading_threads, write_preds=False, harness_name=identity.get("name", ""),
        harness_version=identity.get("version", ""), reward=cfg.reward,
    )


def in_task_order(reports: list[Any]) -> list[Any]:
    """A step's reports by (task, sample), whatever order the rollouts finished in: the rows, and so the trainer's
    seeded shuffle and micro-batches, are then the same on every machine."""
    return sorted(reports, key=lambda r: (r.instance_id, r.sample, r.rollout_id))


def group_stats(reports: list[Any]) -> dict[str, Any]:
    """Reward mean, and how many groups have mixed outcomes (the only ones GRPO learns from)."""
    by_task = outcomes_by_task(reports)
    rewards = [x for xs in by_task.values() for x in xs]
    return {"rollouts": len(reports), "infra_failures": sum(r.infra_failure for r in reports),
            "reward_mean": sum(rewards) / len(rewards) if rewards else 0.0, "groups": len(by_task),
            "mixed_groups": sum(1 for xs in by_task.values() if outcome_class(xs) == MIXED)}


def shaped_reward_mean(store: Any, rollout_ids: list[str]) -> float:
    """Mean recorded reward of the rollouts that have one (infrastructure failures have none)."""
    rewards = [r.reward for r in (store.get_rollout(i) for i in rollout_ids) if r is not None and r.reward is not None]
    return sum(rewards) / len(rewards) if rewards else 0.0


def step_diagnostics(record: dict[str, Any]) -> dict[str, Any]:
    """What a reader checks per RL step: reward, the share of groups GRPO can learn from (mixed outcomes), the
    clip fraction of the updates after the first (the first is on policy, ratio 1), the sampling policy's
    entropy on its sampled tokens, calls per rollout, and max |log ratio| of the first update (the on-policy
    check) and of all updates; the recorded-vs-trainer logprob mismatch before the update (max and mean over sampled
    tokens), the optimizer steps taken and whether the step was skipped (fewer rows than a PPO mini-batch)."""
    updates = record["update"]["updates"]
    mismatch = record["update"].get("old_logprob_mismatch", {})
    later = updates[1:] or updates
    first = updates[0] if updates else record["update"].get("measured", {})  # measured without an update
    return {
        "step": record["step"], "reward_mean": record["reward_mean"],
        "mixed_group_share": record["mixed_groups"] / record["groups"] if record["groups"] else 0.0,
        "clip_fraction": sum(u["clip_fraction"] for u in later) / len(later) if later else 0.0,
        "entropy": first.get("entropy", 0.0),
        "calls_per_rollout": record["calls"] / record["rollouts"] if record["rollouts"] else 0.0,
        "calls_histogram": record.get("calls_histogram", {}),
        "log_ratio_first_max": first.get("log_ratio_abs_max", 0.0),
        "log_ratio_max": max((u["log_ratio_abs_max"] for u in updates), default=0.0),
        "rows": record["update"]["rows"], "rows_trained": record["update"]["rows_trained"],
        "old_logprob_mismatch_max": mismatch.get("max", 0.0), "old_logprob_mismatch_mean": mismatch.get("mean", 0.0),
        "optimizer_steps": record["update"].get("optimizer_steps", len(updates)),
        "update_skipped": record["update"].get("update_skipped", not updates),
        "rollouts": record["rollouts"], "infra_failures": record["infra_failures"],
        "rollout_s": record["rollout_s"], "update_s": record["update"]["seconds"],
    }


@dataclass(frozen=True)
class StepDiagnostics:
    """What a reader checks per RL step (:func:`step_diagnostics`; one line of ``rl/diagnostics.jsonl``)."""

    step: int
    reward_mean: float
    mixed_group_share: float
    clip_fraction: float
    entropy: float
    calls_per_rollout: float
    log_ratio_first_max: float
    log_ratio_max: float
    rows: int
    rows_trained: int
    old_logprob_mismatch_max: float
    old_logprob_mismatch_mean: float
    optimizer_steps: int
    update_skipped: bool
    rollouts: int
    infra_failures: int
    rollout_s: float
    update_s: float
    calls_histogram: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StepRecord:
    """One finished RL step: its diagnostics, its validation point (when one ran after it) and the whole record as
    written to ``rl/step_NNN/step_record.json`` (``record``: samples, update, policy versions, timings)."""

    step: int
    diagnostics: StepDiagnostics
    validation: dict[str, Any] | None
    record: dict[str, Any]

    @property
    def reward_mean(self) -> float:
        return self.diagnostics.reward_mean

    @classmethod
    def of(cls, record: dict[str, Any]) -> StepRecord:
        """The typed view of a step's record (a fresh one, or one read back on resume)."""
        known = {f.name for f in dataclasses.fields(StepDiagnostics)}
        diagnostics = StepDiagnostics(**{k: v for k, v in record["diagnostics"].items() if k in known})
        return cls(record["step"], diagnostics, record.get("validation"), record)
