"""RL on a given checkpoint, the full-scale path (``experiment=agl_swebench_qwen35_9b``): frozen evaluation of the
base on the test set -> RL in the real harness through the proxy on the training file (the data pipeline's
``train.jsonl``), validated every ``validation.every_steps`` steps on held-out tasks -> frozen evaluation of the
final policy under the identical spec. No warm start: Agent Lightning starts RL from the released model.

The same job runs at toy size on CPU (the tiny model, bundled tasks, the CPU server, ``sandbox=local``), which is
how the tests exercise it; at full scale the stack is ``serving=vllm`` and ``sandbox=docker``. ``metrics.json``
has kind ``before_after`` (the table of ``repro table``) plus the validation points.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.common.accounting import Accountant
from repro.common.files import weights_sha256
from repro.common.tracking import tracked
from repro.evaluation import pass_at_1, write_metrics
from repro.recipe.memory_gate import memory_gate
from repro.recipe.paired_metrics import BeforeAfter, before_after_metrics
from repro.recipe.setup import Setup, eval_model
from repro.report.before_after import run_markdown
from repro.report.run_records import with_run_files
from repro.rl.checkpoints import stage_policy
from repro.rl.config import RLConfig
from repro.rl.evaluator import EvalConfig, Evaluator, build_spec, evaluate_or_refuse
from repro.rl.loop import RLLoop
from repro.rl.rollouts import GradeCache
from repro.serving.stack import verl_stack
from repro.tasks.schema import Task
from repro.tasks.sets import load_task_set
from repro.verl.config import VerlUpdateConfig


@dataclass
class RunData:
    """The task sets of a run (each a bundled distribution or a file): RL trains on ``train``, validation points
    are measured on ``validation``, the frozen evaluations before and after on ``test``."""

    train: Any
    validation: Any
    test: Any


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



def validation_eval(ev: EvalConfig, cfg: ValidationConfig) -> EvalConfig:
    return dataclasses.replace(ev, experiment=f"{ev.experiment}-validation", k=cfg.k, temperature=cfg.temperature,
                               max_tokens=cfg.max_tokens, concurrency=cfg.concurrency)


def validator(evaluator: Evaluator, run_dir: Path, tasks: list[Task]) -> Callable[[int], dict[str, Any]]:
    """The validation point of a step: Pass@1 of the current policy on the validation tasks."""
    def validate(step: int) -> dict[str, Any]:
        name, when = ("before_rl", "before RL") if step < 0 else (f"step_{step:03d}", f"after step {step + 1}")
        reports = evaluator.evaluate(tasks, run_dir / "validation" / name, f"policy-{name}").reports
        point = {"step": step, "pass_at_1": pass_at_1(reports), "n": len(reports),
                 "infra_failures": sum(r.infra_failure for r in reports)}
        print(f"validation {when}: Pass@1 {point['pass_at_1']:.1%} on {len(reports)} samples", flush=True)
        return point
    return validate


def start_verl_on_gpus(update: Any, eval: EvalConfig, run_dir: Path, mode: str = "sync") -> Any:
    """``trainer=verl`` on GPUs: verl's actor workers and their colocated vLLM replicas, placed by Ray on the
    run's private copy of the checkpoint (None for every other trainer: their server starts with the stack)."""
    if not (isinstance(update, VerlUpdateConfig) and update.on_gpus):
        return None
    if mode == "one_step_off":
        raise SystemExit("error: trainer=verl on GPUs colocates vLLM with the actor, and vLLM sleeps through each "
                         "update: rl.mode=one_step_off would sample from sleeping replicas; use rl.mode=sync")
    from repro.verl.policy import VerlPolicy  # starts verl's driver in verl's environment

    if not eval.checkpoint:
        raise SystemExit("error: trainer=verl on GPUs trains a transformers checkpoint: pass eval.checkpoint=DIR")
    policy = stage_policy(Path(eval.checkpoint).expanduser(), Path(run_dir))
    print(f"phase setup: verl's actor and vLLM replicas on {update.nnodes} x {update.n_gpus_per_node} GPUs "
          f"(placed by Ray{', cluster ' + update.ray_address if update.ray_address else ''})", flush=True)
    return VerlPolicy(policy, update)


def served(setup: Setup, verl: Any, policy: Path, run_dir: Path) -> contextlib.AbstractContextManager[Any]:
    """The stack the run samples from: the proxy in front of verl's replicas, or the configured server."""
    if verl is None:
        return setup.server(policy, run_dir)
    urls, name = verl.rollout_servers()
    return verl_stack(policy, urls, name, verl.sync_rollout, setup.proxy, run_dir)


