"""Agent Lightning's training-task filter: probe each candidate task k times with the warm-started policy, keep the
tasks with mixed outcomes (the only groups GRPO learns from) plus a share of all-fail ones, drop the all-pass ones.

Agent Lightning v1.0 kept ~5k mixed-outcome and ~1k all-fail tasks of SWE-smith (all-fail: 1/6 of the kept set).
The probes double as a measurement before RL: pass@k for k = 1..K on the training distribution is the headroom
that sharpening can turn into Pass@1 (:func:`pass_at_k_curve`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from repro.evaluation.metrics import pass_at_k

MIXED, ALL_FAIL, ALL_PASS = "mixed", "all_fail", "all_pass"
FALLBACKS = ("unfiltered", "error")


@dataclass
class TaskFilterConfig:
    """``enabled``: probe and filter before RL (off: RL draws from every RL task). ``pool``: candidate tasks probed
    (the first ``pool`` RL tasks; <= 0: all). ``k``: probes per task. ``all_fail_share``: the share of the kept
    set that is all-fail (drawn by a seeded hash; fewer when there are not enough). ``min_tasks``: the fewest kept
    tasks RL trains on; ``fallback``: what happens below it: ``unfiltered`` (RL draws from every probed candidate,
    recorded in the run's probe summary) or ``error`` (the run stops with a message)."""

    enabled: bool = False
    pool: int = 256
    k: int = 8
    all_fail_share: float = 1 / 6
    min_tasks: int = 16
    concurrency: int = 16
    seed: int = 0
    fallback: str = "unfiltered"

    def __post_init__(self) -> None:
        if self.fallback not in FALLBACKS:
            raise ValueError(f"rl_filter.fallback must be one of {FALLBACKS}, got {self.fallback!r}")
        if self.k < 2:
            raise ValueError(f"rl_filter.k={self.k}: a task needs at least 2 probes to show mixed outcomes")
        if not 0.0 <= self.all_fail_share < 1.0:
            raise ValueError(f"rl_filter.all_fail_share={self.all_fail_share} must be in [0, 1)")


@dataclass
class FilterResult:
    """The kept task ids (mixed first, then all-fail, each in candidate order) and every candidate's class."""

    kept: list[str]
    classes: dict[str, str] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        out = {MIXED: 0, ALL_FAIL: 0, ALL_PASS: 0}
        for cls in self.classes.values():
            out[cls] += 1
        kept = set(self.kept)
        out["kept"] = len(self.kept)
        out["kept_all_fail"] = sum(1 for i, c in self.classes.items() if c == ALL_FAIL and i in kept)
        return out


def outcomes_by_task(reports: Iterable[Any]) -> dict[str, list[bool]]:
    """Each task's resolved flags in sample order (``InstanceReport``-like objects; infrastructure failures are
    left out: they say nothing about the policy)."""
    by_task: dict[str, list[bool]] = {}
    for r in sorted(reports, key=lambda r: (r.instance_id, r.sample)):
        if not r.infra_failure:
            by_task.setdefault(r.instance_id, []).append(r.outcome == "resolved")
    return by_task


def outcome_class(outcomes: Sequence[bool]) -> str:
    """``mixed`` | ``all_fail`` | ``all_pass`` of one task's probe outcomes."""
    if not outcomes:
        raise ValueError("a task without probe outcomes cannot be classified")
    solved = sum(outcomes)
    return ALL_PASS if solved == len(outcomes) else ALL_FAIL if solved == 0 else MIXED


def _draw(seed: int, instance_id: str) -> str:
    return hashlib.sha256(f"task-filter:{seed}:{instance_id}".encode()).hexdigest()


def select_tasks(outcomes: Mapping[str, Sequence[bool]], all_fail_share: float, seed: int = 0) -> FilterResult:
    """Every mixed-outcome task, plus all-fail tasks (a seeded draw) making up ``all_fail_share`` of the kept set;
    all-pass tasks are dropped (their groups have no advantage)."""
    classes = {i: outcome_class(o) for i, o in outcomes.items()}
    mixed = [i for i, c in classes.items() if c == MIXED]
    failing = [i for i, c in classes.items() if c == ALL_FAIL]
    want = round(all_fail_share / (1.0 - all_fail_share) * len(mixed))
    chosen = set(sorted(failing, key=lambda i: _draw(seed, i))[:want])
    return FilterResult(mixed + [i for i in failing if i in chosen], classes)


def pass_at_k_curve(outcomes: Mapping[str, Sequence[bool]], max_k: int | None = None) -> dict[int, float]:
    """Mean unbiased pass@k over tasks for k = 1..``max_k`` (default: the fewest probes any task has)."""
    if not outcomes:
        return {}
    n_min = min(len(o) for o in outcomes.values())
    top = min(max_k or n_min, n_min)
    return {k: sum(pass_at_k(len(o), sum(o), k) for o in outcomes.values()) / len(outcomes)
            for k in range(1, top + 1)}
