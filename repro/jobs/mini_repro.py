"""The CPU miniature of the reproduction: warm start -> frozen eval (before) -> RL with the proxy-based trainer ->
frozen eval (after, identical spec) -> a before/after table with a paired test and hours per phase.

Every rollout of every phase runs in the real, unmodified harness through the recording proxy; the trainer reads
the store. ``metrics.json`` (kind ``before_after``) holds both evaluations, the paired tests, the RL history and
the compute per phase; ``repro table`` turns runs of this kind into ``results/<experiment>.md``.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from harness_adapters.registry import get_harness
from repro.accounting import Accountant
from repro.evaluation import eval_metrics, write_metrics
from repro.evaluation.paired import mcnemar_exact, paired_bootstrap, sign_flip_test
from repro.jobs.evaluate import EvalConfig, build_spec, load_task_set, run_frozen_eval
from repro.jobs.rl_loop import RlLoop, RlPhaseConfig
from repro.jobs.rollouts import GradeCache
from repro.jobs.stack import CpuServingConfig, running_stack
from repro.jobs.warm_start import WarmStartConfig, warm_start
from repro.proxy import ProxyConfig
from repro.rebuilt.harness import LoopConfig, rl_harness
from repro.report.before_after import run_markdown
from repro.samples import SampleConfig
from repro.sandbox.local import LocalSandbox, LocalSandboxConfig
from repro.serving.recipe import build_recipe_model
from repro.serving.tiny_model import TinyModelConfig
from repro.tasks.distributions import TaskDistributionConfig
from repro.train.config import RlConfig
from repro.train.rl import PolicyTrainer


def per_instance(reports: list[Any]) -> dict[str, float]:
    """Each instance's share of resolved samples (infra failures count as unsolved)."""
    outcomes: dict[str, list[float]] = {}
    for r in reports:
        outcomes.setdefault(r.instance_id, []).append(float(r.outcome == "resolved"))
    return {k: sum(v) / len(v) for k, v in outcomes.items()}


def paired_tests(before: list[Any], after: list[Any]) -> dict[str, Any]:
    """Paired tests over instances: bootstrap interval and sign-flip test on per-instance means over the k samples,
    exact McNemar on sample 0 (the binary test; with k > 1 it ignores the other samples)."""
    a = {r.instance_id: r.outcome == "resolved" for r in before if r.sample == 0}
    b = {r.instance_id: r.outcome == "resolved" for r in after if r.sample == 0}
    mc = mcnemar_exact(a, b)
    mean_a, mean_b = per_instance(before), per_instance(after)
    boot, flip = paired_bootstrap(mean_a, mean_b), sign_flip_test(mean_a, mean_b)
    return {"n": mc.n, "only_before": mc.only_a, "only_after": mc.only_b, "mcnemar_p": mc.p_value,
            "delta": boot.diff, "delta_low": boot.low, "delta_high": boot.high, "bootstrap_p": boot.p_value,
            "sign_flip_p": flip.p_value}


def split_train(tasks: list[Any], n_demo: int) -> tuple[list[Any], list[Any]]:
    if len(tasks) <= n_demo:
        raise SystemExit(f"the train split has {len(tasks)} tasks but warm_start.n_demo_tasks={n_demo} leaves none "
                         "for RL: raise train_tasks.n_tasks")
    return tasks[:n_demo], tasks[n_demo:]


def stage_policy(warm_dir: Path, run_dir: Path) -> Path:
    """A private copy of the warm-start checkpoint that RL overwrites step by step (the cache stays intact)."""
    policy = run_dir / "policy"
    shutil.rmtree(policy, ignore_errors=True)
    shutil.copytree(warm_dir, policy, ignore=shutil.ignore_patterns("warm_start.json"))
    return policy


