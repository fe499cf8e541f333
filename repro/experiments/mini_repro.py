"""The CPU miniature of the reproduction: warm start -> frozen eval (before) -> RL with the proxy-based trainer ->
frozen eval (after, identical spec) -> a before/after table with a paired test, the minimum detectable effect and
hours per phase.

Every rollout of every phase runs in the real, unmodified harness through the recording proxy; the trainer reads
the store. ``metrics.json`` (kind ``before_after``) holds both evaluations, the paired tests, the RL history with
its per-step diagnostics, the weights' sha256 and the compute per phase; ``repro table`` turns runs of this kind
into ``results/<experiment>.md`` (one row per training seed and a pooled row per configuration).
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from repro.console.eta import plan_text
from repro.evaluation import eval_metrics, write_metrics
from repro.evaluation.habits import slip_share
from repro.evaluation.paired import mcnemar_exact, paired_summary
from repro.experiments.miniature import (
    ArmConfig,
    Miniature,
    MiniatureConfig,
    miniature_phases,
    prepared_miniature,
    run_arm,
)
from repro.experiments.warm_start import prompt_platform
from repro.rebuilt.harness import LoopConfig
from repro.report.before_after import run_markdown
from repro.rl.config import RLConfig


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


def mini_repro_job(miniature: MiniatureConfig, rl: RLConfig, run_dir: Path,
                   loop: LoopConfig | None = None) -> dict[str, Any]:
    """Run the whole miniature; returns (and writes) its metrics. ``loop``: who runs the RL rollouts (default: the
    real harness through the proxy)."""
    run_dir, started = Path(run_dir), time.time()
    arm = ArmConfig(loop or LoopConfig(), rl)
    print(plan_text(miniature_phases(miniature, arm)), flush=True)
    with prepared_miniature(miniature, run_dir) as mini:
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
        "warm_start": warm, "rl": {"config": arm.rl.schedule(), "history": result["history"]},
        "probe": result["probe"], "diagnostics": [h["diagnostics"] for h in result["history"]],
        "trainer": asdict(arm.rl.update),
        "samples": {"mode": arm.rl.samples.mode, "weighting": arm.rl.update.weighting},
        "loop": result["loop"], "seed": arm.rl.seed, "platform": prompt_platform(mini.cfg.setup.harness),
        "compute": mini.acct.to_dict(), "started_at": started, "finished_at": time.time(),
        "wall_s": time.time() - started,
    }
