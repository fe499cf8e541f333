"""``experiment=loop_comparison``: RL through the real harness (``loop=proxy``) vs the trainer-owned rebuilt loop
(``loop=rebuilt``) on equal terms, and how faithful the rebuilt loop is.

Both arms start from the same warm-start checkpoint and train on the same tasks with the same seeds, schedule,
trainer and sample builder; only who runs the RL rollouts differs. Both final checkpoints are evaluated in the
**real** harness under one frozen spec (the evaluation of the shared starting point runs once). Fidelity: the
proxy arm's recorded rollouts are replayed through the rebuilt loop (:mod:`repro.rebuilt.fidelity`), and so are
rollouts of other harness versions (e.g. mini-SWE-agent 1.x in text mode) recorded here with the warm-start model.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness_adapters.mini_swe_agent import MiniSweAgentConfig
from harness_adapters.registry import get_harness
from repro.accounting import Accountant
from repro.evaluation import eval_metrics, write_metrics
from repro.evaluation.paired import paired_bootstrap, sign_flip_test
from repro.jobs.evaluate import EvalConfig, build_spec, load_task_set, run_frozen_eval
from repro.jobs.mini_repro import paired_tests, per_instance, run_warm_start, split_train, stage_policy
from repro.jobs.rl_loop import RlLoop, RlPhaseConfig
from repro.jobs.rollouts import GradeCache, RolloutOptions, RolloutRunner
from repro.jobs.stack import CpuServingConfig, running_stack
from repro.jobs.warm_start import WarmStartConfig
from repro.proxy import ProxyConfig
from repro.rebuilt.fidelity import replay_rollout, summarize
from repro.rebuilt.harness import LoopConfig, loop_spec, rl_harness
from repro.report.loop_comparison import comparison_markdown
from repro.samples import SampleConfig
from repro.sandbox.local import LocalSandbox, LocalSandboxConfig
from repro.serving.recipe import build_recipe_model
from repro.serving.tiny_model import TinyModelConfig
from repro.store import open_store
from repro.tasks.distributions import TaskDistributionConfig
from repro.train.config import RlConfig
from repro.train.rl import PolicyTrainer


@dataclass
class FidelityConfig:
    """What to replay: up to ``max_rollouts`` recorded proxy-arm rollouts (multi-call ones first), and for each
    of ``other_versions`` of the harness, ``other_tasks`` held-out tasks recorded with the warm-start model."""

    max_rollouts: int = 64
    other_versions: list[str] = field(default_factory=lambda: ["1.17.5"])
    other_mode: str = "text"
    other_tasks: int = 8
    seed: int = 0


def loop_comparison_job(model: TinyModelConfig, serving: CpuServingConfig, proxy: ProxyConfig, harness: Any,
                        harness_name: str, train_tasks: TaskDistributionConfig, tasks: TaskDistributionConfig,
                        sandbox: LocalSandboxConfig, eval: EvalConfig, warm_start: WarmStartConfig,
                        rl: RlPhaseConfig, trainer: RlConfig, samples: SampleConfig, run_dir: Path,
                        fidelity: FidelityConfig, loops: tuple[str, ...] = ("proxy", "rebuilt"),
                        harness_workers: int = 2, loop: Any = None) -> dict[str, Any]:
    """Run both arms and the fidelity replays; returns (and writes) the metrics (kind ``loop_comparison``).
    ``loop`` is mini_repro's single-arm setting, inherited by the config and unused: ``loops`` names the arms."""
    logging.getLogger("httpx").setLevel(logging.WARNING)
    run_dir, started, acct = Path(run_dir), time.time(), Accountant()
    with acct.phase("setup"):
        train_name, train_list = load_task_set(train_tasks)
        test_name, test_list = load_task_set(tasks)
        demo_tasks, rl_tasks = split_train(train_list, warm_start.n_demo_tasks)
    box = LocalSandbox(sandbox)
    try:
        with get_harness(harness_name, harness, workers=harness_workers) as agent:
            with acct.phase("setup"):
                base_model = build_recipe_model(model, agent, train_list)
            warm_dir, warm = run_warm_start(run_dir, base_model, demo_tasks, warm_start, serving, proxy, agent, box,
                                            acct)
            spec = build_spec(agent.identity(), test_name, test_list, agent.cfg, sandbox, eval, tasks.seed,
                              serving.served_model_name)
            grades = GradeCache()
            with running_stack(warm_dir, serving, proxy, run_dir) as stack, acct.phase("eval_before"):
                before, _ = run_frozen_eval(run_dir / "eval_before", run_dir / "traces.sqlite", spec, eval,
                                            test_list, stack, agent, box, f"warm-{warm['key']}", grades)
            arms = {kind: _arm(run_dir / kind, LoopConfig(kind), warm_dir, spec, eval, test_list, rl_tasks, serving,
                               proxy, agent, box, rl, trainer, samples, grades) for kind in loops}
        with acct.phase("fidelity"):
            fid = _fidelity(run_dir, arms, harness, test_list, rl_tasks, warm_dir, serving, proxy, box, fidelity)
    finally:
        box.close()
    metrics = _metrics(run_dir, spec, eval, warm, train_name, before, arms, fid, rl, trainer, samples, acct,
                       started)
    write_metrics(run_dir, metrics)
    print(comparison_markdown([metrics]), flush=True)
    return metrics


