"""The miniature's shared preparation and its arms: what ``mini_repro`` and ``loop_comparison`` both do.

:func:`prepared_miniature` loads the task sets, starts the harness, builds the recipe model, makes (or reuses)
the warm start and freezes the evaluation spec; :meth:`Miniature.evaluate_start` evaluates the warm start;
:func:`run_arm` is one arm: RL from the warm start with a loop (``loop=proxy``: the real harness through the
proxy; ``loop=rebuilt``: the trainer-owned loop), then the frozen evaluation in the real harness. An ablation is
an arm with other settings; the two loops differ only in the ``loop`` config group.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.common.accounting import Accountant
from repro.common.eta import expected
from repro.common.eta import record as record_rate
from repro.common.files import weights_sha256
from repro.common.tracking import tracked
from repro.evaluation import InstanceReport
from repro.evaluation.spec import EvalSpec
from repro.recipe.setup import Setup
from repro.recipe.warm_start import WarmStartConfig, WarmStartRun, warm_start
from repro.rl.checkpoints import stage_policy
from repro.rl.config import RLConfig
from repro.rl.evaluator import EvalConfig, Evaluator, build_spec, evaluate_or_refuse, refuse_if_all_infra
from repro.rl.loop import RLLoop
from repro.rl.rebuilt.harness import LoopConfig, rl_harness
from repro.rl.rollouts import GradeCache
from repro.tasks.distributions import TaskDistributionConfig
from repro.tasks.schema import Task
from repro.tasks.sets import load_task_set
from repro.tinymodel.recipe import build_recipe_model
from repro.train.sft import gate_note, planned_steps, sft_steps


@dataclass
class MiniatureConfig:
    """Everything the preparation needs: the setup, the train and held-out task sets, the frozen evaluation and the
    warm start."""

    setup: Setup
    train_tasks: TaskDistributionConfig
    tasks: TaskDistributionConfig
    eval: EvalConfig
    warm_start: WarmStartConfig


@dataclass
class Miniature:
    """A prepared miniature: task sets, the live harness and sandbox, the warm start and the frozen spec."""

    cfg: MiniatureConfig
    run_dir: Path
    acct: Accountant
    train_name: str
    test_list: list[Task]
    rl_tasks: list[Task]
    agent: Any
    box: Any  # LocalSandbox | DockerSandbox
    warm_dir: Path
    warm: dict[str, Any]
    spec: EvalSpec
    grades: GradeCache = field(default_factory=GradeCache)

    @property
    def operators(self) -> dict[str, str]:
        """Instance id -> mutation operator of the held-out tasks (habits are counted per operator)."""
        return {t.instance_id: t.operator for t in self.test_list}

    @property
    def warm_label(self) -> str:
        return f"warm-{self.warm['key']}"

    def evaluator(self, stack: Any, store_path: Path | None = None) -> Evaluator:
        """The frozen evaluation of the held-out tasks against ``stack``'s model (calls stored in ``store_path``,
        default: ``traces.sqlite`` beside the phase folder)."""
        return Evaluator(stack, self.agent, self.box, self.cfg.eval, spec=self.spec, store_path=store_path,
                         grades=self.grades)

    def evaluate_start(self) -> list[InstanceReport]:
        """The frozen evaluation of the warm start (``eval_before/``), the point every arm starts from."""
        samples = len(self.test_list) * self.cfg.eval.k
        print(f"phase eval_before: {len(self.test_list)} tasks x k={self.cfg.eval.k} in the real harness "
              f"({self.spec.label()}; {expected('eval_sample', samples)})", flush=True)
        started = time.monotonic()
        with self.cfg.setup.server(self.warm_dir, self.run_dir) as stack, self.acct.phase("eval_before"):
            evaluator = self.evaluator(stack)
            before = evaluator.evaluate(self.test_list, self.run_dir / "eval_before", self.warm_label).reports
        record_rate("eval_sample", evaluator.ran, time.monotonic() - started)
        refuse_if_all_infra(before, self.run_dir / "eval_before")
        return before


def miniature_phases(cfg: MiniatureConfig, arm: ArmConfig) -> list[tuple[str, str, float]]:
    """The phases of one arm of the miniature, ``(name, rate kind, units)``, for :func:`repro.common.eta.plan_text`
    (SFT steps counted as one row per demonstration, which ``prefix_merge`` gives; a gated schedule at its cap)."""
    ws, rl, flt = cfg.warm_start, arm.rl, arm.rl.task_filter
    samples = cfg.tasks.n_tasks * cfg.eval.k
    steps = sft_steps(ws.sft, ws.n_demo_tasks)
    gate = gate_note(ws.sft, steps)
    sft_units = planned_steps(ws.sft, ws.n_demo_tasks)
    phases = [("warm_start_demos", "demo", ws.n_demo_tasks),
              (f"warm_start_sft ({gate})" if gate else "warm_start_sft", "sft_step", sft_units),
              ("eval_before", "eval_sample", samples)]
    if flt.enabled:
        phases.append(("probe", "probe_sample", flt.pool * flt.k))
    phases += [(f"rl ({arm.loop.kind} loop)", f"rl_rollout_{arm.loop.kind}",
                rl.steps * rl.tasks_per_step * rl.samples_per_task), ("eval_after", "eval_sample", samples)]
    return phases


def split_train(tasks: list[Task], n_demo: int, rl_difficulty: str | None = None) -> tuple[list[Task], list[Task]]:
    """(demonstration tasks, RL tasks) of the train split; RL keeps only tasks of ``rl_difficulty`` when given (a
    train split that mixes difficulties is a curriculum for the warm start; RL trains on what is evaluated)."""
    rl = [t for t in tasks[n_demo:] if rl_difficulty is None or t.difficulty == rl_difficulty]
    if not rl:
        raise SystemExit(f"the train split has {len(tasks)} tasks but warm_start.n_demo_tasks={n_demo} leaves none "
                         f"for RL{f' of difficulty {rl_difficulty}' if rl_difficulty else ''}: raise "
                         "train_tasks.n_tasks")
    return tasks[:n_demo], rl


@contextlib.contextmanager
def prepared_miniature(cfg: MiniatureConfig, run_dir: Path) -> Iterator[Miniature]:
    """Set up everything the arms share; the harness and sandbox stay up until the block ends."""
    run_dir, acct, setup = Path(run_dir), Accountant(), cfg.setup
    print("phase setup: task sets, harness environment, recipe model", flush=True)
    with acct.phase("setup"):
        train_name, train_list = load_task_set(cfg.train_tasks)
        test_name, test_list = load_task_set(cfg.tasks)
        mixture = "+" in cfg.train_tasks.difficulty
        demo_tasks, rl_tasks = split_train(train_list, cfg.warm_start.n_demo_tasks,
                                           getattr(cfg.tasks, "difficulty", None) if mixture else None)
    with setup.harness_and_sandbox() as (agent, box):
        with acct.phase("setup"):
            # a pinned platform line (harness.platform) is one recipe token, the same on every machine
            pinned = bool(getattr(setup.harness, "platform", None))
            base_model = build_recipe_model(setup.model, agent, train_list, platform_line=pinned)
        warm_dir, warm = _warm_start(run_dir, base_model, demo_tasks, cfg, agent, box, acct)
        spec = build_spec(agent, test_name, test_list, setup.sandbox, cfg.eval, cfg.tasks.seed,
                          setup.served_model_name)
        yield Miniature(cfg, run_dir, acct, train_name, test_list, rl_tasks, agent, box, warm_dir, warm, spec)


def _warm_start(run_dir: Path, base_model: Path, demo_tasks: list[Task], cfg: MiniatureConfig, agent: Any,
                box: Any, acct: Accountant) -> tuple[Path, dict[str, Any]]:
    ws = cfg.warm_start
    print(f"phase warm_start: {len(demo_tasks)} expert demonstrations through the harness, then SFT "
          f"({ws.sft.epochs:g} epochs); reused when the cache holds one with the same inputs", flush=True)
    warm_dir, warm = warm_start(WarmStartRun(cfg.setup, agent, box, run_dir), base_model, demo_tasks, ws, acct)
    note = "reused from the cache" if warm["cached"] else f"built from {warm['demo_rollouts']} demonstrations"
    print(f"warm start {warm['key']}: {note}, weights sha256 {warm['weights_sha256'][:12]}", flush=True)
    return warm_dir, warm


@dataclass
class ArmConfig:
    """One arm: who runs the RL rollouts (``loop``: the real harness through the proxy, or the rebuilt loop) and the
    RL run (:class:`~repro.rl.config.RLConfig`: schedule, reward, update, rows, task filter)."""

    loop: LoopConfig
    rl: RLConfig


def run_arm(mini: Miniature, arm_dir: Path, arm: ArmConfig, label: str,
            acct: Accountant | None = None) -> dict[str, Any]:
    """RL from the warm start with ``arm.loop`` (weights in ``arm_dir/policy``), then the frozen evaluation in the
    real harness (``arm_dir/eval_after``); returns the reports, the RL history, the trained weights' sha256 and
    what it took (phases in ``acct``, else in the arm's own accountant)."""
    acct, started, rl = acct or Accountant(), time.time(), arm.rl
    policy = stage_policy(mini.warm_dir, arm_dir)
    rollouts = rl.steps * rl.tasks_per_step * rl.samples_per_task
    kind = f"rl_rollout_{arm.loop.kind}"
    print(f"phase rl ({arm.loop.kind} loop): {rl.steps} steps x {rl.tasks_per_step} tasks x {rl.samples_per_task} "
          f"samples ({expected(kind, rollouts)})", flush=True)
    with mini.cfg.setup.server(policy, arm_dir) as stack:
        rl_started = time.monotonic()
        with rl_harness(arm.loop, mini.agent, policy) as rl_agent, \
                tracked(mini.run_dir, mini.cfg.setup.tracking, label) as tracker:
            trainer = RLLoop(stack, rl_agent, mini.box, rl, arm_dir, tracker=tracker, accountant=acct,
                                grades=mini.grades, probe_harness=mini.agent)
            history = [s.record for s in trainer.fit(mini.rl_tasks)]
        record_rate(kind, rollouts, time.monotonic() - rl_started)
        samples = len(mini.test_list) * mini.cfg.eval.k
        print(f"phase eval_after ({arm.loop.kind} loop): {len(mini.test_list)} tasks x k={mini.cfg.eval.k} "
              f"({expected('eval_sample', samples)})", flush=True)
        with acct.phase("eval_after"):
            after = evaluate_or_refuse(mini.evaluator(stack), mini.test_list, arm_dir / "eval_after", label)
    return {"loop": arm.loop.kind, "after": after, "history": history, "probe": trainer.probe,
            "compute": acct.to_dict(), "wall_s": time.time() - started, "dir": arm_dir,
            "weights_sha256": weights_sha256(policy)}
