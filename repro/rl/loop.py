"""The RL loop on a running server (the trainer's advanced form): GRPO groups of rollouts in the real harness
through the recording proxy, graded, turned into rows from the stored calls, one policy update, the new weights
loaded into the running server, a checkpoint and the step's diagnostics; step after step, resumable.

    with running_stack(policy_dir, CpuServingConfig(), ProxyConfig(), run_dir) as server:
        history = RLLoop(server, harness, sandbox, RLConfig(steps=2), run_dir).fit(train_tasks)

:class:`~repro.rl.trainer.RLTrainer` stages the policy and runs the stack around it;
:class:`~repro.rl.evaluator.Evaluator` is its frozen-evaluation counterpart.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from repro.common.accounting import Accountant
from repro.common.files import weights_sha256
from repro.common.tracking import Tracker
from repro.evaluation.summary import calls_histogram
from repro.protocols import Harness, Sandbox
from repro.rl.checkpoints import RunState
from repro.rl.config import RLConfig
from repro.rl.rollouts import GradeCache, RolloutRunner
from repro.rl.steps import (
    StepRecord,
    group_stats,
    in_task_order,
    rollout_options,
    shaped_reward_mean,
    step_diagnostics,
    step_tasks,
)
from repro.rl.task_probe import filter_rl_tasks
from repro.serving.stack import Stack
from repro.store import open_store
from repro.tasks.schema import Task
from repro.train.reward import RewardFn
from repro.train.rl import PolicyTrainer
from repro.train.samples import build_rows
from repro.verl.config import VerlUpdateConfig

START_FILE = "rl/start.json"  # the starting weights' sha256 (the probe step's cache key on a resumed run)


def policy_trainer(policy_dir: Path, update: Any) -> Any:
    """repro's own trainer, or verl's actor for ``trainer=verl`` (:class:`repro.verl.policy.VerlPolicy`)."""
    if isinstance(update, VerlUpdateConfig):
        from repro.verl.policy import VerlPolicy  # starts verl's worker in verl's environment

        return VerlPolicy(policy_dir, update)
    return PolicyTrainer(policy_dir, update)


StepCallback = Callable[[StepRecord], None]  # called with each finished step's record


class RLLoop:
    """Trains the policy that ``server`` serves (its checkpoint folder, ``server.model_dir``, is overwritten after
    every step) with rollouts of ``harness`` in ``sandbox``; records under ``run_dir``.

    ``validate`` (step -> record), when given, runs after every ``validate_every``-th step's update and its record
    goes into the step's; each step's diagnostics go to ``rl/diagnostics.jsonl`` and to ``tracker``
    (:mod:`repro.common.tracking`); ``accountant`` times the phases (rollouts, training, probe, validation);
    ``grades`` shares graded patches with the run's evaluations; ``probe_harness``: the harness the task filter
    probes with (default ``harness``; an arm whose RL rollouts run in the rebuilt loop probes in the real one);
    ``policy``: the update, already built (verl's actor on GPUs, started before the run's evaluations; default:
    :func:`policy_trainer` of ``config.update``); ``reward_fn``: a reward hook (grade, rollout) -> reward
    (:mod:`repro.train.reward`; default: the verdict or ``config.reward``'s shaped reward); ``callbacks``: called with
    each finished step's :class:`~repro.rl.steps.StepRecord`."""

    def __init__(self, server: Stack, harness: Harness, sandbox: Sandbox, config: RLConfig, run_dir: Path, *,
                 validate: Callable[[int], dict[str, Any]] | None = None, validate_every: int = 0,
                 tracker: Tracker | None = None, accountant: Accountant | None = None,
                 grades: GradeCache | None = None, probe_harness: Harness | None = None,
                 policy: Any = None, reward_fn: RewardFn | None = None,
                 callbacks: Sequence[StepCallback] = ()) -> None:
        if config.mode == "one_step_off" and config.update.on_policy_log_ratio_max > 0:
            raise ValueError("rl.mode=one_step_off trains on calls sampled by weights one update old, so the first "
                             "update is not on policy: set trainer.on_policy_log_ratio_max=0 (the importance ratio "
                             "against the recorded logprobs still corrects for it)")
        self.server, self.harness, self.sandbox, self.cfg = server, harness, sandbox, config
        self.run_dir, self.policy_dir = Path(run_dir), Path(server.model_dir)
        self.validate, self.validate_every, self.tracker = validate, validate_every, tracker
        self.accountant = accountant or Accountant()
        self.grades = grades or GradeCache()
        self.probe_harness = probe_harness or harness
        self.state = RunState(self.run_dir, self.policy_dir, config.steps, config.checkpoint_every)
        self.policy = policy if policy is not None else policy_trainer(self.policy_dir, config.update)
        self.reward_fn, self.callbacks = reward_fn, tuple(callbacks)
        self.store_path = self.run_dir / "traces.sqlite"
        self.probe: dict[str, Any] | None = None  # the task filter's summary, after fit

    def fit(self, train_tasks: list[Task]) -> list[StepRecord]:
        """Run the remaining steps on ``train_tasks`` (after the task filter, when on); every step's record (those
        of a previous run of this folder first)."""
        history = self.state.completed_steps()
        tasks = self.select_tasks(train_tasks)
        self.state.rewrite_diagnostics(history)
        if history:
            self.policy.load_state(self.state.state_path)
            print(f"rl: resuming after step {len(history)}/{self.cfg.steps} (weights and optimizer state of a "
                  "previous run of this arm)", flush=True)
        self.server.set_policy_version(len(history))  # the served weights hold this many updates
        ahead = ThreadPoolExecutor(1, thread_name_prefix="rl-rollouts") if self.cfg.mode == "one_step_off" else None
        try:
            self._steps(history, tasks, ahead)
        finally:
            if ahead is not None:
                ahead.shutdown(wait=False, cancel_futures=True)
        return [StepRecord.of(record) for record in history]

    def _start_weights(self) -> str:
        """The sha256 of the weights RL started from (recorded on a fresh start, read back on a resumed one)."""
        path = self.run_dir / START_FILE
        if (self.run_dir / "rl" / "step_000").exists() and path.exists():
            return json.loads(path.read_text())["weights_sha256"]
        sha = weights_sha256(self.policy_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"weights_sha256": sha}))
        return sha

    def select_tasks(self, tasks: list[Task]) -> list[Task]:
        """The tasks RL draws from: all, or (``task_filter.enabled``) those the probe step keeps."""
        flt = self.cfg.task_filter
        if not flt.enabled:
            return tasks
        candidates = tasks[: flt.pool] if flt.pool > 0 else tasks
        sampling = self.cfg.sampling  # the probe samples as RL does
        start_sha = self._start_weights()  # the probe cache's key: hashed only when there is a probe
        with self.accountant.phase("probe"):
            kept, self.probe = filter_rl_tasks(self.run_dir, candidates, flt, sampling, start_sha, self.server,
                                               self.probe_harness, self.sandbox, self.grades)
        return kept

    def _steps(self, history: list[dict[str, Any]], tasks: list[Task], ahead: ThreadPoolExecutor | None) -> None:
        """The remaining steps; with ``ahead`` (one_step_off) step s+1's rollouts run during step s's update."""
        pending = None
        for step in range(len(history), self.cfg.steps):
            if ahead is None:
                history.append(self.step(step, tasks))
            else:  # this step's rollouts (started during the last update), then the next step's during this update
                reports, rollout_s = (pending or ahead.submit(self.rollouts, step, tasks)).result()
                pending = ahead.submit(self.rollouts, step + 1, tasks) if step + 1 < self.cfg.steps else None
                history.append(self.train(step, reports, rollout_s))
            d = history[-1]["diagnostics"]
            print(f"rl step {step + 1}/{self.cfg.steps}: reward {d['reward_mean']:.3f}, mixed groups "
                  f"{d['mixed_group_share']:.0%}, clipped {d['clip_fraction']:.1%}, entropy {d['entropy']:.3f}, "
                  f"{d['calls_per_rollout']:.2f} calls/rollout, first |log ratio| {d['log_ratio_first_max']:.1e}; "
                  f"{d['rollout_s']:.0f}s rollouts + {d['update_s']:.0f}s update", flush=True)

    def step(self, step: int, tasks: list[Task]) -> dict[str, Any]:
        """One synchronous step: its rollouts, then the update on them."""
        return self.train(step, *self.rollouts(step, tasks))

    def rollouts(self, step: int, tasks: list[Task]) -> tuple[list[Any], float]:
        """The GRPO groups of ``step`` (its draw from ``tasks``) in the real harness; their reports and seconds."""
        drawn = step_tasks(tasks, self.cfg, step)
        started = time.perf_counter()
        with self.accountant.phase("rl_rollouts"):
            opts = dataclasses.replace(rollout_options(self.cfg, step, self.harness.identity()),
                                       reward_fn=self.reward_fn)
            runner = RolloutRunner(self.state.step_dir(step), self.store_path, opts, drawn, self.server,
                                   self.harness, self.sandbox, f"policy-step{step}", self.grades)
            try:
                reports = runner.run(f"rl step {step + 1}/{self.cfg.steps}")
            finally:
                runner.close()
        return reports, time.perf_counter() - started

    def train(self, step: int, reports: list[Any], rollout_s: float) -> dict[str, Any]:
        """The update on ``step``'s rollouts, the weights saved and synced, the step's record."""
        with self.accountant.phase("rl_training"):
            rows, facts = self._rows(reports)
            update = self.policy.update(rows.rows, self.policy.plan(rows.rows))  # plan: None by default
            self.policy.save(self.policy_dir)
            self.state.mark_weights(step)
            sync_s = self.server.sync_weights(self.policy_dir, version=step + 1, scorer=self.policy.score)
        record = self._record(step, reports, rows, facts, update, rollout_s, sync_s)
        if self.validate is not None and self.validate_every > 0 and (step + 1) % self.validate_every == 0:
            with self.accountant.phase("validation"):
                record["validation"] = self.validate(step)
        self.state.append_diagnostics(record)
        if self.tracker is not None:
            self.tracker.log(step, {**record["diagnostics"], "validation": record.get("validation", {})})
        self.state.save(step, self.policy)  # with the weights saved above: the step is resumable from here
        self.state.write_step(step, record)
        for callback in self.callbacks:
            callback(StepRecord.of(record))
        return record

    def _rows(self, reports: list[Any]) -> tuple[Any, dict[str, Any]]:
        """The step's rows from the stored calls (in task order: a reproducible update) and what the store says
        about them (calls, shaped reward, policy versions)."""
        store = open_store(self.store_path)
        try:
            ids = [r.rollout_id for r in in_task_order(reports)]
            samples = build_rows(store, ids, self.cfg.rows)
            facts = {"calls": store.count_calls(ids), "versions": store.policy_versions(ids),
                     "shaped": shaped_reward_mean(store, ids) if self.cfg.reward.shaped or self.reward_fn else None}
        finally:
            store.close()
        return samples, facts

    def _record(self, step: int, reports: list[Any], samples: Any, facts: dict[str, Any], update: dict[str, Any],
                rollout_s: float, sync_s: float) -> dict[str, Any]:
        stats = group_stats(reports)
        if facts["shaped"] is not None:  # the reward the trainer saw (the verdict's share stays as resolved_share)
            stats = {**stats, "resolved_share": stats["reward_mean"], "reward_mean": facts["shaped"]}
        versions, checks = facts["versions"], self.server.reload_checks
        record = {"step": step, **stats, "samples": samples.stats(), "update": update,
                  "policy_versions": {str(v): n for v, n in versions.items()},
                  "stale_calls": sum(n for v, n in versions.items() if v is not None and v != step),
                  "rollout_s": rollout_s, "sync_s": sync_s,
                  "reload_check": asdict(checks[-1]) if checks else None, "grade_cache_hits": self.grades.hits,
                  "calls": facts["calls"], "calls_histogram": calls_histogram([r.n_calls for r in reports])}
        record["diagnostics"] = step_diagnostics(record)
        return record
