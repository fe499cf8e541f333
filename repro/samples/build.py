"""Stored rollouts -> training rows: fragments, row weights and group-relative advantages together.

Use in the loss: per row, the token mean of the per-token loss over ``loss_mask``; times ``weight``; summed
over the batch's rows and divided by the batch's total weight (:meth:`SampleSet.total_weight`, which with
``rollout`` weighting is the number of trainable rollouts). Rows whose ``logprobs_complete`` is False carry
NaN old logprobs on their sampled tokens.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from repro.samples.advantages import advantages, check_scale, group_key, masked_reason
from repro.samples.rows import DEFAULT_TRAIN_PURPOSES, Fragment, SkippedCall, check_mode, fragments
from repro.samples.weights import check_weighting, row_weights
from repro.store import CallRecord, RolloutRecord, SqliteTraceStore
from repro.store.records import CALL_PURPOSES


@dataclass(frozen=True)
class SampleConfig:
    """How rollouts become rows (see :mod:`repro.samples.rows`, ``weights`` and ``advantages``)."""

    mode: str = "prefix_merge"  # "per_call" | "prefix_merge"
    weighting: str = "rollout"  # "rollout" | "fragment"
    scale_rewards: str = "group"  # "group": (r - mean) / (std + eps) | "none": r - mean
    eps: float = 1e-4
    include_modes: tuple[str, ...] | None = None  # rollout modes to train on (None: all); others are masked
    train_purposes: tuple[str, ...] = DEFAULT_TRAIN_PURPOSES  # call purposes to train on (auxiliary: skipped)

    def __post_init__(self) -> None:
        check_mode(self.mode)
        check_weighting(self.weighting)
        check_scale(self.scale_rewards)
        if not self.eps > 0:
            raise ValueError(f"eps must be > 0; got {self.eps!r}")
        if isinstance(self.include_modes, str):
            raise ValueError(f"include_modes must be a tuple of modes, e.g. ('train',); got {self.include_modes!r}")
        if isinstance(self.train_purposes, str) or not set(self.train_purposes) <= set(CALL_PURPOSES):
            raise ValueError(f"train_purposes must be a tuple of {', '.join(CALL_PURPOSES)}; "
                             f"got {self.train_purposes!r}")
        object.__setattr__(self, "train_purposes", tuple(self.train_purposes))


@dataclass
class Row:
    """One training row: a token sequence, where the loss applies, and how much it counts."""

    rollout_id: str
    task_id: str
    group_id: str
    row_index: int
    call_seqs: list[int]
    input_ids: list[int]
    loss_mask: list[int]
    old_logprobs: list[float]
    weight: float
    advantage: float
    reward: float | None
    logprobs_complete: bool = True

    @property
    def n_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def n_sampled(self) -> int:
        return sum(self.loss_mask)


@dataclass
class RolloutSamples:
    """What became of one rollout: its rows (weight 0 when masked) and the calls it skipped."""

    rollout_id: str
    task_id: str
    group_id: str
    status: str
    reward: float | None
    advantage: float
    masked: str | None  # why the rollout is not trained on; None when it is
    n_calls: int
    rows: list[Row] = field(default_factory=list)
    skipped: list[SkippedCall] = field(default_factory=list)

    @property
    def n_rows(self) -> int:
        return len(self.rows)


@dataclass
class SampleSet:
    """The trainable rows of a set of rollouts, plus per-rollout bookkeeping."""

    config: SampleConfig
    rows: list[Row]
    rollouts: dict[str, RolloutSamples]

    def total_weight(self) -> float:
        return sum(r.weight for r in self.rows)

    def stats(self) -> dict[str, float]:
        """Counts for logging."""
        trainable = [r for r in self.rollouts.values() if r.masked is None and r.rows]
        return {
            "rows": len(self.rows),
            "rollouts": len(self.rollouts),
            "masked_rollouts": sum(1 for r in self.rollouts.values() if r.masked is not None),
            "rollouts_without_rows": sum(1 for r in self.rollouts.values() if r.masked is None and not r.rows),
            "sampled_tokens": sum(r.n_sampled for r in self.rows),
            "total_tokens": sum(r.n_tokens for r in self.rows),
            "mean_rows_per_rollout": len(self.rows) / len(trainable) if trainable else 0.0,
            "rows_missing_logprobs": sum(1 for r in self.rows if not r.logprobs_complete),
            "skipped_calls": sum(len(r.skipped) for r in self.rollouts.values()),
        }


def _rows(rollout: RolloutRecord, parts: list[Fragment], masked: bool, advantage: float, weighting: str) -> list[Row]:
    weights = [0.0] * len(parts) if masked else row_weights([p.n_sampled for p in parts], weighting)
    return [
        Row(rollout.rollout_id, rollout.task_id, group_key(rollout), index, part.call_seqs, part.input_ids,
            part.loss_mask, part.old_logprobs, weight, advantage, None if masked else rollout.reward,
            logprobs_complete=not part.missing_logprob_seqs)
        for index, (part, weight) in enumerate(zip(parts, weights, strict=True))
    ]


def rollout_samples(rollout: RolloutRecord, calls: Sequence[CallRecord], advantage: float,
                    config: SampleConfig) -> RolloutSamples:
    """One rollout's rows and bookkeeping, given its (group-relative) advantage."""
    parts, skipped = fragments(calls, config.mode, config.train_purposes)
    masked = masked_reason(rollout, config.include_modes)
    advantage = 0.0 if masked else advantage
    return RolloutSamples(rollout.rollout_id, rollout.task_id, group_key(rollout), rollout.status, rollout.reward,
                          advantage, masked, len(calls), _rows(rollout, parts, masked is not None, advantage,
                                                               config.weighting), skipped)


