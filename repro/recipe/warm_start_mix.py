"""A warm start that acts in several harnesses: the scripted expert's demonstrations recorded through each harness
on its own share of the demonstration tasks (task i goes to harness i mod H), then one SFT run on all their rows.
Each harness's demonstrations are cached by their own key (:func:`~repro.recipe.warm_start.demos_key`), the
checkpoint by a key over every source (:func:`mix_key`); a single source is :func:`~repro.recipe.warm_start.
warm_start` itself, with its key.

With ``mix_init: first_harness`` the SFT starts from the first harness's own warm start on all the demonstration
tasks (the checkpoint a single-harness run of the same settings makes and caches), its weights carried into the
mixed recipe tokenizer by token text (:mod:`repro.train.transfer`): a tiny model learns to copy a line number
and code from an observation only after thousands of steps, and a model that copies in one harness learns the
others' formats in a few hundred. Its held-out rows then include the first harness's rows that the first stage
trained on: the score is a diagnostic there, not a gate."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
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
from repro.train.transfer import carry_weights

MIX_INITS = ("random", "first_harness")


def shares(tasks: list[Task], n: int) -> list[list[Task]]:
    """``tasks`` dealt out to ``n`` harnesses in turn (each keeps the tasks' order)."""
    return [tasks[i::n] for i in range(n)]


def mixed_sft(cfg: WarmStartConfig) -> WarmStartConfig:
    """``cfg`` with the SFT settings of the mixed run: ``sft`` changed by ``mix_sft`` (which needs ``mix_init``)."""
    if cfg.mix_init not in MIX_INITS:
        raise ValueError(f"warm_start.mix_init must be one of {MIX_INITS}, got {cfg.mix_init!r}")
    if not cfg.mix_sft:
        return cfg
    if cfg.mix_init == "random":
        raise ValueError("warm_start.mix_sft changes the SFT of a warm start that starts from the first harness's: "
                         "set warm_start.mix_init=first_harness, or change warm_start.sft itself")
    unknown = sorted(set(cfg.mix_sft) - {f.name for f in dataclasses.fields(cfg.sft)})
    if unknown:
        raise ValueError(f"warm_start.mix_sft names settings SftConfig does not have: {unknown}")
    return dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, **dict(cfg.mix_sft)))


def mix_key(base_model: Path, sources: list[tuple[dict[str, Any], str, list[Task]]], cfg: WarmStartConfig,
            init_key: str = "") -> str:
    """Hash of everything that determines a warm start from several sources, each (harness identity, platform
    line, its demonstration tasks); ``init_key``: the warm start it starts from (``mix_init: first_harness``)."""
    digest = hashlib.sha256()
    digest.update((Path(base_model) / "repro_model.json").read_bytes())
    for identity, platform_text, tasks in sources:
        digest.update(json.dumps({"harness": identity, "platform": platform_text}, sort_keys=True,
                                 default=str).encode())
        hash_tasks(digest, tasks)
    payload = {"expert": EXPERT_VERSION, "mode": cfg.sample_mode, "sft": sft_identity(mixed_sft(cfg).sft),
               "sft_data": SFT_DATA_VERSION, "slip": [cfg.expert_slip_rate, cfg.expert_slip_seed,
                                                      *cfg.expert_slip_operators], "max_tokens": cfg.max_tokens}
    if init_key:  # absent for a random start: the keys of mixed warm starts made before the option stay valid
        payload["init"] = init_key
    digest.update(json.dumps(payload, sort_keys=True, default=str).encode())
    return "mix-" + digest.hexdigest()[:16]


def mixed_warm_start(runs: list[WarmStartRun], base_model: Path, tasks: list[Task], cfg: WarmStartConfig,
                     accountant: Any, first_base: Path | None = None) -> tuple[Path, dict[str, Any]]:
    """The warm start from demonstrations through every harness of ``runs`` (each recording into its own run
    folder), built or reused from the cache; what it took. ``first_base``: the base model of the first harness
    alone (its own recipe tokenizer), which ``mix_init: first_harness`` needs."""
    if len(runs) == 1:
        return warm_start(runs[0], base_model, tasks, cfg, accountant)
    init_dir, init = first_harness_start(runs[0], first_base, tasks, cfg, accountant)
    sources = [(run.agent.identity(), prompt_platform(getattr(run.agent, "cfg", None)), share)
               for run, share in zip(runs, shares(tasks, len(runs)), strict=True)]
    out = cache_dir() / "warm_start" / f"warm-{mix_key(base_model, sources, cfg, init.get('key', ''))}"
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
    start = base_model if init_dir is None else out.with_name(out.name + f".init{os.getpid()}")
    try:
        if init_dir is not None:
            init["carried"] = carry_weights(init_dir, base_model, start)
        sft = train_sft(runs[0], start, rows, mixed_sft(cfg), out, accountant)
    finally:  # the carried checkpoint is SFT's starting point only, kept neither on success nor on failure
        if init_dir is not None:
            shutil.rmtree(start, ignore_errors=True)
    stats = {"key": out.name.removeprefix("warm-"), "sources": per_source, "demo_tasks": len(tasks),
             "demo_rollouts": sum(s["demo_rollouts"] for s in per_source), "sft": sft,
             "demos_cached": all(s["demos_cached"] for s in per_source), **row_tokens(rows),
             **({"init": init} if init_dir is not None else {})}
    return publish(out, stats)


def first_harness_start(run: WarmStartRun, first_base: Path | None, tasks: list[Task], cfg: WarmStartConfig,
                        accountant: Any) -> tuple[Path | None, dict[str, Any]]:
    """For ``mix_init: first_harness``, the first harness's own warm start on ``tasks`` (built or reused) and its
    summary; else ``(None, {})``."""
    mixed_sft(cfg)  # a bad mix_init or mix_sft fails here, before any demonstration runs
    if cfg.mix_init != "first_harness":
        return None, {}
    if first_base is None:
        raise ValueError("warm_start.mix_init=first_harness needs the first harness's own base model")
    print("phase warm_start: the first harness's own warm start, which the mixed one starts from", flush=True)
    # its own folder: the mixed run records the first harness's share again, under another tokenizer, and a store
    # holding both would hand the mixed SFT these rollouts' token ids (the runner resumes rollouts it finds)
    own = dataclasses.replace(run, run_dir=Path(run.run_dir).with_name(Path(run.run_dir).name + "_own"))
    init_dir, init = warm_start(own, first_base, tasks, cfg, accountant)
    holdout = init.get("sft", {}).get("holdout", {}).get("final", {})
    print(f"warm start {init['key']} (the first harness's own): {'reused' if init['cached'] else 'built'}, "
          f"{init.get('sft', {}).get('steps')} steps, {holdout.get('later_actions', 0):.1%} of held-out later "
          f"actions reproduced", flush=True)
    return init_dir, {"key": init["key"], "cached": init["cached"], "weights_sha256": init["weights_sha256"],
                      "steps": init.get("sft", {}).get("steps"), "later_actions": holdout.get("later_actions")}
