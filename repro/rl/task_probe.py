"""The probe step before RL (Agent Lightning's data filter): the warm-started policy runs each candidate RL task k
times in the real harness through the proxy (mode ``probe``, never trained on), and
:func:`repro.train.task_filter.select_tasks` keeps the mixed-outcome tasks plus a share of all-fail ones.

The outcomes are cached under ``<cache>/probes/<key>.json``, keyed by the warm start's weights, the candidates,
k, the seed, the sampling and the harness, so arms and ablations that share a warm start probe once.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from repro.common.eta import expected
from repro.common.eta import record as record_rate
from repro.common.files import atomic_write_text, cache_dir
from repro.common.seeding import derive_seed
from repro.evaluation.summary import calls_histogram
from repro.protocols import Harness, Sandbox
from repro.rl.rollouts import GradeCache, RolloutOptions, RolloutRunner
from repro.serving.stack import Stack
from repro.tasks.schema import Task
from repro.train.task_filter import TaskFilterConfig, outcomes_by_task, pass_at_k_curve, select_tasks


def probe_seed(base: int, instance_id: str, sample: int) -> int:
    """The seed of a probe rollout (its own stream: never an evaluation's or an RL step's draw)."""
    return derive_seed("probe", base, instance_id, sample)


def probe_key(weights: str, candidates: list[Task], cfg: TaskFilterConfig, sampling: dict[str, Any],
              identity: dict[str, Any]) -> str:
    payload = {"weights": weights, "tasks": [t.instance_id for t in candidates], "k": cfg.k, "seed": cfg.seed,
               "sampling": sampling, "harness": identity}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def run_probes(phase_dir: Path, store_path: Path, candidates: list[Task], cfg: TaskFilterConfig,
               sampling: dict[str, Any], stack: Stack, agent: Harness, box: Sandbox,
               grades: GradeCache | None = None) -> dict[str, Any]:
    """k rollouts per candidate; returns ``{"outcomes": {id: [resolved, ...]}, "calls": [per rollout],
    "infra_failures": n}`` (a rollout that failed for infrastructure reasons is left out of its task's list)."""
    identity = agent.identity()
    opts = RolloutOptions(mode="probe", k=cfg.k, seed_of=partial(probe_seed, cfg.seed), concurrency=cfg.concurrency,
                          sampling=sampling, write_preds=False, harness_name=identity.get("name", ""),
                          harness_version=identity.get("version", ""))
    runner = RolloutRunner(phase_dir, store_path, opts, candidates, stack, agent, box, "warm-start-probe", grades)
    try:
        reports = runner.run("probe samples")
    finally:
        runner.close()
    return {"outcomes": outcomes_by_task(reports), "calls": [r.n_calls for r in reports],
            "infra_failures": sum(r.infra_failure for r in reports)}


def filter_rl_tasks(run_dir: Path, candidates: list[Task], cfg: TaskFilterConfig, sampling: dict[str, Any],
                    start_sha: str, stack: Stack, agent: Harness, box: Sandbox,
                    grades: GradeCache | None = None) -> tuple[list[Task], dict[str, Any]]:
    """The kept RL tasks (in candidate order: mixed, then all-fail) and the probe summary for metrics.json;
    ``start_sha``: the sha256 of the weights that probe (the cache key's)."""
    key = probe_key(start_sha, candidates, cfg, sampling, agent.identity())
    cached = cache_dir() / "probes" / f"{key}.json"
    if cached.exists():
        probes, reused = json.loads(cached.read_text()), True
    else:
        started = time.monotonic()
        print(f"phase probe: {len(candidates)} RL tasks x k={cfg.k} with the warm start "
              f"({expected('probe_sample', len(candidates) * cfg.k)})", flush=True)
        probes = run_probes(run_dir / "probe", run_dir / "traces.sqlite", candidates, cfg, sampling, stack, agent, box,
                            grades)
        record_rate("probe_sample", len(candidates) * cfg.k, time.monotonic() - started)
        cached.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(cached, json.dumps(probes, sort_keys=True))
        reused = False
    outcomes = {i: o for i, o in probes["outcomes"].items() if len(o) >= 2}
    result = select_tasks(outcomes, cfg.all_fail_share, cfg.seed)
    by_id = {t.instance_id: t for t in candidates}
    kept = [by_id[i] for i in result.kept]
    summary = {"config": asdict(cfg), "key": key, "reused": reused, "counts": result.counts(),
               "pass_at_k": {str(k): v for k, v in pass_at_k_curve(outcomes).items()},
               "calls_per_rollout": calls_histogram(probes["calls"]), "infra_failures": probes["infra_failures"]}
    counts = summary["counts"]
    print(f"probe {key}{' (reused)' if reused else ''}: {counts['mixed']} mixed, {counts['all_fail']} all-fail, "
          f"{counts['all_pass']} all-pass of {len(candidates)}; kept {counts['kept']} "
          f"({counts['kept_all_fail']} all-fail); pass@1 {summary['pass_at_k'].get('1', 0):.1%}, "
          f"pass@{cfg.k} {summary['pass_at_k'].get(str(cfg.k), 0):.1%}", flush=True)
    if len(kept) < cfg.min_tasks:
        kept = fall_back(kept, candidates, cfg, summary)
    return kept, summary


def fall_back(kept: list[Task], candidates: list[Task], cfg: TaskFilterConfig, summary: dict[str, Any]) -> list[Task]:
    """Fewer kept tasks than ``cfg.min_tasks``: by ``cfg.fallback``, stop with a message, or train on every probed
    candidate (the unfiltered pool), recorded in ``summary["fallback"]``."""
    reason = f"the probe kept {len(kept)} RL tasks (< rl_filter.min_tasks={cfg.min_tasks})"
    if cfg.fallback == "error":
        raise SystemExit(f"{reason}: raise rl_filter.pool or rl_filter.all_fail_share, set "
                         "rl_filter.fallback=unfiltered, or turn the filter off (rl_filter.enabled=false)")
    summary["fallback"] = {"rule": cfg.fallback, "kept_by_filter": len(kept), "min_tasks": cfg.min_tasks,
                           "tasks": len(candidates)}
    print(f"{reason}: falling back by rl_filter.fallback={cfg.fallback}: RL draws from all {len(candidates)} "
          "probed tasks (recorded in the run's probe summary)", flush=True)
    return list(candidates)
