"""How context management shaped rollouts: per rollout its calls, training rows (prefix chains), refusals and
outcome, and their distribution over a set of rollouts (what the context profile and context training report)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any


@dataclass
class RolloutContext:
    """One rollout's calls as context management left them."""

    calls: int
    rows: int
    refusals: int
    context_exceeded: bool
    resolved: bool
    infra_failure: bool
    first_prompt: int


def rollout_context(calls: list[Any], report: Any) -> RolloutContext:
    """The context profile of one rollout from its stored calls and its report."""
    from repro.train.samples.rows import fragments

    rows, _ = fragments(calls)
    policy = [c for c in calls if c.purpose == "policy" and c.prompt_tokens]
    return RolloutContext(len(calls), len(rows), report.context_refusals, report.context_exceeded,
                          report.outcome == "resolved", report.infra_failure,
                          policy[0].prompt_tokens if policy else 0)


def summarize(profiles: list[RolloutContext]) -> dict[str, Any]:
    """Distribution of calls and rows per rollout, shares that were refused / ended on a refusal / split into
    several rows, Pass@1 (infrastructure failures left out of the denominator, counted)."""
    graded = [p for p in profiles if not p.infra_failure]
    n = max(len(graded), 1)
    calls, rows = [p.calls for p in profiles], [p.rows for p in profiles]
    return {"rollouts": len(profiles), "infra_failures": len(profiles) - len(graded),
            "pass_at_1": sum(p.resolved for p in graded) / n,
            "calls_mean": statistics.fmean(calls) if calls else 0.0, "calls_max": max(calls, default=0),
            "rows_mean": statistics.fmean(rows) if rows else 0.0, "rows_max": max(rows, default=0),
            "several_rows": sum(p.rows > 1 for p in profiles) / max(len(profiles), 1),
            "refused": sum(p.refusals > 0 for p in profiles) / max(len(profiles), 1),
            "context_exceeded": sum(p.context_exceeded for p in graded) / n,
            "first_prompt_max": max((p.first_prompt for p in profiles), default=0)}
