"""A warm start that acts in several harnesses: the scripted expert's demonstrations recorded through each harness
on its own share of the demonstration tasks (task i goes to harness i mod H), then one SFT run on all their rows.
Each harness's demonstrations are cached by their own key (:func:`~repro.recipe.warm_start.demos_key`), the
checkpoint by a key over every source (:func:`mix_key`); a single source is :func:`~repro.recipe.warm_start.
warm_start` itself, with its key."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from repro.common.files import cache_dir
from repro.recipe.warm_start import (
    EXPERT_VERSION,
    SFT_DATA_VERSION,
    WarmStartConfig,
    WarmStartRun,
    cached_warm_start,
    demos_key,
    hash_tasks,
    prompt_platform,
    publish,
    row_tokens,
    sft_identity,
    timed_demonstrations,
    train_sft,
    warm_start,
)
from repro.tasks.schema import Task


def shares(tasks: list[Task], n: int) -> list[list[Task]]:
    """``tasks`` dealt out to ``n`` harnesses in turn (each keeps the tasks' order)."""
    return [tasks[i::n] for i in range(n)]


def mix_key(base_model: Path, sources: list[tuple[dict[str, Any], str, list[Task]]], cfg: WarmStartConfig) -> str:
    """Hash of everything that determines a warm start from several sources, each (harness identity, platform
    line, its demonstration tasks)."""
    digest = hashlib.sha256()
    digest.update((Path(base_model) / "repro_model.json").read_bytes())
    for identity, platform_text, tasks in sources:
        digest.update(json.dumps({"harness": identity, "platform": platform_text}, sort_keys=True,
                                 default=str).encode())
        hash_tasks(digest, tasks)
    payload = {"expert": EXPERT_VERSION, "mode": cfg.sample_mode, "sft": sft_identity(cfg.sft),
               "sft_data": SFT_DATA_VERSION, "slip": [cfg.expert_slip_rate, cfg.expert_slip_seed,
                                                      *cfg.expert_slip_operators], "max_tokens": cfg.max_tokens}
    digest.update(json.dumps(payload, sort_keys=True, default=str).encode())
    return "mix-" + digest.hexdigest()[:16]


def mixed_warm_start(runs: list[WarmStartRun], base_model: Path, tasks: list[Task], cfg: WarmStartConfig,
                     accountant: Any) -> tuple[Path, dict[str, Any]]:
    """The warm start from demonstrations through every harness of ``runs`` (each recording into its own run
    folder), built or reused from the cache; what it took."""
    if len(runs) == 1:
        return warm_start(runs[0], base_model, tasks, cfg, accountant)
    sources = [(run.agent.identity(), prompt_platform(getattr(run.agent, "cfg", None)), share)
               for run, share in zip(runs, shares(tasks, len(runs)), strict=True)]
    out = cache_dir() / "warm_start" / f"warm-{mix_key(base_model, sources, cfg)}"
    cached = cached_warm_start(out, cfg)
    if cached is not None:
        return cached
    rows, per_source = [], []
    for run, (identity, platform_text, share) in zip(runs, sources, strict=True):
        rows_key = demos_key(base_model, share, identity, cfg, platform_text)
        harness = f"{identity.get('name')}@{identity.get('version')}"
        source_rows, n_rollouts, cached_rows = timed_demonstrations(run, base_model, share, cfg, rows_key,
                                                                    accountant, f"through {harness}")
        rows += source_rows
        per_source.append({"harness": harness, "demos_key": rows_key, "demo_tasks": len(share),
                           "demo_rollouts": n_rollouts, "rows": len(source_rows), "demos_cached": cached_rows})
    sft = train_sft(runs[0], base_model, rows, cfg, out, accountant)
    stats = {"key": out.name.removeprefix("warm-"), "sources": per_source, "demo_tasks": len(tasks),
             "demo_rollouts": sum(s["demo_rollouts"] for s in per_source), "sft": sft,
             "demos_cached": all(s["demos_cached"] for s in per_source), **row_tokens(rows)}
    return publish(out, stats)
