"""``experiment=context_training``: RL on rollouts that a harness's context management branches (issue 56).

One mixed warm start that acts in the harness (the matrix's preparation, :mod:`repro.recipe.matrix`), then a
served window small enough that the harness's context management acts: W = the warm start's longest first prompt
+ the forced ``max_tokens`` + ``window_steps`` x its median growth of the prompt a step, both measured with room on
``probe_tasks`` RL tasks (never the held-out ones), so that a typical rollout meets W at its third call. The warm
start and every arm are evaluated at W in the harness as configured (OpenHands: its condenser on). With ``window:
room`` the model keeps its own context and the harness compacts by its own count (OpenHands' ``condenser_max_size``
events), the probe's figures still recorded.

Each arm is RL from that warm start at W, one per (arm, RL seed): ``weighting`` (``rollout``: a rollout's rows
share one rollout's weight; ``fragment``: each row counts as an episode) and ``condenser`` (``none``: the harness
trains without its condenser, so a rollout that meets W ends ``context_exceeded``; evaluation keeps it on). Per
arm: Pass@1 at W paired against the warm start, and how its training rollouts branched (rows per rollout, refusals,
``context_exceeded``). ``budget_s`` stops starting arms past that many seconds (the record lists the arms left).
``metrics.json`` has kind ``context_training``; ``repro table`` publishes ``results/context_training.md``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness_adapters.registry import get_harness
from repro.common.accounting import Accountant
from repro.common.files import weights_sha256
from repro.common.tracking import tracked
from repro.evaluation import eval_metrics, write_metrics
from repro.recipe.context_stats import rollout_context, summarize
from repro.recipe.matrix import MatrixConfig, prepared_matrix
from repro.recipe.miniature import Miniature, MiniatureConfig
from repro.recipe.paired_metrics import paired_tests, per_instance
from repro.rl.checkpoints import stage_policy
from repro.rl.config import RLConfig
from repro.rl.evaluator import build_spec, evaluate_or_refuse
from repro.rl.loop import RLLoop
from repro.store import open_store

EXPERIMENT = "context_training"
CONDENSERS = ("summarizing", "none")
WINDOWS = ("probe", "room")


@dataclass
class ContextArm:
    """One training configuration: ``weighting`` (``rollout`` | ``fragment``) and the harness's ``condenser`` while
    training (``summarizing`` | ``none``)."""

    name: str
    weighting: str = "rollout"
    condenser: str = "summarizing"

    def __post_init__(self) -> None:
        if self.condenser not in CONDENSERS:
            raise ValueError(f"context arm {self.name!r}: condenser must be one of {CONDENSERS}, got "
                             f"{self.condenser!r}")


@dataclass
class ContextTrainingConfig:
    """``harness``: the matrix harness RL trains and evaluates in; ``arms`` x ``rl_seeds`` (run seed-major, so a
    budget cut leaves whole seeds); the window rule's ``probe_tasks`` and ``window_steps`` (``window``: ``probe``
    serves W, ``room`` the model's own context); ``overrides``: fields of the harness's config that the probe, the
    evaluations and RL use and its demonstrations do not (a frozen spec of its own); ``budget_s``: no arm
    starts after that many seconds of the run (0: no limit)."""

    harness: str = "openhands"
    arms: list[ContextArm] = field(default_factory=lambda: [ContextArm("rollout"), ContextArm("fragment",
                                                                                               "fragment")])
    rl_seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    probe_tasks: int = 16
    window_steps: float = 1.5
    window: str = "probe"  # probe: the rule above | room: the model's own context (compaction by the harness's count)
    overrides: dict[str, Any] = field(default_factory=dict)  # the harness's fields changed after the warm start
    budget_s: float = 0.0

    def __post_init__(self) -> None:
        self.arms = [a if isinstance(a, ContextArm) else ContextArm(**a) for a in self.arms]
        names = [a.name for a in self.arms]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"context.arms: need distinct arm names, got {names}")
        if self.probe_tasks < 2 or self.window_steps <= 0:
            raise ValueError("context.probe_tasks must be >= 2 and context.window_steps > 0")
        if self.window not in WINDOWS:
            raise ValueError(f"context.window must be one of {WINDOWS}, got {self.window!r}")


def prompt_lengths(store_path: Path, mode: str) -> list[list[int]]:
    """Each ``mode`` rollout's policy-call prompt lengths in order (answered calls only)."""
    store = open_store(store_path)
    try:
        return [[c.prompt_tokens for c in store.calls(r.rollout_id) if c.purpose == "policy" and c.prompt_tokens]
                for r in store.list_rollouts() if r.mode == mode]
    finally:
        store.close()


