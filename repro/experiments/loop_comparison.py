"""``experiment=loop_comparison``: RL through the real harness (``loop=proxy``) vs the trainer-owned rebuilt loop
(``loop=rebuilt``) on equal terms, and how faithful the rebuilt loop is.

Both arms start from the same warm-start checkpoint and train on the same tasks with the same seeds, schedule,
trainer and sample builder; only who runs the RL rollouts differs. Both final checkpoints are evaluated in the
**real** harness under one frozen spec (the evaluation of the shared starting point runs once). Fidelity: the
proxy arm's recorded rollouts are replayed through the rebuilt loop (:mod:`repro.rl.rebuilt.fidelity`), and so are
rollouts of other harness versions (e.g. mini-SWE-agent 1.x in text mode) recorded here with the warm-start model.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from repro.evaluation import write_metrics
from repro.recipe.loop_fidelity import FidelityConfig, comparison_metrics, fidelity_replays
from repro.recipe.miniature import ArmConfig, MiniatureConfig, prepared_miniature, run_arm
from repro.report.loop_comparison_table import comparison_markdown
from repro.report.run_records import with_run_files
from repro.rl.config import RLConfig
from repro.rl.rebuilt.harness import LoopConfig


def loop_comparison_job(miniature: MiniatureConfig, rl: RLConfig, fidelity: FidelityConfig, run_dir: Path,
                        loops: tuple[str, ...] = ("proxy", "rebuilt"), loop: Any = None) -> dict[str, Any]:
    """Run both arms and the fidelity replays; returns (and writes) the metrics (kind ``loop_comparison``).
    ``loop`` is mini_repro's single-arm setting, inherited by the config and unused: ``loops`` names the arms.
    Both arms keep the same RL tasks when the task filter is on (one probe, in the real harness, cached)."""
    run_dir, started = Path(run_dir), time.time()
    with prepared_miniature(miniature, run_dir) as mini:
        before = mini.evaluate_start()
        arms = {kind: run_arm(mini, run_dir / kind, ArmConfig(LoopConfig(kind), rl), f"rl-{kind}-{run_dir.name}")
                for kind in loops}
        print("phase fidelity: recorded real-harness rollouts replayed through the rebuilt loop", flush=True)
        with mini.acct.phase("fidelity"):
            fid = fidelity_replays(run_dir, arms, mini, fidelity)
    metrics = comparison_metrics(mini, before, arms, fid, rl, started)
    write_metrics(run_dir, metrics)
    print(comparison_markdown([with_run_files(dict(metrics), run_dir)]), flush=True)  # its commit too
    return metrics
