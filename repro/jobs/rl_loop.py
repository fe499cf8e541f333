"""RL with the proxy-based trainer: each step runs GRPO groups of rollouts in the real harness (mode ``train``),
grades them, turns the recorded calls into rows (``repro.samples``), updates the policy (``repro.train``) and
pushes the new weights to the running model server before the next step's rollouts.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from repro.evaluation.summary import calls_histogram
from repro.jobs.rollouts import GradeCache, RolloutOptions, RolloutRunner
from repro.jobs.stack import Stack
from repro.samples import SampleConfig, build_rows
from repro.sandbox.local import LocalSandbox
from repro.seeding import rl_seed
from repro.store import open_store
from repro.tasks.schema import Task
from repro.tracking import Tracker
from repro.train.reward import RewardConfig
from repro.train.rl import PolicyTrainer
from repro.train.task_filter import MIXED, outcome_class, outcomes_by_task

TRAINER_STATE = "trainer_state.pt"
STEP_RECORD = "step_record.json"
POLICY_STEP = "rl_step.json"  # in the policy checkpoint: the RL step whose update its weights hold
RL_MODES = ("sync", "one_step_off")
DIAGNOSTICS_FILE = "rl/diagnostics.jsonl"  # one JSON line per finished RL step (step_diagnostics), whatever the tracker
CHECKPOINT = "checkpoint"  # rl/checkpoint/: weights + trainer state of the last resumable step (checkpoint_every > 1)


@dataclass
class RlPhaseConfig:
    """The RL schedule: steps x tasks per step x samples per task (one GRPO group per task). ``epochs`` > 0: as
    many steps as that many passes over the RL tasks take, capped at ``steps`` (``repro.jobs.rl_run``);
    ``checkpoint_every``: steps between resumable checkpoints (optimizer state; the weights are saved every step
    for the server to load); ``mode=one_step_off``: the next step's rollouts run during this step's update, so part
    of their calls are served by weights one update old (each call records its policy version)."""

    steps: int = 12
    mode: str = "sync"  # sync | one_step_off (next step's rollouts run during this step's update)
    epochs: float = 0.0
    checkpoint_every: int = 1
    tasks_per_step: int = 16
    samples_per_task: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 96
    concurrency: int = 16
    grading_threads: int = 2
    seed: int = 0
    reward: RewardConfig = field(default_factory=RewardConfig)  # which tests count, turn / prompt penalties
    extra_sampling: dict[str, Any] = field(default_factory=dict)  # e.g. chat_template_kwargs (thinking off)
    reshuffle_each_epoch: bool = False  # a new seeded order of the tasks every pass (verl's sampler); False: one

    def __post_init__(self) -> None:
        if self.mode not in RL_MODES:
            raise ValueError(f"rl.mode must be one of {RL_MODES}, got {self.mode!r}")
        if self.checkpoint_every < 1:
            raise ValueError(f"rl.checkpoint_every must be >= 1, got {self.checkpoint_every}")
        if isinstance(self.reward, dict):
            self.reward = RewardConfig(**self.reward)
        for name in ("temperature", "top_p"):
            if getattr(self, name) != 1.0:
                raise ValueError(
                    f"rl.{name}={getattr(self, name)} is not supported: the trainer's importance ratio compares the "
                    "policy's own distribution (temperature 1, no top-p cut) with the recorded sampling logprobs, "
                    f"so RL rollouts must sample from it; use rl.{name}=1.0")


def epoch_order(tasks: list[Task], seed: int, epoch: int) -> list[Task]:
    """The tasks in the seeded order of one pass (epoch 0: the order a single shuffle gives)."""
    order = list(tasks)
    random.Random(seed if epoch == 0 else f"{seed}:{epoch}").shuffle(order)
    return order


def step_tasks(tasks: list[Task], cfg: RlPhaseConfig, step: int) -> list[Task]:
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


def rollout_options(cfg: RlPhaseConfig, step: int, identity: dict[str, Any]) -> RolloutOptions:
    """Mode ``train``, the schedule's decoding, and a seed per (training seed, step, instance, sample)."""
    return RolloutOptions(
        mode="train", k=cfg.samples_per_task, seed_of=partial(rl_seed, cfg.seed, step),
        concurrency=cfg.concurrency,
        sampling={"temperature": cfg.temperature, "top_p": cfg.top_p, "max_tokens": cfg.max_tokens,
                  **cfg.extra_sampling},
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


class RlLoop:
    """Holds the trainer, the live stack and the harness across steps. ``validate`` (step -> record), when given,
    runs after every ``validate_every``-th step's update; its record goes into the step's. Each step's diagnostics
    (and validation) go to ``DIAGNOSTICS_FILE`` and to ``tracker`` (``repro.tracking``), when given."""

    def __init__(self, run_dir: Path, cfg: RlPhaseConfig, trainer: PolicyTrainer, samples: SampleConfig,
                 stack: Stack, agent: Any, box: LocalSandbox, policy_dir: Path,
                 validate: Callable[[int], dict[str, Any]] | None = None, validate_every: int = 0,
                 tracker: Tracker | None = None) -> None:
        self.run_dir, self.cfg, self.trainer, self.samples = Path(run_dir), cfg, trainer, samples
        self.stack, self.agent, self.box, self.policy_dir = stack, agent, box, Path(policy_dir)
        self.validate, self.validate_every = validate, validate_every
        self.tracker = tracker
        if cfg.mode == "one_step_off" and trainer.cfg.on_policy_log_ratio_max > 0:
            raise ValueError("rl.mode=one_step_off trains on calls sampled by weights one update old, so the first "
                             "update is not on policy: set trainer.on_policy_log_ratio_max=0 (the importance ratio "
                             "against the recorded logprobs still corrects for it)")
        self.grade_cache = GradeCache()
        self.store_path = self.run_dir / "traces.sqlite"

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / "rl" / CHECKPOINT

    @property
    def state_path(self) -> Path:
        if self.cfg.checkpoint_every > 1:
            return self.checkpoint_dir / TRAINER_STATE
        return self.run_dir / "rl" / TRAINER_STATE

    def _rewind_to_checkpoint(self) -> None:
        """Steps after the last checkpoint (all of them without one) are dropped: the weights that sampled their
        rollouts are gone; the policy came back from the checkpoint (or the start)."""
        marker = self.checkpoint_dir / POLICY_STEP
        kept = json.loads(marker.read_text())["step"] if marker.exists() else -1
        for step_dir in sorted((self.run_dir / "rl").glob("step_*")):
            if int(step_dir.name.split("_")[1]) > kept:
                shutil.rmtree(step_dir)

    def _checkpoint(self, step: int) -> None:
        """Make ``step`` resumable: the trainer state (every step with ``checkpoint_every`` 1, beside the weights
        saved for the server), or every ``checkpoint_every`` steps and at the end a copy of weights + state."""
        every = self.cfg.checkpoint_every
        if every <= 1:
            self.trainer.save_state(self.state_path)
            return
        if (step + 1) % every and step + 1 != self.cfg.steps:
            return
        tmp = self.checkpoint_dir.with_name(CHECKPOINT + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(self.policy_dir, tmp)
        self.trainer.save_state(tmp / TRAINER_STATE)
        shutil.rmtree(self.checkpoint_dir, ignore_errors=True)
        tmp.rename(self.checkpoint_dir)

    def completed_steps(self) -> list[dict[str, Any]]:
        """The records of the steps a previous, interrupted run of this arm finished (its weights are the policy's
        checkpoint and its optimizer state ``rl/trainer_state.pt``, both written after each step)."""
        if self.cfg.checkpoint_every > 1 and (self.run_dir / "rl").exists():
            self._rewind_to_checkpoint()
        if not self.state_path.exists():
            return []
        records = []
        for step in range(self.cfg.steps):
            path = self.run_dir / "rl" / f"step_{step:03d}" / STEP_RECORD
            if not path.exists():
                break
            records.append(json.loads(path.read_text()))
        marker = self.policy_dir / POLICY_STEP
        weights_step = json.loads(marker.read_text())["step"] if marker.exists() else -1
        if records and weights_step != len(records) - 1:
            raise SystemExit(f"cannot resume RL in {self.run_dir}: the policy's weights are from step "
                             f"{weights_step + 1} but the last finished step is {len(records)} (the run stopped "
                             "while saving); remove "
                             f"{self.run_dir / 'rl'} and {self.policy_dir} to restart this arm's RL")
        return records

    def _rewrite_diagnostics(self, history: list[dict[str, Any]]) -> None:
        path = self.run_dir / DIAGNOSTICS_FILE
        if history or path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(h["diagnostics"]) + "\n" for h in history))

    def run(self, tasks: list[Task], accountant: Any) -> list[dict[str, Any]]:
        history = self.completed_steps()
        self._rewrite_diagnostics(history)  # a step killed after its line was written is run again: one line each
        if history:
            self.trainer.load_state(self.state_path)
            print(f"rl: resuming after step {len(history)}/{self.cfg.steps} (weights and optimizer state of a "
                  "previous run of this arm)", flush=True)
        self.stack.set_policy_version(len(history))  # the served weights hold this many updates
        ahead = ThreadPoolExecutor(1, thread_name_prefix="rl-rollouts") if self.cfg.mode == "one_step_off" else None
        try:
            self._steps(history, tasks, accountant, ahead)
        finally:
            if ahead is not None:
                ahead.shutdown(wait=False, cancel_futures=True)
        return history

    def _steps(self, history: list[dict[str, Any]], tasks: list[Task], accountant: Any,
               ahead: ThreadPoolExecutor | None) -> None:
        """The remaining steps; with ``ahead`` (one_step_off) step s+1's rollouts run during step s's update."""
        pending = None
        for step in range(len(history), self.cfg.steps):
            if ahead is None:
                history.append(self.step(step, tasks, accountant))
            else:  # this step's rollouts (started during the last update), then the next step's during this update
                reports, rollout_s = (pending or ahead.submit(self.rollouts, step, tasks, accountant)).result()
                pending = ahead.submit(self.rollouts, step + 1, tasks, accountant) if step + 1 < self.cfg.steps \
                    else None
                history.append(self.train(step, reports, rollout_s, accountant))
            d = history[-1]["diagnostics"]
            print(f"rl step {step + 1}/{self.cfg.steps}: reward {d['reward_mean']:.3f}, mixed groups "
                  f"{d['mixed_group_share']:.0%}, clipped {d['clip_fraction']:.1%}, entropy {d['entropy']:.3f}, "
                  f"{d['calls_per_rollout']:.2f} calls/rollout, first |log ratio| {d['log_ratio_first_max']:.1e}; "
                  f"{d['rollout_s']:.0f}s rollouts + {d['update_s']:.0f}s update", flush=True)

    def step(self, step: int, tasks: list[Task], accountant: Any) -> dict[str, Any]:
        """One synchronous step: its rollouts, then the update on them."""
        return self.train(step, *self.rollouts(step, tasks, accountant), accountant)

    def rollouts(self, step: int, tasks: list[Task], accountant: Any) -> tuple[list[Any], float]:
        """The GRPO groups of ``step`` (its draw from ``tasks``) in the real harness; their reports and seconds."""
        tasks = step_tasks(tasks, self.cfg, step)
        started = time.perf_counter()
        with accountant.phase("rl_rollouts"):
            opts = rollout_options(self.cfg, step, self.agent.identity())
            runner = RolloutRunner(self.run_dir / "rl" / f"step_{step:03d}", self.store_path, opts, tasks, self.stack,
                                   self.agent, self.box, f"policy-step{step}", self.grade_cache)
            try:
                reports = runner.run(f"rl step {step + 1}/{self.cfg.steps}")
            finally:
                runner.close()
        return reports, time.perf_counter() - started

    def train(self, step: int, reports: list[Any], rollout_s: float, accountant: Any) -> dict[str, Any]:
        """The update on ``step``'s rollouts, the weights saved and synced, the step's record."""
        with accountant.phase("rl_training"):
            store = open_store(self.store_path)
            try:
                ids = [r.rollout_id for r in in_task_order(reports)]  # not completion order: a reproducible update
                samples, n_calls = build_rows(store, ids, self.samples), store.count_calls(ids)
                shaped = shaped_reward_mean(store, ids) if self.cfg.reward.shaped else None
                versions = store.policy_versions(ids)
            finally:
                store.close()
            update = self.trainer.update(samples.rows, self.trainer.plan(samples.rows))  # plan: None by default
            self.trainer.save(self.policy_dir)
            (self.policy_dir / POLICY_STEP).write_text(json.dumps({"step": step}))
            sync_s = self.stack.sync_weights(self.policy_dir, version=step + 1, scorer=self.trainer.score)
            checks = getattr(self.stack, "reload_checks", [])
        stats = group_stats(reports)
        if shaped is not None:  # the reward the trainer saw (the verdict's share stays as resolved_share)
            stats = {**stats, "resolved_share": stats["reward_mean"], "reward_mean": shaped}
        record = {"step": step, **stats, "samples": samples.stats(), "update": update,
                  "policy_versions": {str(v): n for v, n in versions.items()},
                  "stale_calls": sum(n for v, n in versions.items() if v is not None and v != step),
                  "rollout_s": rollout_s, "sync_s": sync_s,
                  "reload_check": asdict(checks[-1]) if checks else None, "grade_cache_hits": self.grade_cache.hits,
                  "calls": n_calls, "calls_histogram": calls_histogram([r.n_calls for r in reports])}
        record["diagnostics"] = step_diagnostics(record)
        if self.validate is not None and self.validate_every > 0 and (step + 1) % self.validate_every == 0:
            with accountant.phase("validation"):
                record["validation"] = self.validate(step)
        (self.run_dir / "rl").mkdir(parents=True, exist_ok=True)
        with (self.run_dir / DIAGNOSTICS_FILE).open("a") as out:
            out.write(json.dumps(record["diagnostics"]) + "\n")
        if self.tracker is not None:
            self.tracker.log(step, {**record["diagnostics"], "validation": record.get("validation", {})})
        self._checkpoint(step)  # with the weights saved above: the step is resumable from here
        step_dir = self.run_dir / "rl" / f"step_{step:03d}"
        step_dir.mkdir(parents=True, exist_ok=True)
        (step_dir / STEP_RECORD).write_text(json.dumps(record, default=str))
        return record