def rl_run_job(setup: Setup, data: RunData, eval: EvalConfig, validation: ValidationConfig, rl: RLConfig,
               run_dir: Path, require_checkpoint: bool = False) -> dict[str, Any]:
    """Evaluate the base (``eval.checkpoint``, else the tiny model), RL with validation points, evaluate again.
    ``require_checkpoint``: refuse to fall back to the tiny model (the full-scale recipe)."""
    if require_checkpoint and not eval.checkpoint:
        raise SystemExit(f"error: experiment {eval.experiment} trains a released model: pass eval.checkpoint=DIR "
                         "(a transformers checkpoint directory, e.g. Qwen3.5-9B downloaded beforehand)")
    memory_gate(rl.update, setup.serving, eval.checkpoint)  # before anything loads: seconds, not hours
    verl = start_verl_on_gpus(rl.update, eval, run_dir, rl.mode)  # workers and replicas before any evaluation
    run_dir, started, acct = Path(run_dir), time.time(), Accountant()
    with acct.phase("setup"):
        train_name, train_list = load_task_set(data.train)
        _, val_list = load_task_set(data.validation)
        test_name, test_list = load_task_set(data.test)
    val_list = val_list[: validation.n_tasks] if validation.n_tasks > 0 else val_list
    rl = rl.with_steps_for(len(train_list))
    print(f"phase setup: {len(train_list)} train, {len(val_list)} validation, {len(test_list)} test tasks; "
          f"{rl.steps} RL steps of {rl.tasks_per_step} x {rl.samples_per_task}", flush=True)
    name = setup.served_model_name
    with setup.harness_and_sandbox() as (agent, box):
        base_dir, base_name = eval_model(setup.model, eval, train_list)
        spec = build_spec(agent, test_name, test_list, setup.sandbox, eval, getattr(data.test, "seed", None), name)
        val_ev = validation_eval(eval, validation)
        val_spec = build_spec(agent, "validation", val_list, setup.sandbox, val_ev, None, name)
        base_sha = weights_sha256(base_dir)
        policy = verl.model_dir if verl is not None else stage_policy(base_dir, run_dir)
        with served(setup, verl, policy, run_dir) as stack:
            grades = GradeCache()
            test = Evaluator(stack, agent, box, eval, spec=spec, grades=grades)
            before = _evaluate(test, "eval_before", test_list, base_name, run_dir, acct)
            val = Evaluator(stack, agent, box, val_ev, spec=val_spec, store_path=run_dir / "traces.sqlite",
                            grades=grades)
            validate = validator(val, run_dir, val_list) if validation.every_steps > 0 else None
            first = [validate(-1)] if validate is not None and validation.before_first_step else []
            print(f"phase rl: {rl.steps} steps x {rl.tasks_per_step} tasks x {rl.samples_per_task} samples",
                  flush=True)
            with tracked(run_dir, setup.tracking, f"rl-{run_dir.name}") as tracker:
                trainer = RLLoop(stack, agent, box, rl, run_dir, validate=validate,
                                    validate_every=validation.every_steps, tracker=tracker, accountant=acct,
                                    grades=grades, policy=verl)
                history = [s.record for s in trainer.fit(train_list)]
            after = _evaluate(test, "eval_after", test_list, f"rl-{run_dir.name}", run_dir, acct)
    metrics = before_after_metrics(BeforeAfter(
        eval, spec, run_dir, train_name, before, after, (base_name, f"rl-{run_dir.name}"),
        (base_sha, weights_sha256(policy)), {"key": base_name, "cached": True, "weights_sha256": base_sha}, rl,
        history, None, "proxy", acct.to_dict(), started,
        {"validation": first + [h["validation"] for h in history if "validation" in h]}))
    write_metrics(run_dir, metrics)
    print(run_markdown([with_run_files(dict(metrics), run_dir)]), flush=True)  # its commit, as `repro table` has it
    return metrics


def _evaluate(evaluator: Evaluator, phase: str, tasks: list[Task], label: str, run_dir: Path,
              acct: Accountant) -> list[Any]:
    ev = evaluator.cfg
    print(f"phase {phase}: {len(tasks)} tasks x k={ev.k} in the real harness ({evaluator.spec.label()})", flush=True)
    with acct.phase(phase):
        return evaluate_or_refuse(evaluator, tasks, run_dir / phase, label)