def _arm(arm_dir: Path, loop: LoopConfig, warm_dir: Path, spec: Any, ev: EvalConfig, test_list: list[Any],
         rl_tasks: list[Any], serving: CpuServingConfig, proxy: ProxyConfig, agent: Any, box: LocalSandbox,
         rl: RlPhaseConfig, trainer_cfg: RlConfig, samples: SampleConfig, grades: GradeCache) -> dict[str, Any]:
    """One arm: RL from the warm start with ``loop``, then the frozen evaluation in the real harness."""
    acct, started = Accountant(), time.time()
    policy = stage_policy(warm_dir, arm_dir)
    with running_stack(policy, serving, proxy, arm_dir) as stack:
        trainer = PolicyTrainer(policy, trainer_cfg)
        sample_cfg = SampleConfig(**{**asdict(samples), "weighting": trainer_cfg.weighting,
                                     "include_modes": ("train",)})
        with rl_harness(loop, agent, policy) as rl_agent:
            history = RlLoop(arm_dir, rl, trainer, sample_cfg, stack, rl_agent, box, policy).run(rl_tasks, acct)
        with acct.phase("eval_after"):
            after, _ = run_frozen_eval(arm_dir / "eval_after", arm_dir / "traces.sqlite", spec, ev, test_list, stack,
                                       agent, box, f"rl-{loop.kind}-{arm_dir.parent.name}", grades)
    return {"loop": loop.kind, "after": after, "history": history, "compute": acct.to_dict(),
            "wall_s": time.time() - started, "dir": arm_dir}


def _fidelity(run_dir: Path, arms: dict[str, Any], harness: MiniSweAgentConfig, test_list: list[Any],
              rl_tasks: list[Any], warm_dir: Path, serving: CpuServingConfig, proxy: ProxyConfig,
              box: LocalSandbox, cfg: FidelityConfig) -> dict[str, Any]:
    """Replays through the rebuilt loop: the proxy arm's train rollouts, then each other harness version's
    (recorded on the first ``cfg.other_tasks`` held-out tasks)."""
    out: dict[str, Any] = {}
    tasks = {t.instance_id: t for t in [*test_list, *rl_tasks]}
    if "proxy" in arms:
        store_path = arms["proxy"]["dir"] / "traces.sqlite"
        out[harness.version] = _replay_store(store_path, tasks, harness, warm_dir, box, cfg, mode="train")
    for version in cfg.other_versions:
        other = MiniSweAgentConfig(**{**asdict(harness), "version": version, "mode": cfg.other_mode})
        try:
            store_path = _record_other(run_dir / f"harness_{version}", other, test_list[:cfg.other_tasks], warm_dir,
                                       serving, proxy, box)
        except Exception as exc:  # an optional comparison: say why it is missing instead of failing the run
            out[version] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        out[version] = _replay_store(store_path, tasks, harness, warm_dir, box, cfg, mode="eval")
    return out