def probe_figures(lengths: list[list[int]]) -> dict[str, Any]:
    """The probe's longest first prompt, its median growth of the prompt a call (None: no rollout of two calls)
    and its calls a rollout."""
    growth = [(p[-1] - p[0]) / (len(p) - 1) for p in lengths if len(p) > 1]
    return {"first_prompt_max": max((p[0] for p in lengths if p), default=0),
            "step_growth_median": statistics.median(growth) if growth else None, "probe_rollouts": len(lengths),
            "probe_calls_mean": statistics.fmean(len(p) for p in lengths) if lengths else 0.0}


def window_rule(lengths: list[list[int]], max_tokens: int, steps: float) -> dict[str, Any]:
    """W = the longest first prompt + ``max_tokens`` + ``steps`` x the median growth of the prompt a step."""
    figures = probe_figures(lengths)
    step = figures["step_growth_median"]
    if step is None:
        raise RuntimeError("the window probe made no rollout of two calls: the warm start does not act in this "
                           "harness, so no window can be set from it")
    return figures | {"max_tokens": max_tokens, "window_steps": steps,
                      "window": int(figures["first_prompt_max"] + max_tokens + round(steps * step))}


def at_window(mini: Miniature, window: int | None) -> Miniature:
    """``mini`` served with a context of ``window`` tokens."""
    setup = mini.cfg.setup
    serving = dataclasses.replace(setup.serving, max_model_len=window)
    cfg = dataclasses.replace(mini.cfg, setup=dataclasses.replace(setup, serving=serving))
    return dataclasses.replace(mini, cfg=cfg)


def overridden(mini: Miniature, overrides: dict[str, Any], harnesses: contextlib.ExitStack) -> Miniature:
    """``mini`` with its harness's config changed by ``overrides`` (a harness of its own, its own frozen spec)."""
    if not overrides:
        return mini
    setup = mini.cfg.setup
    cfg = dataclasses.replace(setup.harness, **overrides)
    agent = harnesses.enter_context(get_harness(None, cfg, workers=2))
    spec = build_spec(agent, mini.spec.tasks.name, mini.test_list, setup.sandbox, mini.cfg.eval,
                      mini.cfg.tasks.seed, setup.served_model_name)
    return dataclasses.replace(mini, agent=agent, spec=spec,
                               cfg=dataclasses.replace(mini.cfg, setup=dataclasses.replace(setup, harness=cfg)))


def probe_window(mini: Miniature, cfg: ContextTrainingConfig, rl: RLConfig, folder: Path) -> dict[str, Any]:
    """The warm start with room on the first ``probe_tasks`` RL tasks; the window the rule gives (None with
    ``window: room``: the model's own context, the probe's figures kept)."""
    from repro.recipe.expert_runs import run_tasks

    folder.mkdir(parents=True, exist_ok=True)
    with mini.cfg.setup.server(mini.warm_dir, folder) as stack:
        run_tasks(mini.agent, stack, mini.rl_tasks[:cfg.probe_tasks], folder / "rollouts",
                  Path(stack.proxy.store_path), experiment=EXPERIMENT, max_tokens=rl.max_tokens,
                  concurrency=min(rl.concurrency, cfg.probe_tasks))
        store_path = Path(stack.proxy.store_path)
    lengths = prompt_lengths(store_path, "eval")
    if cfg.window == "room":
        return probe_figures(lengths) | {"max_tokens": rl.max_tokens, "rule": "room", "window": None}
    return window_rule(lengths, rl.max_tokens, cfg.window_steps) | {"rule": "probe"}


