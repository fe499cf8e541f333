"""What each harness's context management makes of the same rollouts at a small served window (issue 56).

Every arm is one harness, unchanged, with the scripted expert answering (the real CPU server started with the tasks,
as warm starts record demonstrations) on the same bundled tasks, through the real proxy, graded by the real grader.
Each arm runs first with room (the window the expert server has by default), which measures the harness's first
prompt, then once per ``headrooms`` entry H on a server whose window is W = that first prompt (the largest over
the tasks) + the forced ``max_tokens`` + H. Where the arm says how, the harness is set to compact before W
(``compaction``: ``compacting_below`` with a margin, the CLIs'; ``context_limit``, OpenCode's); otherwise it meets
the window as it is (OpenHands' condenser acts on the server's refusal; mini-SWE-agent has no compaction).

Per rollout, from the trace store: its calls, its rows (``prefix_merge`` chains: every sampled token in exactly
one; ``repro.train.samples.rows.fragments``), its calls refused as too long, whether it ended on one (the
``context_exceeded`` outcome), whether it was resolved. ``repro run experiment=context_profile`` writes
``metrics.json`` (kind ``context_profile``); ``repro table`` publishes ``results/context_profile.md``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from repro.recipe.context_stats import RolloutContext, rollout_context, summarize
from repro.recipe.expert_runs import EXPERT_MODEL_LEN, expert_stack, run_tasks

EXPERIMENT = "context_profile"


@dataclass
class ContextProfileConfig:
    """``arms``: each {label, harness (registry name), config (overrides of its defaults), compaction (None |
    ``compacting_below`` | ``context_limit``), margin (tokens, for ``compacting_below``)}; ``headrooms``: tokens
    above the first prompt and ``max_tokens``, one window each; the tasks: ``n_tasks`` bundled tasks of
    ``difficulty`` (``task_seed``, train split); ``time_limit_s``: each rollout's wall time (a harness whose
    compaction cannot get under the window may compact without end: OpenCode does)."""

    arms: list[dict[str, Any]] = field(default_factory=lambda: [{"label": "mini-SWE-agent 2.4.6",
                                                                  "harness": "mini_swe_agent"}])
    headrooms: list[int] = field(default_factory=lambda: [512])
    n_tasks: int = 20
    task_seed: int = 0
    difficulty: str = "locate"
    max_tokens: int = 256
    concurrency: int = 2
    time_limit_s: float = 120.0


def compaction_at(arm: dict[str, Any], headroom: int | None) -> str | None:
    """How the arm is told to compact at a window of ``headroom`` (None: with room, or left as it comes: a margin
    no smaller than the headroom would put the threshold below the first prompt)."""
    compaction = arm.get("compaction")
    if headroom is None or compaction is None:
        return None
    if compaction == "compacting_below" and int(arm["margin"]) >= headroom:
        return None
    return compaction


def arm_config(arm: dict[str, Any], window: int | None, compaction: str | None, time_limit_s: float = 0) -> Any:
    """The harness config of ``arm`` for a served ``window`` (None: with room, as configured), with a rollout's
    ``time_limit_s`` where the harness takes one (OpenHands' bound is its ``max_iterations``)."""
    from harness_adapters.registry import harness_config

    cfg = harness_config(arm["harness"], arm.get("config") or None)
    if time_limit_s and "wall_time_limit_s" in {f.name for f in fields(cfg)}:
        cfg = replace(cfg, wall_time_limit_s=time_limit_s)
    if window is None or compaction is None:
        return cfg
    if compaction == "compacting_below":
        return cfg.compacting_below(window, int(arm["margin"]))
    if compaction == "context_limit":
        return replace(cfg, context_limit=window)
    raise ValueError(f"arm {arm['label']!r}: compaction must be compacting_below | context_limit, got {compaction!r}")


def run_window(arm: dict[str, Any], window: int | None, compaction: str | None, tasks: list[Any], folder: Path,
               cfg: ContextProfileConfig) -> list[RolloutContext]:
    """``tasks`` through the arm's harness on an expert server of ``window`` tokens; each rollout's profile."""
    from harness_adapters.registry import get_harness
    from repro.store import open_store

    with expert_stack(tasks, folder, window or EXPERT_MODEL_LEN) as stack, \
            get_harness(arm["harness"], arm_config(arm, window, compaction, cfg.time_limit_s)) as harness:
        reports = run_tasks(harness, stack, tasks, folder / "rollouts", folder / "traces.sqlite",
                            experiment=EXPERIMENT, max_tokens=cfg.max_tokens, concurrency=cfg.concurrency)
    store = open_store(folder / "traces.sqlite")
    try:
        return [rollout_context(store.calls(r.rollout_id), r) for r in reports]
    finally:
        store.close()


def profile_arm(arm: dict[str, Any], tasks: list[Any], folder: Path, cfg: ContextProfileConfig) -> dict[str, Any]:
    """The arm with room, then at each headroom's window; a row per window."""
    roomy = run_window(arm, None, None, tasks, folder / "roomy", cfg)
    first = max(p.first_prompt for p in roomy)
    rows = [{"window": None, "headroom": None, "compaction": None, **summarize(roomy)}]
    for headroom in cfg.headrooms:
        window, compaction = first + cfg.max_tokens + headroom, compaction_at(arm, headroom)
        profiles = run_window(arm, window, compaction, tasks, folder / f"headroom{headroom}", cfg)
        rows.append({"window": window, "headroom": headroom, "compaction": compaction, **summarize(profiles)})
    return {"label": arm["label"], "harness": arm["harness"], "margin": arm.get("margin"), "windows": rows}


def context_profile_job(profile: ContextProfileConfig, run_dir: Path) -> dict[str, Any]:
    """Every arm at every window; writes ``metrics.json`` (kind ``context_profile``), prints the table."""
    from repro.report.context_table import context_markdown
    from repro.tasks.distributions import TaskDistributionConfig, build_distribution

    run_dir, started = Path(run_dir), time.time()
    tasks = build_distribution(TaskDistributionConfig(
        seed=profile.task_seed, split="train", n_tasks=profile.n_tasks, families=["procedural"],
        operators=["recipe"], difficulty=profile.difficulty))
    arms = []
    for i, arm in enumerate(profile.arms):
        arms.append(profile_arm(arm, tasks, run_dir / f"arm{i}", profile))
        print(json.dumps(arms[-1]), flush=True)
    manifest = json.loads((run_dir / "manifest.json").read_text()) if (run_dir / "manifest.json").exists() else {}
    metrics = {"kind": EXPERIMENT, "run_dir": str(run_dir), "config": asdict(profile), "arms": arms,
               "git_sha": manifest.get("git_sha"), "cpu_count": manifest.get("cpu_count"),
               "started_at": started, "finished_at": time.time()}
    (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    print(context_markdown([metrics]), flush=True)
    return metrics
