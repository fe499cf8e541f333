"""RL on a given checkpoint, the full-scale path (``experiment=agl_swebench_qwen35_9b``): frozen evaluation of the
base on the test set -> RL in the real harness through the proxy on the training file (the data pipeline's
``train.jsonl``), validated every ``validation.every_steps`` steps on held-out tasks -> frozen evaluation of the
final policy under the identical spec. No warm start: Agent Lightning starts RL from the released model.

The same job runs at toy size on CPU (the tiny model, bundled tasks, the CPU server, ``sandbox=local``), which is
how the tests exercise it; at full scale the stack is ``serving=vllm`` and ``sandbox=docker``. ``metrics.json``
has kind ``before_after`` (the table of ``repro table``) plus the validation points.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from repro.accounting import Accountant
from repro.evaluation import eval_metrics, write_metrics
from repro.fanout import FanoutConfig, harness_for
from repro.files import weights_sha256
from repro.jobs.evaluate import EvalConfig, build_spec, eval_model, load_task_set, refuse_if_all_infra, run_frozen_eval
from repro.jobs.mini_repro import paired_tests, per_instance
from repro.jobs.miniature import stage_policy
from repro.jobs.rl_loop import RlLoop, RlPhaseConfig
from repro.jobs.rollouts import GradeCache
from repro.jobs.stack import running_stack
from repro.report.before_after import run_markdown
from repro.samples import SampleConfig
from repro.sandbox.select import make_sandbox
from repro.tasks.schema import Task
from repro.tracking import Tracker, TrackingConfig, tracked
from repro.train.config import RlConfig
from repro.train.rl import PolicyTrainer


@dataclass
class ValidationConfig:
    """Frozen evaluations of the policy during RL on held-out tasks (``every_steps`` 0: none); choices are made
    on these points, never on the test set."""

    every_steps: int = 0
    n_tasks: int = 0  # the first n of the validation set (0: all)
    k: int = 1
    temperature: float = 1.0
    max_tokens: int = 256
    concurrency: int = 4
    before_first_step: bool = False  # also validate the starting policy before RL's first step (verl's
                                     # val_before_train); needs every_steps > 0



def resolved_steps(rl: RlPhaseConfig, n_tasks: int) -> int:
    """Steps to run: ``rl.epochs`` passes over ``n_tasks`` at ``rl.tasks_per_step`` a step, capped at
    ``rl.steps`` (``epochs`` 0: ``rl.steps`` as given)."""
    if rl.epochs <= 0:
        return rl.steps
    return max(1, min(rl.steps, math.ceil(rl.epochs * n_tasks / rl.tasks_per_step)))


def validation_eval(ev: EvalConfig, cfg: ValidationConfig) -> EvalConfig:
    return dataclasses.replace(ev, experiment=f"{ev.experiment}-validation", k=cfg.k, temperature=cfg.temperature,
                               max_tokens=cfg.max_tokens, concurrency=cfg.concurrency)


def pass_at_1(reports: list[Any]) -> float:
    return sum(r.outcome == "resolved" for r in reports) / len(reports) if reports else 0.0


@dataclass
class RunParts:
    """What the phases of one run share."""

    run_dir: Path
    agent: Any
    box: Any
    stack: Any
    grades: GradeCache


def validator(parts: RunParts, spec: Any, ev: EvalConfig, tasks: list[Task]) -> Callable[[int], dict[str, Any]]:
    """The validation point of a step: Pass@1 of the current policy on the validation tasks."""
    def validate(step: int) -> dict[str, Any]:
        name, when = ("before_rl", "before RL") if step < 0 else (f"step_{step:03d}", f"after step {step + 1}")
        reports, _ = run_frozen_eval(parts.run_dir / "validation" / name, parts.run_dir / "traces.sqlite",
                                     spec, ev, tasks, parts.stack, parts.agent, parts.box, f"policy-{name}",
                                     parts.grades)
        point = {"step": step, "pass_at_1": pass_at_1(reports), "n": len(reports),
                 "infra_failures": sum(r.infra_failure for r in reports)}
        print(f"validation {when}: Pass@1 {point['pass_at_1']:.1%} on {len(reports)} samples", flush=True)
        return point
    return validate


def rl_run_job(model: Any, serving: Any, proxy: Any, harness: Any, harness_name: str | None, train_tasks: Any,
               val_tasks: Any, tasks: Any, sandbox: Any, eval: EvalConfig, validation: ValidationConfig,
               rl: RlPhaseConfig, trainer: RlConfig, samples: SampleConfig, run_dir: Path,
               harness_workers: int = 1, fanout: FanoutConfig | None = None,
               require_checkpoint: bool = False, tracking: TrackingConfig | None = None) -> dict[str, Any]:
    """Evaluate the base (``eval.checkpoint``, else the tiny model), RL with validation points, evaluate again.
    ``require_checkpoint``: refuse to fall back to the tiny model (the full-scale recipe); ``tracking``: where
    each RL step's diagnostics and validation go besides ``rl/diagnostics.jsonl`` (``repro.tracking``)."""
    if require_checkpoint and not eval.checkpoint:
        raise SystemExit(f"error: experiment {eval.experiment} trains a released model: pass eval.checkpoint=DIR "
                         "(a transformers checkpoint directory, e.g. Qwen3.5-9B downloaded beforehand)")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    run_dir, started, acct = Path(run_dir), time.time(), Accountant()
    with acct.phase("setup"):
        train_name, train_list = load_task_set(train_tasks)
        _, val_list = load_task_set(val_tasks)
        test_name, test_list = load_task_set(tasks)
    val_list = val_list[: validation.n_tasks] if validation.n_tasks > 0 else val_list
    rl = dataclasses.replace(rl, steps=resolved_steps(rl, len(train_list)))
    print(f"phase setup: {len(train_list)} train, {len(val_list)} validation, {len(test_list)} test tasks; "
          f"{rl.steps} RL steps of {rl.tasks_per_step} x {rl.samples_per_task}", flush=True)
    box = make_sandbox(sandbox)
    try:
        with harness_for(harness_name, harness, sandbox, fanout, harness_workers) as agent:
            base_dir, base_name = eval_model(model, eval, train_list)
            spec = build_spec(agent.identity(), test_name, test_list, agent.cfg, sandbox, eval,
                              getattr(tasks, "seed", None), serving.served_model_name)
            val_ev = validation_eval(eval, validation)
            val_spec = build_spec(agent.identity(), "validation", val_list, agent.cfg, sandbox, val_ev, None,
                                  serving.served_model_name)
            base_sha, policy = weights_sha256(base_dir), stage_policy(base_dir, run_dir)
            with running_stack(policy, serving, proxy, run_dir) as stack:
                parts = RunParts(run_dir, agent, box, stack, GradeCache())
                before = _evaluate(parts, "eval_before", spec, eval, test_list, base_name, acct)
                validate = validator(parts, val_spec, val_ev, val_list) if validation.every_steps > 0 else None
                first = [validate(-1)] if validate is not None and validation.before_first_step else []
                with tracked(run_dir, tracking, f"rl-{run_dir.name}") as tracker:
                    history = _rl(parts, rl, trainer, samples, policy, train_list, acct, validate,
                                  validation.every_steps, tracker)
                after = _evaluate(parts, "eval_after", spec, eval, test_list, f"rl-{run_dir.name}", acct)
    finally:
        box.close()
    metrics = {
        "kind": "before_after", "experiment": eval.experiment, "table": eval.experiment, "run_dir": str(run_dir),
        "fingerprint": spec.fingerprint(), "eval_temperature": eval.temperature, "task_distribution": test_name,
        "train_tasks": train_name,
        "before": eval_metrics(before, spec, eval.experiment, base_name),
        "after": eval_metrics(after, spec, eval.experiment, f"rl-{run_dir.name}"),
        "paired": paired_tests(before, after),
        "per_instance": {"before": per_instance(before), "after": per_instance(after)},
        "weights_sha256": {"before": base_sha, "after": weights_sha256(policy)},
        "warm_start": {"key": base_name, "cached": True, "weights_sha256": base_sha},
        "rl": {"config": asdict(rl), "history": history}, "probe": None,
        "diagnostics": [h["diagnostics"] for h in history],
        "validation": first + [h["validation"] for h in history if "validation" in h],
        "trainer": asdict(trainer), "samples": {"mode": samples.mode, "weighting": trainer.weighting},
        "loop": "proxy", "seed": rl.seed, "compute": acct.to_dict(), "started_at": started,
        "finished_at": time.time(), "wall_s": time.time() - started,
    }
    write_metrics(run_dir, metrics)
    print(run_markdown([metrics]), flush=True)
    return metrics


