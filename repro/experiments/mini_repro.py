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
from pathlib import Path
from typing import Any

from repro.common.eta import plan_text
from repro.evaluation import write_metrics
from repro.evaluation.habits import slip_share
from repro.recipe.miniature import (
    ArmConfig,
    Miniature,
    MiniatureConfig,
    miniature_phases,
    prepared_miniature,
    run_arm,
)
from repro.recipe.paired_metrics import BeforeAfter
from repro.recipe.paired_metrics import before_after_metrics as record
from repro.recipe.warm_start import prompt_platform
from repro.report.before_after import run_markdown
from repro.report.run_records import with_run_files
from repro.rl.config import RLConfig
from repro.rl.rebuilt.harness import LoopConfig


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
    print(run_markdown([with_run_files(dict(metrics), run_dir)]), flush=True)  # its commit, as `repro table` has it
    return metrics


def before_after_metrics(mini: Miniature, before: list[Any], result: dict[str, Any], arm: ArmConfig,
                         started: float) -> dict[str, Any]:
    """The miniature's ``before_after`` record: the common one plus the slipped edits before and after and the
    prompts' platform line."""
    habits = {"before": slip_share(mini.run_dir / "traces.sqlite", before, mini.operators),
              "after": slip_share(result["dir"] / "traces.sqlite", result["after"], mini.operators)}
    return record(BeforeAfter(
        mini.cfg.eval, mini.spec, mini.run_dir, mini.train_name, before, result["after"],
        (mini.warm_label, f"rl-{mini.run_dir.name}"), (mini.warm["weights_sha256"], result["weights_sha256"]),
        mini.warm, arm.rl, result["history"], result["probe"], result["loop"], mini.acct.to_dict(), started,
        {"habits": habits, "platform": prompt_platform(mini.cfg.setup.harness)}))