def build_sample_set(pairs: Iterable[tuple[RolloutRecord, Sequence[CallRecord]]],
                     config: SampleConfig | None = None) -> SampleSet:
    """Rows of in-memory rollouts and their calls; advantages are relative to the groups among ``pairs``."""
    config = config or SampleConfig()
    pairs = list(pairs)
    by_rollout = advantages([r for r, _ in pairs], config.scale_rewards, config.eps, config.include_modes)
    rollouts = {r.rollout_id: rollout_samples(r, calls, by_rollout[r.rollout_id], config) for r, calls in pairs}
    rows = [row for info in rollouts.values() if info.masked is None for row in info.rows]
    return SampleSet(config, rows, rollouts)


def _select(store: SqliteTraceStore, target: str | Sequence[str]) -> list[RolloutRecord]:
    if isinstance(target, str):
        return store.list_rollouts(target)
    selected = []
    for rollout_id in target:
        rollout = store.get_rollout(rollout_id)
        if rollout is None:
            raise KeyError(f"unknown rollout {rollout_id!r}")
        selected.append(rollout)
    return selected


def build_rows(store: SqliteTraceStore, target: str | Sequence[str], config: SampleConfig | None = None) -> SampleSet:
    """Rows of a run's rollouts (``target`` a run id) or of the listed rollout ids, read from ``store``."""
    return build_sample_set(((r, store.calls(r.rollout_id)) for r in _select(store, target)), config)


def group_sample_set(store: SqliteTraceStore, rollout_id: str, config: SampleConfig | None = None) -> SampleSet:
    """Rows of the rollout's whole group (same run, same group key), so its advantage is the trained one."""
    rollout = store.get_rollout(rollout_id)
    if rollout is None:
        raise KeyError(f"unknown rollout {rollout_id!r}")
    key = group_key(rollout)
    members = [r for r in store.list_rollouts(rollout.run_id) if group_key(r) == key]
    return build_sample_set(((r, store.calls(r.rollout_id)) for r in members), config)
