"""The CPU miniature of the reproduction: warm start -> frozen eval (before) -> RL with the proxy-based trainer ->
frozen eval (after, identical spec) -> a before/after table with a paired test, the minimum detectable effect and
hours per phase.

Every rollout of every phase runs in the real, unmodified harness through the recording proxy; the trainer reads
the store. ``metrics.json`` (kind ``before_after``) holds both evaluations, the paired tests, the RL history with
its per-step diagnostics, the weights' sha256 and the compute per phase; ``repro table`` turns runs of this kind
into ``results/<experiment>.md`` (one row per training seed and a pooled row per configuration).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from repro.console.eta import plan_text
from repro.evaluation import eval_metrics, write_metrics
from repro.evaluation.habits import slip_share
from repro.evaluation.paired import mcnemar_exact, paired_summary
from repro.jobs.evaluate import EvalConfig
from repro.jobs.miniature import (
    ArmConfig,
    Miniature,
    MiniatureConfig,
    miniature_phases,
    prepared_miniature,
    run_arm,
)
from repro.jobs.rl_loop import RlPhaseConfig
from repro.jobs.stack import CpuServingConfig
from repro.jobs.warm_start import WarmStartConfig, prompt_platform
from repro.proxy import ProxyConfig
from repro.rebuilt.harness import LoopConfig
from repro.report.before_after import run_markdown
from repro.samples import SampleConfig
from repro.sandbox.local import LocalSandboxConfig
from repro.tasks.distributions import TaskDistributionConfig
from repro.tinymodel.model import TinyModelConfig
from repro.tracking import TrackingConfig
from repro.train.config import RlConfig
from repro.train.task_filter import TaskFilterConfig


def per_instance(reports: list[Any]) -> dict[str, float]:
    """Each instance's share of resolved samples (infra failures count as unsolved)."""
    outcomes: dict[str, list[float]] = {}
    for r in reports:
        outcomes.setdefault(r.instance_id, []).append(float(r.outcome == "resolved"))
    return {k: sum(v) / len(v) for k, v in outcomes.items()}


def paired_tests(before: list[Any], after: list[Any]) -> dict[str, Any]:
    """Paired tests over instances: bootstrap interval, sign-flip test and minimum detectable effect (alpha 0.05,
    power 0.8) on per-instance means over the k samples; exact McNemar on sample 0 (the binary test; with k > 1
    it ignores the other samples)."""
    a = {r.instance_id: r.outcome == "resolved" for r in before if r.sample == 0}
    b = {r.instance_id: r.outcome == "resolved" for r in after if r.sample == 0}
    mc = mcnemar_exact(a, b)
    return {"only_before": mc.only_a, "only_after": mc.only_b, "mcnemar_p": mc.p_value,
            **paired_summary(per_instance(before), per_instance(after))}


def mini_repro_job(model: TinyModelConfig, serving: CpuServingConfig, proxy: ProxyConfig, harness: Any,
                   harness_name: str, train_tasks: TaskDistributionConfig, tasks: TaskDistributionConfig,
                   sandbox: LocalSandboxConfig, eval: EvalConfig, warm_start: WarmStartConfig, rl: RlPhaseConfig,
                   trainer: RlConfig, samples: SampleConfig, run_dir: Path, harness_workers: int = 2,
                   loop: LoopConfig | None = None, rl_filter: TaskFilterConfig | None = None,
                   tracking: TrackingConfig | None = None) -> dict[str, Any]:
    """Run the whole miniature; returns (and writes) its metrics. ``harness_workers``: long-lived harness
    processes sharing the rollouts (rollout throughput is bound by one process's GIL otherwise); ``loop``: who
    runs the RL rollouts (default: the real harness through the proxy); ``rl_filter``: the probe step that picks
    the RL tasks (off by default)."""
    logging.getLogger("httpx").setLevel(logging.WARNING)
    run_dir, started = Path(run_dir), time.time()
    cfg = MiniatureConfig(model, serving, proxy, harness, harness_name, train_tasks, tasks, sandbox, eval, warm_start,
                          harness_workers, tracking)
    arm = ArmConfig(loop or LoopConfig(), rl, trainer, samples, rl_filter or TaskFilterConfig())
    print(plan_text(miniature_phases(cfg, arm)), flush=True)
    with prepared_miniature(cfg, run_dir) as mini:
        before = mini.evaluate_start()
        result = run_arm(mini, run_dir, arm, f"rl-{run_dir.name}", mini.acct)
    metrics = before_after_metrics(mini, before, result, arm, started)
    write_metrics(run_dir, metrics)
    print(run_markdown([metrics]), flush=True)
    return metrics


def before_after_metrics(mini: Miniature, before: list[Any], result: dict[str, Any], arm: ArmConfig,
                         started: float) -> dict[str, Any]:
    """The ``before_after`` metrics.json of a run."""
    ev, spec, warm, run_dir = mini.cfg.eval, mini.spec, mini.warm, mini.run_dir
    return {
        "kind": "before_after", "experiment": ev.experiment, "table": ev.experiment, "run_dir": str(run_dir),
        "fingerprint": spec.fingerprint(), "eval_temperature": ev.temperature,
        "task_distribution": spec.tasks.name, "train_tasks": mini.train_name,
        "before": eval_metrics(before, spec, ev.experiment, mini.warm_label),
        "after": eval_metrics(result["after"], spec, ev.experiment, f"rl-{run_dir.name}"),
        "paired": paired_tests(before, result["after"]),
        "habits": {"before": slip_share(run_dir / "traces.sqlite", before, mini.operators),
                   "after": slip_share(result["dir"] / "traces.sqlite", result["after"], mini.operators)},
        "per_instance": {"before": per_instance(before), "after": per_instance(result["after"])},
        "weights_sha256": {"before": warm["weights_sha256"], "after": result["weights_sha256"]},
        "warm_start": warm, "rl": {"config": asdict(arm.rl), "history": result["history"]}, "probe": result["probe"],
        "diagnostics": [h["diagnostics"] for h in result["history"]],
        "trainer": asdict(arm.trainer), "samples": {"mode": arm.samples.mode, "weighting": arm.trainer.weighting},
        "loop": result["loop"], "seed": arm.rl.seed, "platform": prompt_platform(mini.cfg.harness),
        "compute": mini.acct.to_dict(), "started_at": started, "finished_at": time.time(),
        "wall_s": time.time() - started,
    }