def _record_other(phase_dir: Path, cfg: MiniSweAgentConfig, tasks: list[Any], model_dir: Path,
                  serving: CpuServingConfig, proxy: ProxyConfig, box: LocalSandbox) -> Path:
    """Rollouts of another harness version with the warm-start model (greedy), recorded in their own store."""
    phase_dir.mkdir(parents=True, exist_ok=True)
    with get_harness("mini-swe-agent", cfg, workers=1) as other, \
            running_stack(model_dir, serving, proxy, phase_dir) as stack:
        identity = other.identity()
        opts = RolloutOptions(mode="eval", k=1, sampling={"temperature": 0.0}, concurrency=4, write_preds=False,
                              harness_name=identity.get("name", ""), harness_version=identity.get("version", ""))
        runner = RolloutRunner(phase_dir, phase_dir / "traces.sqlite", opts, tasks, stack, other, box, "warm")
        try:
            runner.run(f"mini-swe-agent {cfg.version} rollouts")
        finally:
            runner.close()
    return phase_dir / "traces.sqlite"


def _replay_store(store_path: Path, tasks: dict[str, Any], harness: MiniSweAgentConfig, model_dir: Path,
                  box: LocalSandbox, cfg: FidelityConfig, mode: str) -> dict[str, Any]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    spec = loop_spec(harness, model_dir.parent / ".rebuilt-home")
    store = open_store(store_path)
    try:
        picked = _pick(store, tasks, mode, cfg)
        results = []
        for rollout in picked:
            task, calls = tasks[rollout.task_id], store.calls(rollout.rollout_id)
            workspace = box.workspace(task, f"replay-{rollout.rollout_id}")
            try:
                results.append(replay_rollout(calls, task.problem_statement, spec, tokenizer, workspace.path,
                                              rollout.rollout_id, rollout.harness_version))
            finally:
                workspace.cleanup()
    finally:
        store.close()
    return summarize(results) | {"replayed_from": mode}


def _pick(store: Any, tasks: dict[str, Any], mode: str, cfg: FidelityConfig) -> list[Any]:
    """Finished rollouts of ``mode`` whose task is known; every multi-call one first, then a seeded sample."""
    rollouts = [r for r in store.list_rollouts() if r.mode == mode and r.status == "finished" and r.task_id in tasks]
    calls = {r.rollout_id: store.count_calls([r.rollout_id]) for r in rollouts}
    multi = [r for r in rollouts if calls[r.rollout_id] > 1]
    single = [r for r in rollouts if calls[r.rollout_id] == 1]
    random.Random(cfg.seed).shuffle(single)
    return (multi + single)[:cfg.max_rollouts]


def _metrics(run_dir: Path, spec: Any, ev: EvalConfig, warm: dict[str, Any], train_name: str, before: list[Any],
             arms: dict[str, Any], fid: dict[str, Any], rl: RlPhaseConfig, trainer: RlConfig, samples: SampleConfig,
             acct: Accountant, started: float) -> dict[str, Any]:
    out_arms = {}
    for kind, arm in arms.items():
        out_arms[kind] = {
            "after": eval_metrics(arm["after"], spec, ev.experiment, f"rl-{kind}"),
            "paired_vs_before": paired_tests(before, arm["after"]),
            "history": arm["history"],
            "compute": arm["compute"], "wall_s": arm["wall_s"],
        }
    between = _between(arms) if {"proxy", "rebuilt"} <= set(arms) else None
    return {
        "kind": "loop_comparison", "experiment": ev.experiment, "table": ev.experiment, "run_dir": str(run_dir),
        "fingerprint": spec.fingerprint(), "eval_temperature": ev.temperature, "task_distribution": spec.tasks.name,
        "train_tasks": train_name, "before": eval_metrics(before, spec, ev.experiment, f"warm-{warm['key']}"),
        "arms": out_arms, "rebuilt_minus_proxy": between, "fidelity": fid, "warm_start": warm,
        "rl": asdict(rl), "trainer": asdict(trainer), "samples": {"mode": samples.mode, "weighting": trainer.weighting},
        "compute": acct.to_dict(), "started_at": started, "finished_at": time.time(), "wall_s": time.time() - started,
    }


def _between(arms: dict[str, Any]) -> dict[str, Any]:
    """Paired difference rebuilt - proxy over instances (per-instance means over the k samples)."""
    a, b = per_instance(arms["proxy"]["after"]), per_instance(arms["rebuilt"]["after"])
    boot, flip = paired_bootstrap(a, b), sign_flip_test(a, b)
    return {"n": boot.n, "delta": boot.diff, "delta_low": boot.low, "delta_high": boot.high,
            "sign_flip_p": flip.p_value}
