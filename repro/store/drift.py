"""Prefix drift: does each call's prompt extend the previous call's prompt + completion token ids?

When it does, the calls of a rollout can be merged into one training row with the model's own tokens;
when it does not (the harness re-rendered, truncated or summarised its history), the row must break.
"""

from __future__ import annotations

from dataclasses import dataclass


def extends(prev_prompt: bytes, prev_completion: bytes, prompt: bytes) -> bool:
    """True when ``prompt`` starts with ``prev_prompt + prev_completion`` (int32-packed token ids)."""
    n = len(prev_prompt)
    return prompt[:n] == prev_prompt and prompt[n : n + len(prev_completion)] == prev_completion


@dataclass
class DriftSummary:
    """Per-rollout prefix drift."""

    calls: int
    comparable: int  # calls after the first whose predecessor had token ids
    extending: int
    first_break_seq: int | None

    @property
    def breaks(self) -> int:
        return self.comparable - self.extending


@dataclass
class RunDriftSummary:
    """Prefix drift over the rollouts of a run."""

    rollouts: int
    calls: int
    comparable: int
    extending: int
    rollouts_with_break: int

    @property
    def extend_rate(self) -> float | None:
        return None if self.comparable == 0 else self.extending / self.comparable


def summarise(seq_and_flag: list[tuple[int, int | None]]) -> DriftSummary:
    """Summarise (seq, extends_previous) pairs of one rollout, in seq order."""
    comparable = [(s, f) for s, f in seq_and_flag if f is not None]
    breaks = [s for s, f in comparable if not f]
    return DriftSummary(
        calls=len(seq_and_flag),
        comparable=len(comparable),
        extending=sum(1 for _, f in comparable if f),
        first_break_seq=breaks[0] if breaks else None,
    )


def summarise_run(per_rollout: list[DriftSummary]) -> RunDriftSummary:
    return RunDriftSummary(
        rollouts=len(per_rollout),
        calls=sum(d.calls for d in per_rollout),
        comparable=sum(d.comparable for d in per_rollout),
        extending=sum(d.extending for d in per_rollout),
        rollouts_with_break=sum(1 for d in per_rollout if d.breaks),
    )
