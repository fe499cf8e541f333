"""``repro plan``: GPU-hours, wall time and cost of an experiment, estimated before anyone spends money.

The estimate multiplies what the composed config schedules (RL steps x tasks x samples, validation and test
evaluations, updates per batch) by per-rollout token counts and by throughputs measured on the GPU type
(``scripts/gpu_check.sh`` prints them; nothing here invents one). Every number that is an assumption is printed
with the estimate, so a reader can see what it rests on:

* generation: a rollout's sampled tokens over the aggregate generation throughput of the serving GPUs (vLLM,
  continuous batching; prompt tokens are assumed prefix-cached across a rollout's calls, so prefill is left out);
* training: a rollout's trained tokens (its whole context, once per update) over the training throughput
  (forward + backward tokens per second per GPU, times the training GPUs), ``updates_per_batch`` times a batch;
* RL steps are synchronous (generate, then train); evaluations run on the serving GPUs only.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class Throughput:
    """Measured on one GPU type (tokens per second per GPU) and its price."""

    gpu_type: str
    generation_tokens_per_s: float  # sampled tokens/s per GPU, many concurrent rollouts
    training_tokens_per_s: float  # forward+backward tokens/s per GPU on the policy
    price_per_gpu_hour: float = 0.0  # 0: no cost column


@dataclass
class RolloutShape:
    """A rollout's size (assumptions: measure them on a pilot run, `repro inspect`)."""

    sampled_tokens: float  # all completion tokens of a rollout
    context_tokens: float  # the final context of a rollout (prompt + completions), what one update trains on


@dataclass
class Schedule:
    """What the composed config runs."""

    rl_rollouts: int
    updates_per_batch: float  # passes over a step's rows (PPO mini-batches: the trained share of them)
    rl_steps: int
    validation_rollouts: int
    test_rollouts: int


@dataclass
class Plan:
    schedule: Schedule
    shape: RolloutShape
    throughput: Throughput
    gpus: int
    generation_gpu_h: float
    training_gpu_h: float
    evaluation_gpu_h: float
    wall_h: float

    @property
    def gpu_h(self) -> float:
        return self.generation_gpu_h + self.training_gpu_h + self.evaluation_gpu_h

    @property
    def cost(self) -> float:
        return self.gpu_h * self.throughput.price_per_gpu_hour


