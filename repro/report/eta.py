"""Expected phase durations for progress lines, from this machine's own earlier runs.

Each finished phase of at least a minute records its seconds per unit (an evaluation sample, a demonstration, an
SFT step, an RL rollout) in ``<cache>/timings.json``; the next run announces a phase as ``~3m 20s expected`` from
that rate, or says it has nothing to estimate from. Only a hint for the person waiting: never part of a result.
"""

from __future__ import annotations

import json
from pathlib import Path

from repro.files import atomic_write_text, cache_dir, file_lock
from repro.report.progress import duration


def _path() -> Path:
    return cache_dir() / "timings.json"


def _read() -> dict[str, float]:
    try:
        data = json.loads(_path().read_text())
    except (OSError, ValueError):
        return {}
    return {k: float(v) for k, v in data.items() if isinstance(v, int | float)} if isinstance(data, dict) else {}


def expected(kind: str, units: float) -> str:
    """``~3m 20s expected`` for ``units`` of ``kind`` at the last recorded rate, or why there is no estimate."""
    rate = _read().get(kind)
    if rate is None or units <= 0:
        return "no earlier run on this machine to estimate from"
    return f"~{duration(rate * units)} expected from this machine's last run"


MIN_SECONDS = 60.0  # shorter phases are mostly fixed start-up cost: a per-unit rate from them overestimates


def record(kind: str, units: float, seconds: float) -> None:
    """Remember ``seconds / units`` as the rate of ``kind`` (the latest run wins), when the phase ran long enough
    (``MIN_SECONDS``) for its start-up cost not to dominate."""
    if units <= 0 or seconds < MIN_SECONDS:
        return
    with file_lock(_path()):
        data = _read()
        data[kind] = seconds / units
        atomic_write_text(_path(), json.dumps(data, indent=2, sort_keys=True))
