"""What one rollout costs in each harness and launcher: CPU seconds and wall seconds, the harness run unchanged.

Every arm is the same job: the scripted expert (the real CPU server started with the tasks, ``expert_tasks``, as
warm starts record demonstrations) solves the same bundled ``locate`` tasks through the harness and the real proxy,
graded by the real grader, one rollout at a time, so a rollout's CPU is what the whole process tree spent while
it ran: the harness's processes, the proxy, the grader, the orchestration (``harness side``) and the model server
(apart: the expert answers without a model's prefill, so this is the harness's cost, not the tiny model's).
Before the measured rollouts each arm runs ``warmup`` rollouts on other tasks: long-lived launchers (the 2.4.6
worker pool, the fork servers, ``opencode serve``) start there, and their start-up (the warm-up's harness-side
cost less that many measured rollouts') is reported apart.

``repro run experiment=bench_harnesses`` writes ``metrics.json`` (kind ``harness_bench``); ``repro table``
publishes ``results/bench_harnesses.md``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from repro.common.accounting import process_tree_cpu_s, tree_cpu_seconds
from repro.recipe.expert_runs import expert_stack, locate_tasks, run_tasks

EXPERIMENT = "bench_harnesses"
ARMS = [  # label, registry name, config overrides
    {"label": "mini-SWE-agent 2.4.6 (worker pool)", "harness": "mini_swe_agent", "config": {}},
]


@dataclass
class HarnessBenchConfig:
    """``arms``: each {label, harness (registry name), config (overrides of its defaults), kwargs (the adapter's
    constructor's, e.g. mini-SWE-agent 1.x's ``launcher``)}; ``rollouts`` measured
    and ``warmup`` unmeasured rollouts per arm (on other tasks), one at a time; ``task_seed``: the tasks' seed."""

    arms: list[dict[str, Any]] = field(default_factory=lambda: list(ARMS))
    rollouts: int = 8
    warmup: int = 1
    task_seed: int = 0
    max_tokens: int = 256


def measure_arm(arm: dict[str, Any], stack: Any, tasks: list[Any], folder: Path, store: Path,
                cfg: HarnessBenchConfig) -> dict[str, Any]:
    """One arm: its warm-up, then its measured rollouts, with the CPU and wall each took."""
    from harness_adapters.registry import get_harness

    started = (time.monotonic(), tree_cpu_seconds(), process_tree_cpu_s(stack.server_pid))
    with get_harness(arm["harness"], arm.get("config") or None, **(arm.get("kwargs") or {})) as harness:
        run_tasks(harness, stack, tasks[:cfg.warmup], folder / "warmup", store, experiment=EXPERIMENT,
                  max_tokens=cfg.max_tokens)
        warm = (time.monotonic(), tree_cpu_seconds(), process_tree_cpu_s(stack.server_pid))
        reports = run_tasks(harness, stack, tasks[cfg.warmup:], folder / "measured", store, experiment=EXPERIMENT,
                            max_tokens=cfg.max_tokens)
        done = (time.monotonic(), tree_cpu_seconds(), process_tree_cpu_s(stack.server_pid))
        identity = harness.identity()
    n = len(reports)
    total, server = done[1] - warm[1], done[2] - warm[2]
    return {"label": arm["label"], "harness": arm["harness"], "config": arm.get("config") or {},
            "kwargs": arm.get("kwargs") or {},
            "version": identity.get("version"), "isolation": _isolation(identity),
            "rollouts": n, "resolved": sum(r.outcome == "resolved" for r in reports),
            "finished": sum(r.harness_status == "finished" for r in reports),
            "calls_per_rollout": round(sum(r.n_calls for r in reports) / max(n, 1), 2),
            "wall_s": round((done[0] - warm[0]) / max(n, 1), 3),
            "cpu_s": round(total / max(n, 1), 3), "server_cpu_s": round(server / max(n, 1), 3),
            "harness_side_cpu_s": round((total - server) / max(n, 1), 3),
            "startup_cpu_s": round((warm[1] - started[1]) - (warm[2] - started[2])
                                   - cfg.warmup * (total - server) / max(n, 1), 3),
            "startup_wall_s": round((warm[0] - started[0]) - cfg.warmup * (done[0] - warm[0]) / max(n, 1), 3)}


def _isolation(identity: dict[str, Any]) -> str:
    settings = identity.get("settings") or {}
    return str(settings.get("isolation") or identity.get("isolation") or "none")


def bench_harnesses_job(bench: HarnessBenchConfig, run_dir: Path) -> dict[str, Any]:
    """Every arm on one expert server and proxy; writes ``metrics.json`` (kind ``harness_bench``), prints the table."""
    from repro.report.harness_bench_table import harness_bench_markdown

    run_dir, started = Path(run_dir), time.time()
    tasks = locate_tasks(bench.warmup + bench.rollouts, bench.task_seed)
    arms = []
    with expert_stack(tasks, run_dir) as stack:
        for i, arm in enumerate(bench.arms):
            arms.append(measure_arm(arm, stack, tasks, run_dir / f"arm{i}", run_dir / "traces.sqlite", bench))
            print(json.dumps(arms[-1]), flush=True)
    manifest = json.loads((run_dir / "manifest.json").read_text()) if (run_dir / "manifest.json").exists() else {}
    metrics = {"kind": "harness_bench", "run_dir": str(run_dir), "config": asdict(bench), "arms": arms,
               "git_sha": manifest.get("git_sha"), "cpu_count": manifest.get("cpu_count"),
               "started_at": started, "finished_at": time.time()}
    (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    print(harness_bench_markdown([metrics]), flush=True)
    return metrics