def schedule_of(cfg: Any, test_tasks: int | None = None) -> Schedule:
    """The rollouts a composed experiment config schedules (RL, its validation evaluations, the test evaluation);
    ``test_tasks``: the test set's size where the config reads it from a file (SWE-bench Verified: 500)."""
    rl, trainer, ev = cfg.get("rl"), cfg.get("trainer"), cfg.get("eval")
    steps = int(rl.steps) if rl is not None else 0
    per_step = int(rl.tasks_per_step) * int(rl.samples_per_task) if rl is not None else 0
    k = int(ev.k) if ev is not None else 1
    validation = cfg.get("validation")
    val_rollouts = 0
    if validation is not None and int(validation.get("every_steps", 0) or 0) > 0:
        val_rollouts = (steps // int(validation.every_steps)) * int(validation.n_tasks) * int(validation.get("k", 1))
    tasks = cfg.get("tasks")
    n_test = test_tasks if test_tasks is not None else int(tasks.get("n_tasks", 0) or 0) if tasks is not None else 0
    if not n_test:
        raise SystemExit("the test set's size is not in the config (its tasks come from a file): pass --test-tasks N "
                         "(SWE-bench Verified: 500)")
    evaluations = 2 if rl is not None else 1  # before and after RL
    return Schedule(steps * per_step, passes_per_batch(trainer, per_step), steps,
                    val_rollouts, evaluations * n_test * k)


def passes_per_batch(trainer: Any, rows: int) -> float:
    """How often a step's ``rows`` (one per rollout, as prefix merging gives) are trained: ``updates_per_batch``
    full passes, or with verl's PPO mini-batches (``ppo_mini_batch_rows`` M > 0) the share that fits in at most
    ``max_ppo_updates`` disjoint mini-batches of M rows, each row once. The rule is ``repro.train.batching.n_updates``,
    restated here: importing ``repro.train`` loads torch, which ``repro plan`` (the CLI's start-up) must not."""
    if trainer is None:
        return 1.0
    size = int(trainer.get("ppo_mini_batch_rows", 0) or 0)
    if size <= 0:
        return float(trainer.updates_per_batch)
    batches = rows // size
    cap = int(trainer.get("max_ppo_updates", 0) or 0)
    if cap > 0:
        batches = min(batches, cap)
    return batches * size / rows if rows else 0.0


def estimate(schedule: Schedule, shape: RolloutShape, throughput: Throughput, gpus: int) -> Plan:
    """GPU-hours per phase and wall-clock hours on ``gpus`` GPUs of ``throughput.gpu_type``."""
    if throughput.generation_tokens_per_s <= 0 or throughput.training_tokens_per_s <= 0 or gpus <= 0:
        raise ValueError("throughputs and the GPU count must be positive")
    gen_s = schedule.rl_rollouts * shape.sampled_tokens / (throughput.generation_tokens_per_s * gpus)
    train_s = (schedule.rl_rollouts * shape.context_tokens * schedule.updates_per_batch
               / (throughput.training_tokens_per_s * gpus))
    eval_s = ((schedule.validation_rollouts + schedule.test_rollouts) * shape.sampled_tokens
              / (throughput.generation_tokens_per_s * gpus))
    wall_h = (gen_s + train_s + eval_s) / 3600
    return Plan(schedule, shape, throughput, gpus, gen_s * gpus / 3600, train_s * gpus / 3600, eval_s * gpus / 3600,
                wall_h)


def render(plan: Plan, experiment: str) -> str:
    """The estimate and every assumption it rests on, as Markdown."""
    t, s = plan.throughput, plan.shape
    lines = [f"# Plan: {experiment} on {plan.gpus} x {t.gpu_type}", "",
             "| phase | GPU-h |", "| --- | --- |",
             f"| RL generation | {plan.generation_gpu_h:.1f} |", f"| RL training | {plan.training_gpu_h:.1f} |",
             f"| evaluations (validation + test) | {plan.evaluation_gpu_h:.1f} |",
             f"| **total** | **{plan.gpu_h:.1f}** |", "",
             f"Wall time: {plan.wall_h:.1f} h on {plan.gpus} GPUs (steps are synchronous: generate, then train)."]
    if t.price_per_gpu_hour:
        lines.append(f"Cost: {plan.cost:,.0f} at {t.price_per_gpu_hour:g} per GPU-hour.")
    lines += ["", "Assumptions:", *(f"- {key}: {value}" for key, value in
                                    {**asdict(plan.schedule), **asdict(s), **asdict(t)}.items()),
              "- prompt tokens prefix-cached across a rollout's calls (prefill left out); sandbox and grading time "
              "overlap with generation (not counted)"]
    return "\n".join(lines) + "\n"


def add_plan_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``plan`` on an argparse subparsers object."""
    parser = subparsers.add_parser("plan", help="estimate GPU-hours, wall time and cost of an experiment from "
                                                "measured throughputs (nothing runs)")
    parser.add_argument("overrides", nargs="*", help="the experiment and its overrides, as for `repro run`")
    # required unless only --memory is asked for (plan_command checks)
    parser.add_argument("--gpu-type", help="the GPU the throughputs were measured on")
    parser.add_argument("--gpus", type=int)
    parser.add_argument("--generation-tokens-per-s", type=float,
                        help="sampled tokens/s per GPU under many concurrent rollouts (scripts/gpu_check.sh)")
    parser.add_argument("--training-tokens-per-s", type=float,
                        help="trained (forward+backward) tokens/s per GPU (scripts/gpu_check.sh)")
    parser.add_argument("--sampled-tokens-per-rollout", type=float)
    parser.add_argument("--context-tokens-per-rollout", type=float)
    parser.add_argument("--price-per-gpu-hour", type=float, default=0.0)
    parser.add_argument("--test-tasks", type=int, default=None,
                        help="the test set's size when the config reads it from a file (SWE-bench Verified: 500)")
    parser.add_argument("--memory", action="append", metavar="LAYOUT", help="print the per-GPU memory plan of a named "
                        "layout (repro.verl.memory_plan.LAYOUTS; repeat or comma-separate); exit 1 if one does not fit")
    parser.add_argument("--model-config", metavar="PATH", help="a config.json for --memory (default: Qwen3.5-9B)")
    parser.set_defaults(func=plan_command, plan_parser=parser)
    return parser


THROUGHPUT_ARGS = ("gpu_type", "gpus", "generation_tokens_per_s", "training_tokens_per_s",
                   "sampled_tokens_per_rollout", "context_tokens_per_rollout")


def plan_command(args: argparse.Namespace) -> None:
    missing = [f"--{name.replace('_', '-')}" for name in THROUGHPUT_ARGS if getattr(args, name) is None]
    if missing and (not args.memory or len(missing) < len(THROUGHPUT_ARGS)):
        args.plan_parser.error(f"the following arguments are required: {', '.join(missing)}")
    fits = True
    if args.memory:
        from repro.verl.memory_plan import print_memory_plans

        fits = print_memory_plans(args.memory, args.model_config)
    if not missing:
        from repro.cli.runner import compose_config

        cfg = compose_config(args.overrides)
        throughput = Throughput(args.gpu_type, args.generation_tokens_per_s, args.training_tokens_per_s,
                                args.price_per_gpu_hour)
        shape = RolloutShape(args.sampled_tokens_per_rollout, args.context_tokens_per_rollout)
        print(render(estimate(schedule_of(cfg, args.test_tasks), shape, throughput, args.gpus), str(cfg.run.name)),
              end="")
    if not fits:
        raise SystemExit(1)
