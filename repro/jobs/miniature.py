"""The miniature's shared preparation and its arms: what ``mini_repro`` and ``loop_comparison`` both do.

:func:`prepared_miniature` loads the task sets, starts the harness, builds the recipe model, makes (or reuses)
the warm start and freezes the evaluation spec; :meth:`Miniature.evaluate_start` evaluates the warm start;
:func:`run_arm` is one arm: RL from the warm start with a loop (``loop=proxy``: the real harness through the
proxy; ``loop=rebuilt``: the trainer-owned loop), then the frozen evaluation in the real harness. An ablation is
an arm with other settings; the two loops differ only in the ``loop`` config group.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness_adapters.registry import get_harness
from repro.accounting import Accountant
from repro.console.eta import expected
from repro.console.eta import record as record_rate
from repro.evaluation import InstanceReport
from repro.evaluation.spec import EvalSpec
from repro.files import weights_sha256
from repro.jobs.evaluate import EvalConfig, build_spec, load_task_set, refuse_if_all_infra, run_frozen_eval
from repro.jobs.probe import filter_rl_tasks
from repro.jobs.rl_loop import CHECKPOINT, TRAINER_STATE, RlLoop, RlPhaseConfig
from repro.jobs.rollouts import GradeCache
from repro.jobs.stack import CpuServingConfig, running_stack
from repro.jobs.warm_start import WarmStartConfig, warm_start
from repro.proxy import ProxyConfig
from repro.rebuilt.harness import LoopConfig, rl_harness
from repro.samples import SampleConfig
from repro.sandbox.select import make_sandbox
from repro.tasks.distributions import TaskDistributionConfig
from repro.tasks.schema import Task
from repro.tinymodel.model import TinyModelConfig
from repro.tinymodel.recipe import build_recipe_model
from repro.tracking import TrackingConfig, tracked
from repro.train.config import RlConfig
from repro.train.rl import PolicyTrainer
from repro.train.task_filter import TaskFilterConfig


@dataclass
class MiniatureConfig:
    """Everything the preparation needs (the job functions pass their Hydra groups through)."""

    model: TinyModelConfig
    serving: CpuServingConfig
    proxy: ProxyConfig
    harness: Any
    harness_name: str
    train_tasks: TaskDistributionConfig
    tasks: TaskDistributionConfig
    sandbox: Any  # LocalSandboxConfig | DockerSandboxConfig
    eval: EvalConfig
    warm_start: WarmStartConfig
    harness_workers: int = 2
    tracking: TrackingConfig | None = None  # SFT's and RL's tracker (repro.tracking; None: none)


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

    def evaluate_start(self) -> list[InstanceReport]:
        """The frozen evaluation of the warm start (``eval_before/``), the point every arm starts from."""
        samples = len(self.test_list) * self.cfg.eval.k
        print(f"phase eval_before: {len(self.test_list)} tasks x k={self.cfg.eval.k} in the real harness "
              f"({self.spec.label()}; {expected('eval_sample', samples)})", flush=True)
        started = time.monotonic()
        with running_stack(self.warm_dir, self.cfg.serving, self.cfg.proxy, self.run_dir) as stack, \
                self.acct.phase("eval_before"):
            before, ran = run_frozen_eval(self.run_dir / "eval_before", self.run_dir / "traces.sqlite", self.spec,
                                          self.cfg.eval, self.test_list, stack, self.agent, self.box,
                                          self.warm_label, self.grades)
        record_rate("eval_sample", ran, time.monotonic() - started)
        refuse_if_all_infra(before, self.run_dir / "eval_before")
        return before


def miniature_phases(cfg: MiniatureConfig, arm: ArmConfig) -> list[tuple[str, str, float]]:
    """The phases of one arm of the miniature, ``(name, rate kind, units)``, for :func:`repro.console.eta.plan_text`
    (SFT steps counted as one row per demonstration, which ``prefix_merge`` gives; a gated schedule at its cap)."""
    from repro.train.sft import gate_note, planned_steps, sft_steps

    ws, rl, flt = cfg.warm_start, arm.rl, arm.task_filter
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


def stage_policy(warm_dir: Path, arm_dir: Path) -> Path:
    """A private copy of the warm-start checkpoint that RL overwrites step by step (the cache stays intact); an
    interrupted arm's copy (a step finished: ``rl/trainer_state.pt`` beside it) is kept, and RL resumes from it;
    with ``rl.checkpoint_every`` > 1 the policy comes back from the last checkpoint (``rl/checkpoint``)."""
    policy = arm_dir / "policy"
    if (arm_dir / "rl" / TRAINER_STATE).exists() and (policy / "config.json").exists():
        return policy
    checkpoint = arm_dir / "rl" / CHECKPOINT
    source = checkpoint if (checkpoint / TRAINER_STATE).exists() else warm_dir
    shutil.rmtree(policy, ignore_errors=True)
    shutil.copytree(source, policy, ignore=shutil.ignore_patterns("warm_start.json", TRAINER_STATE))
    return policy


@contextlib.contextmanager
def prepared_miniature(cfg: MiniatureConfig, run_dir: Path) -> Iterator[Miniature]:
    """Set up everything the arms share; the harness and sandbox stay up until the block ends."""
    run_dir, acct = Path(run_dir), Accountant()
    print("phase setup: task sets, harness environment, recipe model", flush=True)
    with acct.phase("setup"):
        train_name, train_list = load_task_set(cfg.train_tasks)
        test_name, test_list = load_task_set(cfg.tasks)
        mixture = "+" in cfg.train_tasks.difficulty
        demo_tasks, rl_tasks = split_train(train_list, cfg.warm_start.n_demo_tasks,
                                           getattr(cfg.tasks, "difficulty", None) if mixture else None)
    box = make_sandbox(cfg.sandbox)  # sandbox=local | docker
    try:
        with get_harness(cfg.harness_name, cfg.harness, workers=cfg.harness_workers) as agent:
            with acct.phase("setup"):
                # a pinned platform line (harness.platform) is one recipe token, the same on every machine
                pinned = bool(getattr(cfg.harness, "platform", None))
                base_model = build_recipe_model(cfg.model, agent, train_list, platform_line=pinned)
            warm_dir, warm = _warm_start(run_dir, base_model, demo_tasks, cfg, agent, box, acct)
            spec = build_spec(agent.identity(), test_name, test_list, agent.cfg, cfg.sandbox, cfg.eval,
                              cfg.tasks.seed, cfg.serving.served_model_name)
            yield Miniature(cfg, run_dir, acct, train_name, test_list, rl_tasks, agent, box, warm_dir, warm, spec)
    finally:
        box.close()


def _warm_start(run_dir: Path, base_model: Path, demo_tasks: list[Task], cfg: MiniatureConfig, agent: Any,
                box: Any, acct: Accountant) -> tuple[Path, dict[str, Any]]:
    ws = cfg.warm_start
    print(f"phase warm_start: {len(demo_tasks)} expert demonstrations through the harness, then SFT "
          f"({ws.sft.epochs:g} epochs); reused when the cache holds one with the same inputs", flush=True)
    warm_dir, warm = warm_start(run_dir, base_model, demo_tasks, ws, cfg.serving, cfg.proxy, agent, box, acct,
                                cfg.tracking)
    note = "reused from the cache" if warm["cached"] else f"built from {warm['demo_rollouts']} demonstrations"
    print(f"warm start {warm['key']}: {note}, weights sha256 {warm['weights_sha256'][:12]}", flush=True)
    return warm_dir, warm


@dataclass
class ArmConfig:
    """One arm: who runs the RL rollouts, the RL schedule, the trainer, the sample builder and the task filter."""

    loop: LoopConfig
    rl: RlPhaseConfig
    trainer: RlConfig
    samples: SampleConfig
    task_filter: TaskFilterConfig = field(default_factory=TaskFilterConfig)


def rl_task_pool(mini: Miniature, arm: ArmConfig, stack: Any, acct: Accountant, arm_dir: Path
                 ) -> tuple[list[Task], dict[str, Any] | None]:
    """The tasks RL draws from: every RL task, or (``task_filter.enabled``) those the probe step kept."""
    flt = arm.task_filter
    if not flt.enabled:
        return mini.rl_tasks, None
    candidates = mini.rl_tasks[: flt.pool] if flt.pool > 0 else mini.rl_tasks
    sampling = {"temperature": arm.rl.temperature, "top_p": arm.rl.top_p, "max_tokens": arm.rl.max_tokens}
    with acct.phase("probe"):
        return filter_rl_tasks(arm_dir, candidates, flt, sampling, mini.warm_dir, stack, mini.agent, mini.box,
                               mini.grades)


def run_arm(mini: Miniature, arm_dir: Path, arm: ArmConfig, label: str,
            acct: Accountant | None = None) -> dict[str, Any]:
    """RL from the warm start with ``arm.loop`` (weights in ``arm_dir/policy``), then the frozen evaluation in the
    real harness (``arm_dir/eval_after``); returns the reports, the RL history, the trained weights' sha256 and
    what it took (phases in ``acct``, else in the arm's own accountant)."""
    acct, started = acct or Accountant(), time.time()
    cfg = mini.cfg
    policy = stage_policy(mini.warm_dir, arm_dir)
    rl = arm.rl
    rollouts = rl.steps * rl.tasks_per_step * rl.samples_per_task
    kind = f"rl_rollout_{arm.loop.kind}"
    print(f"phase rl ({arm.loop.kind} loop): {rl.steps} steps x {rl.tasks_per_step} tasks x {rl.samples_per_task} "
          f"samples ({expected(kind, rollouts)})", flush=True)
    with running_stack(policy, cfg.serving, cfg.proxy, arm_dir) as stack:
        trainer = PolicyTrainer(policy, arm.trainer)
        sample_cfg = SampleConfig(**{**asdict(arm.samples), "weighting": arm.trainer.weighting,
                                     "include_modes": ("train",)})
        rl_tasks, probe = rl_task_pool(mini, arm, stack, acct, arm_dir)
        rl_started = time.monotonic()
        with rl_harness(arm.loop, mini.agent, policy) as rl_agent, \
                tracked(mini.run_dir, cfg.tracking, label) as tracker:
            history = RlLoop(arm_dir, rl, trainer, sample_cfg, stack, rl_agent, mini.box, policy,
                             tracker=tracker).run(rl_tasks, acct)
        record_rate(kind, rollouts, time.monotonic() - rl_started)
        samples = len(mini.test_list) * cfg.eval.k
        print(f"phase eval_after ({arm.loop.kind} loop): {len(mini.test_list)} tasks x k={cfg.eval.k} "
              f"({expected('eval_sample', samples)})", flush=True)
        with acct.phase("eval_after"):
            after, _ = run_frozen_eval(arm_dir / "eval_after", arm_dir / "traces.sqlite", mini.spec, cfg.eval,
                                       mini.test_list, stack, mini.agent, mini.box, label, mini.grades)
    refuse_if_all_infra(after, arm_dir / "eval_after")
    return {"loop": arm.loop.kind, "after": after, "history": history, "probe": probe, "compute": acct.to_dict(),
            "wall_s": time.time() - started, "dir": arm_dir, "weights_sha256": weights_sha256(policy)}
