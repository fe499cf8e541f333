"""How many optimizer steps a step's rows get, and on which rows: verl's PPO mini-batches as Agent Lightning runs
them (pure python; the trainer, :mod:`repro.train.rl`, takes the plan).

With a PPO mini-batch of ``M`` rows, one PPO epoch and a cap of ``max_updates`` (Agent Lightning's
``max_ppo_update_times``), a step with ``n`` rows trains on ``k * M`` of them, ``k = min(max_updates, n // M)``, as
``k`` disjoint mini-batches of ``M`` consecutive kept rows, one optimizer step each; ``n < M`` skips the step. The
rows to drop go first from zero-advantage rows (those of groups whose rewards are all equal), then from the others,
each chosen at random; the kept rows stay in their order. ``max_updates=0``: no cap.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class PlannedRow(Protocol):
    """What the plan reads from a row."""

    advantage: float


@dataclass(frozen=True)
class UpdatePlan:
    """The mini-batches (indices into the planned rows, in order), and what was dropped to make them."""

    mini_batches: list[list[int]]
    rows: int
    dropped_zero_advantage: int
    dropped_other: int

    @property
    def skipped(self) -> bool:
        """No optimizer step this step (fewer rows than one mini-batch)."""
        return not self.mini_batches

    @property
    def kept(self) -> list[int]:
        """Every planned row, mini-batch after mini-batch."""
        return [i for batch in self.mini_batches for i in batch]


def check_plan_settings(mini_batch_rows: int, max_updates: int) -> None:
    """Refuse sizes the rule cannot use."""
    if mini_batch_rows < 0:
        raise ValueError(f"trainer.ppo_mini_batch_rows must be >= 0 (0: every row in each of updates_per_batch "
                         f"passes), got {mini_batch_rows}")
    if max_updates < 0:
        raise ValueError(f"trainer.max_ppo_updates must be >= 0 (0: no cap), got {max_updates}")


def n_updates(rows: int, mini_batch_rows: int, max_updates: int) -> int:
    """Optimizer steps for ``rows`` rows: ``rows // mini_batch_rows``, capped at ``max_updates`` (0: no cap)."""
    check_plan_settings(mini_batch_rows, max_updates)
    if mini_batch_rows == 0:
        raise ValueError("n_updates needs trainer.ppo_mini_batch_rows > 0")
    full = rows // mini_batch_rows
    return min(full, max_updates) if max_updates else full


def plan_updates(rows: Sequence[PlannedRow], mini_batch_rows: int, max_updates: int,
                 rng: random.Random) -> UpdatePlan:
    """The mini-batches of ``rows`` (see the module's docstring); ``rng`` picks the dropped rows."""
    keep_n = n_updates(len(rows), mini_batch_rows, max_updates) * mini_batch_rows
    to_drop = len(rows) - keep_n
    zero = [i for i, row in enumerate(rows) if row.advantage == 0]
    dropped = set(rng.sample(zero, min(to_drop, len(zero))))
    n_zero = len(dropped)
    others = [i for i in range(len(rows)) if i not in dropped]
    dropped.update(rng.sample(others, to_drop - n_zero))
    kept = [i for i in range(len(rows)) if i not in dropped]
    batches = [kept[start : start + mini_batch_rows] for start in range(0, keep_n, mini_batch_rows)]
    return UpdatePlan(batches, len(rows), n_zero, to_drop - n_zero)


class SizedRow(Protocol):
    """What micro-batching reads from a row."""

    input_ids: Sequence[int]


def micro_batches(rows: Sequence[SizedRow], max_rows: int, max_tokens: int) -> list[list[int]]:
    """Indices of ``rows`` cut into forward passes: rows sorted by length (stable, so ties keep their order), each
    micro-batch at most ``max_rows`` rows and, when ``max_tokens`` > 0, at most ``max_tokens`` padded tokens (rows x
    its longest row; a longer row goes alone). Every index appears once. The loss is a sum over rows divided by a
    fixed normalizer, so the cut changes only the float summation order, not the gradient; grouping by length keeps
    a few long rows from padding a whole micro-batch (measured on the miniature: 14-68 s an RL update with shuffled
    micro-batches of 32 rows of 470-500 tokens that held a 1,400-token row)."""
    if max_rows < 1:
        raise ValueError(f"trainer.micro_batch_rows must be >= 1, got {max_rows}")
    if max_tokens < 0:
        raise ValueError(f"trainer.micro_batch_tokens must be >= 0 (0: rows only), got {max_tokens}")
    order = sorted(range(len(rows)), key=lambda i: len(rows[i].input_ids))
    batches: list[list[int]] = []
    for index in order:
        width = len(rows[index].input_ids)  # the longest so far: rows come shortest first
        current = batches[-1] if batches else None
        fits = current is not None and len(current) < max_rows and (
            not max_tokens or (len(current) + 1) * width <= max_tokens)
        if fits:
            current.append(index)
        else:
            batches.append([index])
    return batches