def context_of(store_path: Path, reports: list[Any]) -> dict[str, Any]:
    """How context management shaped ``reports``' rollouts (calls, rows, refusals, ``context_exceeded``)."""
    store = open_store(store_path)
    try:
        return summarize([rollout_context(store.calls(r.rollout_id), r) for r in reports])
    finally:
        store.close()


def training_context(store_path: Path) -> dict[str, Any]:
    """The arm's training rollouts: rows per rollout (prefix chains), refusals, and how many ended on one."""
    from repro.evaluation.reports import usage_from_store
    from repro.train.samples.rows import fragments

    store = open_store(store_path)
    try:
        train = [r.rollout_id for r in store.list_rollouts() if r.mode == "train"]
        rows = [len(fragments(store.calls(rid))[0]) for rid in train]
        usage = [usage_from_store(store, rid) for rid in train]
    finally:
        store.close()
    n = max(len(rows), 1)
    return {"rollouts": len(rows), "rows_mean": statistics.fmean(rows) if rows else 0.0,
            "rows_max": max(rows, default=0), "several_rows": sum(k > 1 for k in rows) / n,
            "refused": sum(u.context_refusals > 0 for u in usage) / n,
            "ended_on_refusal": sum(u.context_exceeded_seq is not None for u in usage) / n}


def arm_rl(rl: RLConfig, arm: ContextArm, seed: int) -> RLConfig:
    """The RL config of one arm and seed."""
    return dataclasses.replace(rl, seed=seed, update=dataclasses.replace(rl.update, weighting=arm.weighting,
                                                                          seed=seed))


def train_arm(train: Miniature, evaluated: Miniature, arm: ContextArm, seed: int, rl: RLConfig,
              run_dir: Path) -> dict[str, Any]:
    """RL from the warm start in ``train``'s harness at the window, then the policy evaluated in ``evaluated``'s."""
    name, started, acct = f"{arm.name}_s{seed}", time.time(), Accountant()
    arm_dir = run_dir / f"arm_{name}"
    policy, rl = stage_policy(train.warm_dir, arm_dir), arm_rl(rl, arm, seed)
    print(f"phase rl ({name}: weighting {arm.weighting}, condenser {arm.condenser}): {rl.steps} steps x "
          f"{rl.tasks_per_step} tasks x {rl.samples_per_task} samples", flush=True)
    with train.cfg.setup.server(policy, arm_dir) as stack:
        with tracked(run_dir, train.cfg.setup.tracking, f"rl-{name}") as tracker:
            trainer = RLLoop(stack, train.agent, train.box, rl, arm_dir, tracker=tracker, accountant=acct,
                             grades=train.grades, probe_harness=train.agent)
            history = [s.record for s in trainer.fit(train.rl_tasks)]
        store_path = Path(stack.proxy.store_path)
        with acct.phase("eval_after"):
            after = evaluate_or_refuse(evaluated.evaluator(stack, store_path), evaluated.test_list,
                                       arm_dir / "eval", f"rl-{name}")
    return {"arm": arm.name, "seed": seed, "weighting": arm.weighting, "condenser": arm.condenser,
            "after": eval_metrics(after, evaluated.spec, evaluated.cfg.eval.experiment, f"rl-{name}"),
            "per_instance": per_instance(after), "context": context_of(store_path, after),
            "training": training_context(store_path), "history": history,
            "diagnostics": [s["diagnostics"] for s in history], "weights_sha256": weights_sha256(policy),
            "compute": acct.to_dict(), "wall_s": time.time() - started, "_reports": after}


