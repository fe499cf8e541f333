"""Group-relative advantages (GRPO) over the rollouts of one group, and which rollouts are masked.

A rollout is masked when it has no reward to learn from: it failed for infrastructure reasons (status
``failed``), has not finished, or has no (finite) reward; or when its mode (train/eval/demo) is not among
``include_modes`` (None: every mode). Masked rollouts are left out of their group's statistics and get
advantage 0.0; they are never scored as reward 0.

With ``scale="group"`` the advantage is ``(r - mean) / (std + eps)`` with the *population* std (ddof=0; trl's
GRPO uses torch's default sample std, ddof=1, which is larger by sqrt(n / (n - 1)) for a group of n); with
``"none"`` it is ``r - mean``. A group with fewer than two valid rollouts, or whose valid rewards are all
equal, gives advantage 0.0 to all of them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence

from repro.store import RolloutRecord

SCALES = ("group", "none")


def check_scale(scale: str) -> str:
    if scale not in SCALES:
        raise ValueError(f"scale_rewards must be one of {', '.join(SCALES)}; got {scale!r}")
    return scale


def group_key(rollout: RolloutRecord) -> str:
    """The GRPO group: ``group_id``, else the task, else the rollout alone."""
    return rollout.group_id or rollout.task_id or rollout.rollout_id


def masked_reason(rollout: RolloutRecord, include_modes: Collection[str] | None = None) -> str | None:
    """Why the rollout must not be trained on (None when it can)."""
    if include_modes is not None and rollout.mode not in include_modes:
        return f"mode {rollout.mode} not included ({', '.join(include_modes)})"
    if rollout.status == "failed":
        return f"infrastructure failure: {rollout.failure_reason or 'no reason recorded'}"
    if rollout.status in ("pending", "running"):
        return f"rollout {rollout.status}: not finished"
    if rollout.reward is None:
        return "no reward"
    if not math.isfinite(rollout.reward):
        return f"non-finite reward {rollout.reward}"
    return None


def group_advantages(rewards: Sequence[float], scale: str = "group", eps: float = 1e-4) -> list[float]:
    """Advantages of one group's valid rewards, in order."""
    check_scale(scale)
    if len(rewards) < 2:
        return [0.0] * len(rewards)
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    if std == 0.0:
        return [0.0] * len(rewards)
    denom = std + eps if scale == "group" else 1.0
    return [(r - mean) / denom for r in rewards]


def advantages(rollouts: Iterable[RolloutRecord], scale: str = "group", eps: float = 1e-4,
               include_modes: Collection[str] | None = None) -> dict[str, float]:
    """Rollout id -> advantage, groups formed by :func:`group_key`; masked rollouts get 0.0."""
    out: dict[str, float] = {}
    groups: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for rollout in rollouts:
        if masked_reason(rollout, include_modes) is None and rollout.reward is not None:
            groups[group_key(rollout)].append((rollout.rollout_id, float(rollout.reward)))
        else:
            out[rollout.rollout_id] = 0.0
    for members in groups.values():
        values = group_advantages([reward for _, reward in members], scale, eps)
        out.update({rollout_id: a for (rollout_id, _), a in zip(members, values, strict=True)})
    return out