def mini_repro_job(model: TinyModelConfig, serving: CpuServingConfig, proxy: ProxyConfig, harness: Any,
                   harness_name: str, train_tasks: TaskDistributionConfig, tasks: TaskDistributionConfig,
                   sandbox: LocalSandboxConfig, eval: EvalConfig, warm_start: WarmStartConfig, rl: RlPhaseConfig,
                   trainer: RlConfig, samples: SampleConfig, run_dir: Path, harness_workers: int = 2,
                   loop: LoopConfig | None = None) -> dict[str, Any]:
    """Run the whole miniature; returns (and writes) its metrics. ``harness_workers``: long-lived harness
    processes sharing the rollouts (rollout throughput is bound by one process's GIL otherwise); ``loop``: who
    runs the RL rollouts (default: the real harness through the proxy)."""
    loop = loop or LoopConfig()
    logging.getLogger("httpx").setLevel(logging.WARNING)
    run_dir, started, acct = Path(run_dir), time.time(), Accountant()
    with acct.phase("setup"):
        train_name, train_list = load_task_set(train_tasks)
        test_name, test_list = load_task_set(tasks)
        demo_tasks, rl_tasks = split_train(train_list, warm_start.n_demo_tasks)
    with get_harness(harness_name, harness, workers=harness_workers) as agent:
        with acct.phase("setup"):
            base_model = build_recipe_model(model, agent, train_list)
        box = LocalSandbox(sandbox)
        try:
            warm_dir, warm = run_warm_start(run_dir, base_model, demo_tasks, warm_start, serving, proxy, agent, box,
                                            acct)
            spec = build_spec(agent.identity(), test_name, test_list, agent.cfg, sandbox, eval, tasks.seed,
                              serving.served_model_name)
            policy = stage_policy(warm_dir, run_dir)
            result = _before_rl_after(run_dir, spec, eval, test_list, rl_tasks, serving, proxy, agent, box, policy,
                                      rl, trainer, samples, warm, acct, loop)
        finally:
            box.close()
    metrics = _metrics(result, spec, eval, warm, train_name, rl, trainer, samples, acct, started, run_dir)
    write_metrics(run_dir, metrics)
    print(run_markdown([metrics]), flush=True)
    return metrics


def run_warm_start(run_dir: Path, base_model: Path, demo_tasks: list[Any], cfg: WarmStartConfig,
                serving: CpuServingConfig, proxy: ProxyConfig, agent: Any, box: LocalSandbox,
                acct: Accountant) -> tuple[Path, dict[str, Any]]:
    warm_dir, warm = warm_start(run_dir, base_model, demo_tasks, cfg, serving, proxy, agent, box, acct)
    note = "reused from the cache" if warm["cached"] else f"built from {warm['demo_rollouts']} demonstrations"
    print(f"warm start {warm['key']}: {note} ({warm_dir})", flush=True)
    return warm_dir, warm


def _before_rl_after(run_dir: Path, spec: Any, ev: EvalConfig, test_list: list[Any], rl_tasks: list[Any],
                     serving: CpuServingConfig, proxy: ProxyConfig, agent: Any, box: LocalSandbox, policy: Path,
                     rl: RlPhaseConfig, trainer_cfg: RlConfig, samples: SampleConfig, warm: dict[str, Any],
                     acct: Accountant, loop: LoopConfig) -> dict[str, Any]:
    store = run_dir / "traces.sqlite"
    grades = GradeCache()
    with running_stack(policy, serving, proxy, run_dir) as stack:
        with acct.phase("eval_before"):
            before, _ = run_frozen_eval(run_dir / "eval_before", store, spec, ev, test_list, stack, agent, box,
                                        f"warm-{warm['key']}", grades)
        trainer = PolicyTrainer(policy, trainer_cfg)
        sample_cfg = SampleConfig(**{**asdict(samples), "weighting": trainer_cfg.weighting,
                                     "include_modes": ("train",)})
        with rl_harness(loop, agent, policy) as rl_agent:
            history = RlLoop(run_dir, rl, trainer, sample_cfg, stack, rl_agent, box, policy).run(rl_tasks, acct)
        with acct.phase("eval_after"):
            after, _ = run_frozen_eval(run_dir / "eval_after", store, spec, ev, test_list, stack, agent, box,
                                       f"rl-{run_dir.name}", grades)
    return {"before": before, "after": after, "history": history, "loop": loop.kind}


def _metrics(result: dict[str, Any], spec: Any, ev: EvalConfig, warm: dict[str, Any], train_name: str,
             rl: RlPhaseConfig, trainer: RlConfig, samples: SampleConfig, acct: Accountant, started: float,
             run_dir: Path) -> dict[str, Any]:
    before = eval_metrics(result["before"], spec, ev.experiment, f"warm-{warm['key']}")
    after = eval_metrics(result["after"], spec, ev.experiment, f"rl-{run_dir.name}")
    return {
        "kind": "before_after", "experiment": ev.experiment, "table": ev.experiment, "run_dir": str(run_dir),
        "fingerprint": spec.fingerprint(), "eval_temperature": ev.temperature,
        "task_distribution": spec.tasks.name, "train_tasks": train_name,
        "before": before, "after": after, "paired": paired_tests(result["before"], result["after"]),
        "warm_start": warm, "rl": {"config": asdict(rl), "history": result["history"]},
        "trainer": asdict(trainer), "samples": {"mode": samples.mode, "weighting": trainer.weighting},
        "loop": result["loop"],
        "compute": acct.to_dict(), "started_at": started, "finished_at": time.time(),
        "wall_s": time.time() - started,
    }