def context_training_job(miniature: MiniatureConfig, matrix: MatrixConfig, rl: RLConfig, run_dir: Path,
                         context: ContextTrainingConfig, fidelity: Any = None, loop: Any = None) -> dict[str, Any]:
    """The warm start, the window probe, the warm start at the window, then every arm x RL seed; writes and returns
    ``metrics.json`` (kind ``context_training``). ``fidelity`` and ``loop`` are the matrix's, unused."""
    run_dir, started = Path(run_dir), time.time()
    if context.harness not in matrix.harnesses:
        raise ValueError(f"context.harness {context.harness!r} is not among matrix.harnesses "
                         f"({sorted(matrix.harnesses)})")
    with prepared_matrix(miniature, matrix, run_dir) as prepared, contextlib.ExitStack() as harnesses:
        mini = overridden(prepared.minis[context.harness], context.overrides, harnesses)
        with prepared.acct.phase("window_probe"):
            window = probe_window(mini, context, rl, run_dir / "window_probe")
        print(f"window: {json.dumps(window)}", flush=True)
        evaluated = at_window(mini, window["window"])
        with evaluated.cfg.setup.server(mini.warm_dir, run_dir) as stack, prepared.acct.phase("eval_before"):
            store_path = Path(stack.proxy.store_path)
            warm = evaluate_or_refuse(evaluated.evaluator(stack, store_path), evaluated.test_list,
                                      run_dir / "eval_before", mini.warm_label)
            warm_context = context_of(store_path, warm)
        arms, skipped = run_arms(mini, evaluated, context, rl, run_dir, started)
    metrics = context_metrics(evaluated, prepared.acct, window, warm, warm_context, arms, skipped, context, rl,
                              started)
    write_metrics(run_dir, metrics)
    return metrics


def run_arms(mini: Miniature, evaluated: Miniature, context: ContextTrainingConfig, rl: RLConfig, run_dir: Path,
             started: float) -> tuple[list[dict[str, Any]], list[str]]:
    """Every arm x RL seed, seed-major; those not started within ``budget_s`` are returned by name."""
    harness_cfg = mini.cfg.setup.harness
    done, skipped = [], []
    for seed in context.rl_seeds:
        for arm in context.arms:
            if context.budget_s and time.time() - started > context.budget_s:
                skipped.append(f"{arm.name}_s{seed}")
                continue
            if arm.condenser == getattr(harness_cfg, "condenser", arm.condenser):
                done.append(train_arm(evaluated, evaluated, arm, seed, rl, run_dir))
                continue
            other = dataclasses.replace(harness_cfg, condenser=arm.condenser)
            with get_harness(None, other, workers=2) as agent:
                done.append(train_arm(dataclasses.replace(evaluated, agent=agent), evaluated, arm, seed, rl, run_dir))
    return done, skipped


def context_metrics(evaluated: Miniature, acct: Accountant, window: dict[str, Any], warm: list[Any],
                    warm_context: dict[str, Any], arms: list[dict[str, Any]], skipped: list[str],
                    context: ContextTrainingConfig, rl: RLConfig, started: float) -> dict[str, Any]:
    """The ``context_training`` record: the window, the warm start and every arm at it, each paired against it."""
    ev, spec = evaluated.cfg.eval, evaluated.spec
    out_arms = [{k: v for k, v in a.items() if k != "_reports"} | {"paired_vs_warm": paired_tests(warm, a["_reports"])}
                for a in arms]
    return {"kind": EXPERIMENT, "experiment": EXPERIMENT, "table": EXPERIMENT, "run_dir": str(evaluated.run_dir),
            "fingerprint": spec.fingerprint(), "harness": spec.harness.name + "@" + spec.harness.version,
            "task_distribution": spec.tasks.name, "train_tasks": evaluated.train_name,
            "eval_temperature": ev.temperature, "window": window, "context": dataclasses.asdict(context),
            "warm_start": evaluated.warm, "warm": eval_metrics(warm, spec, ev.experiment, evaluated.warm_label),
            "warm_per_instance": per_instance(warm), "warm_context": warm_context, "arms": out_arms,
            "skipped_for_budget": skipped, "seed": rl.seed, "rl": rl.schedule(),
            "trainer": dataclasses.asdict(rl.update), "compute": acct.to_dict(), "started_at": started,
            "finished_at": time.time(), "wall_s": time.time() - started}
