"""Expected phase durations for progress lines, from this machine's own earlier runs.

Each finished phase of at least a minute records its seconds per unit (an evaluation sample, a demonstration, an
SFT step, an RL rollout) in ``<cache>/timings.json``; the next run announces a phase as ``~3m 20s expected`` from
that rate, or, on a machine with no earlier run, from ``REFERENCE_RATES`` (measured on the 2-core machine the
README's times come from: an AMD EPYC with AVX-512, no AMX). Only a hint for the person waiting: never part of a result.
"""

from __future__ import annotations

import json
from pathlib import Path

from repro.common.files import atomic_write_text, cache_dir, file_lock
from repro.common.progress import duration


def _path() -> Path:
    return cache_dir() / "timings.json"


def _read() -> dict[str, float]:
    try:
        data = json.loads(_path().read_text())
    except (OSError, ValueError):
        return {}
    return {k: float(v) for k, v in data.items() if isinstance(v, int | float)} if isinstance(data, dict) else {}


# Seconds per unit of each kind on the reference machine (2-core AMD EPYC with AVX-512, no AMX, mini_repro defaults,
# Dec 2026): the estimate a fresh machine starts from. Update with the rates a new default measures.
# From results/runs/mini_repro/20261205-093714 (seed 0 of the default, cold, rollouts streamed, 2-core EPYC).
REFERENCE_RATES: dict[str, float] = {
    "demo": 0.063,              # one expert demonstration through mini-SWE-agent 2.4.6 (1,600 in 1.7 min, streamed)
    "sft_step": 0.200,          # one SFT step, batch 8, labelled_logits, held-out scoring (2,516 in 8.4 min)
    "eval_sample": 0.202,       # one frozen-evaluation sample, ~3.9 calls, graded (300 in 61 s)
    "probe_sample": 0.181,      # one probe rollout (192 in 35 s)
    "rl_rollout_proxy": 0.225,  # one RL rollout including its share of the update (576 in 2.2 min)
    "rl_rollout_rebuilt": 0.225,
}


def rate_of(kind: str) -> tuple[float | None, str]:
    """(seconds per unit, where the rate comes from) of ``kind``: this machine's last run, else the reference."""
    rate = _read().get(kind)
    if rate is not None:
        return rate, "from this machine's last run"
    if kind in REFERENCE_RATES:
        return REFERENCE_RATES[kind], "on the reference 2-core machine"
    return None, ""


def expected(kind: str, units: float) -> str:
    """``~3m 20s expected`` for ``units`` of ``kind`` at the last recorded rate (or the reference machine's), or
    why there is no estimate."""
    rate, source = rate_of(kind)
    if rate is None or units <= 0:
        return "no earlier run on this machine to estimate from"
    return f"~{duration(rate * units)} expected {source}"


def plan_text(phases: list[tuple[str, str, float]]) -> str:
    """The phases a job will run, each ``(name, kind, units)``, with its expected duration and the total."""
    lines, total = [], 0.0
    for name, kind, units in phases:
        rate, source = rate_of(kind)
        seconds = (rate or 0.0) * units
        total += seconds
        guess = f"~{duration(seconds)}" if rate is not None else "no estimate"
        lines.append(f"  {name}: {units:g} x {kind} ({guess}{', ' + source if rate is not None else ''})")
    return "\n".join(["plan (expected durations; a cached warm start or probe skips its phases):", *lines,
                      f"  total: ~{duration(total)}"])


MIN_SECONDS = 60.0  # shorter phases are mostly fixed start-up cost: a per-unit rate from them overestimates
MIN_UNITS = 100     # so are phases of a few units (a test's miniature: 8 demonstrations in a minute is no rate)


def record(kind: str, units: float, seconds: float) -> None:
    """Remember ``seconds / units`` as the rate of ``kind`` (the latest run wins), when the phase ran long enough
    (``MIN_SECONDS``) over enough units (``MIN_UNITS``) for its start-up cost not to dominate."""
    if units < MIN_UNITS or seconds < MIN_SECONDS:
        return
    with file_lock(_path()):
        data = _read()
        data[kind] = seconds / units
        atomic_write_text(_path(), json.dumps(data, indent=2, sort_keys=True))