def _evaluate(parts: RunParts, phase: str, spec: Any, ev: EvalConfig, tasks: list[Task], label: str,
              acct: Accountant) -> list[Any]:
    print(f"phase {phase}: {len(tasks)} tasks x k={ev.k} in the real harness ({spec.label()})", flush=True)
    with acct.phase(phase):
        reports, _ = run_frozen_eval(parts.run_dir / phase, parts.run_dir / "traces.sqlite", spec, ev, tasks,
                                     parts.stack, parts.agent, parts.box, label, parts.grades)
    refuse_if_all_infra(reports, parts.run_dir / phase)
    return reports


def _rl(parts: RunParts, rl: RlPhaseConfig, trainer_cfg: RlConfig, samples: SampleConfig, policy: Path,
        tasks: list[Task], acct: Accountant, validate: Callable[[int], dict[str, Any]] | None,
        every: int, tracker: Tracker | None = None) -> list[dict[str, Any]]:
    print(f"phase rl: {rl.steps} steps x {rl.tasks_per_step} tasks x {rl.samples_per_task} samples", flush=True)
    trainer = PolicyTrainer(policy, trainer_cfg)
    sample_cfg = SampleConfig(**{**asdict(samples), "weighting": trainer_cfg.weighting, "include_modes": ("train",)})
    loop = RlLoop(parts.run_dir, rl, trainer, sample_cfg, parts.stack, parts.agent, parts.box, policy,
                  validate=validate, validate_every=every, tracker=tracker)
    return loop.run(tasks, acct)
