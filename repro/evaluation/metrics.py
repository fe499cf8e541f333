"""Pass@1 and pass@k with their uncertainty, and the rule for infrastructure failures.

**Infrastructure-failure rule.** A sample is an *infrastructure failure* when the grader's outcome is ``error``
or ``timeout`` (the patch did not apply, the test run crashed or ran out of time) or the harness itself crashed
(``harness_status == "crashed"``, unless it stopped on a call refused as longer than the context) —
failures of the machinery, not answers of the model. They are counted and
listed apart from ``unresolved`` and, by default, **left out of the denominator**: a task's score is
``resolved / valid samples``, and a task with no valid sample is left out of the mean (and listed). The
**strict** Pass@1 counts every infrastructure failure as a failure (every task and sample in the denominator);
report both — the gap between them is the cost of the infrastructure, not of the model.

Pass@1 is the mean over tasks of the per-task pass@1 (``c / n``), pass@k the mean of the unbiased estimator of
Chen et al. (2021). Intervals are over tasks: a Wilson score interval (exact binomial setting when k = 1; with
k > 1 it treats the mean as a proportion over the n tasks) and a seeded percentile bootstrap that resamples tasks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Protocol

import numpy as np

OUTCOMES = ("resolved", "unresolved", "error", "timeout")
INFRA_OUTCOMES = ("error", "timeout")


class SampleLike(Protocol):
    """What metrics need from a per-sample record (``repro.evaluation.reports.InstanceReport`` has it)."""

    instance_id: str
    sample: int
    outcome: str
    harness_status: str


def is_infra_failure(sample: SampleLike) -> bool:
    """The module's rule: grader error/timeout, or a crashed harness, except a harness that stopped because its
    last call was refused as longer than the model's context (``context_exceeded_seq``): that is the model's
    outcome (a prompt it let grow too long), graded and counted, apart from both."""
    if sample.outcome in INFRA_OUTCOMES:
        return True
    return sample.harness_status == "crashed" and getattr(sample, "context_exceeded_seq", None) is None


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` passed: ``1 - C(n-c, k) / C(n, k)``, computed as a
    product (no huge binomials): ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def wilson_interval(successes: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a proportion (``successes`` may be fractional: a mean times n)."""
    if n <= 0:
        return (0.0, 1.0)
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(max(p * (1 - p) / n + z * z / (4 * n * n), 0.0)) / denom
    return (max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half)))  # clamps rounding only


def bootstrap_interval(scores: Sequence[float], confidence: float = 0.95, resamples: int = 2000,
                       seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of per-task ``scores`` (tasks resampled with replacement)."""
    values = np.asarray(scores, dtype=float)
    if values.size == 0:
        return (0.0, 1.0)
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, size=(resamples, values.size))].mean(axis=1)
    alpha = (1 - confidence) / 2
    return (float(np.quantile(means, alpha)), float(np.quantile(means, 1 - alpha)))


@dataclass
class TaskTally:
    """One task's samples: ``valid`` = resolved + unresolved; ``infra`` = infrastructure failures."""

    instance_id: str
    resolved: int = 0
    valid: int = 0
    infra: int = 0

    @property
    def score(self) -> float:
        """Per-task pass@1 over valid samples (NaN when there are none)."""
        return self.resolved / self.valid if self.valid else math.nan

    @property
    def strict_score(self) -> float:
        total = self.valid + self.infra
        return self.resolved / total if total else 0.0


def tally(samples: Iterable[SampleLike]) -> dict[str, TaskTally]:
    """Per-task counts, keyed by instance id (sorted)."""
    tallies: dict[str, TaskTally] = {}
    for s in samples:
        if s.outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {s.outcome!r} for {s.instance_id}; expected one of {OUTCOMES}")
        t = tallies.setdefault(s.instance_id, TaskTally(s.instance_id))
        if is_infra_failure(s):
            t.infra += 1
        else:
            t.valid += 1
            t.resolved += s.outcome == "resolved"
    return dict(sorted(tallies.items()))


def pass_at_1(samples: Iterable[SampleLike]) -> float:
    """The published Pass@1: the mean over tasks with a valid sample of each task's resolved share of its valid
    samples (infrastructure failures left out); 0.0 when no sample is valid."""
    return _mean_score(tally(samples))


def _mean_score(tallies: dict[str, TaskTally]) -> float:
    scores = [t.score for t in tallies.values() if t.valid]
    return float(np.mean(scores)) if scores else 0.0


@dataclass
class MetricsConfig:
    """How intervals are computed (analysis settings: recorded with the numbers, not part of the spec)."""

    confidence: float = 0.95
    bootstrap_resamples: int = 2000
    bootstrap_seed: int = 0
    ci_method: str = "wilson"  # which interval tables show as "CI": "wilson" or "bootstrap"


@dataclass
class Summary:
    """The numbers of one evaluation run (fractions in [0, 1])."""

    n_tasks: int  # tasks in the default denominator (at least one valid sample)
    n_tasks_total: int
    pass_at_1: float
    strict_pass_at_1: float
    wilson: tuple[float, float]
    bootstrap: tuple[float, float]
    pass_at_k: dict[int, float] = field(default_factory=dict)
    pass_at_k_tasks: dict[int, int] = field(default_factory=dict)  # tasks with >= k valid samples
    excluded_tasks: list[str] = field(default_factory=list)  # no valid sample at all
    per_task: dict[str, float] = field(default_factory=dict)  # default per-task pass@1 (excluded tasks absent)


def summarize(samples: Iterable[SampleLike], k_values: Iterable[int] = (1,),
              config: MetricsConfig | None = None) -> Summary:
    """Pass@1 (default and strict), its intervals and pass@k for each k, under the infrastructure rule."""
    config = config or MetricsConfig()
    tallies = tally(samples)
    included = [t for t in tallies.values() if t.valid]
    scores = [t.score for t in included]
    pass1 = _mean_score(tallies)
    strict = float(np.mean([t.strict_score for t in tallies.values()])) if tallies else 0.0
    at_k, at_k_tasks = {}, {}
    for k in sorted(set(k_values)):
        eligible = [t for t in included if t.valid >= k]
        at_k_tasks[k] = len(eligible)
        at_k[k] = float(np.mean([pass_at_k(t.valid, t.resolved, k) for t in eligible])) if eligible else 0.0
    return Summary(
        n_tasks=len(included), n_tasks_total=len(tallies), pass_at_1=pass1, strict_pass_at_1=strict,
        wilson=wilson_interval(pass1 * len(included), len(included), config.confidence),
        bootstrap=bootstrap_interval(scores, config.confidence, config.bootstrap_resamples, config.bootstrap_seed),
        pass_at_k=at_k, pass_at_k_tasks=at_k_tasks,
        excluded_tasks=[t.instance_id for t in tallies.values() if not t.valid],
        per_task={t.instance_id: t.score for t in included},
    )
