"""Row weights: how much each row of a rollout counts in the loss.

``rollout``: the rows of one rollout share one rollout's weight, split by sampled tokens, so the weights of a
rollout sum to 1 and (with a per-row token-mean loss) the rollout contributes its per-token mean loss.
``fragment``: every row weighs 1.0, i.e. each fragment counts as its own episode (a rollout broken into 10
fragments then counts 10 times as much as an unbroken one).
"""

from __future__ import annotations

from collections.abc import Sequence

WEIGHTINGS = ("rollout", "fragment")


def check_weighting(weighting: str) -> str:
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {', '.join(WEIGHTINGS)}; got {weighting!r}")
    return weighting


def rollout_weights(sampled: Sequence[int]) -> list[float]:
    """Each row's share of the rollout's sampled tokens (1/n_rows each when nothing was sampled)."""
    total = sum(sampled)
    if total <= 0:
        return [1.0 / len(sampled)] * len(sampled)
    return [n / total for n in sampled]


def row_weights(sampled: Sequence[int], weighting: str = "rollout") -> list[float]:
    """Weights of one rollout's rows, given each row's number of sampled (mask=1) tokens."""
    check_weighting(weighting)
    if not sampled:
        return []
    if weighting == "fragment":
        return [1.0] * len(sampled)
    return rollout_weights(sampled)
