"""Stored rollouts -> training rows (:mod:`repro.train.samples.rows` applied per rollout and group), and the
``repro inspect RUN ROLLOUT`` view of how a rollout's calls became rows ("calls -> rows").

Use in the loss: per row, the token mean of the per-token loss over ``loss_mask``; times ``weight``; summed
over the batch's rows and divided by the batch's total weight (:meth:`SampleSet.total_weight`, which with
``rollout`` weighting is the number of trainable rollouts). Rows whose ``logprobs_complete`` is False carry
NaN old logprobs on their sampled tokens.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from repro.train.samples.rows import (
    Fragment,
    SampleConfig,
    SkippedCall,
    advantages,
    capped,
    fragments,
    group_key,
    masked_reason,
    prompt_length,
    row_weights,
    training_reward,
)

if TYPE_CHECKING:  # the store package imports numpy; the CLI's parser imports this package
    from rich.console import RenderableType

    from repro.store import CallRecord, RolloutRecord, SqliteTraceStore


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


def _rows(rollout: RolloutRecord, parts: list[Fragment], masked: bool, advantage: float, config: SampleConfig,
          ) -> list[Row]:
    weights = [0.0] * len(parts) if masked else row_weights([p.n_sampled for p in parts], config.weighting)
    reward = None if masked else training_reward(rollout, config.failed_reward)
    return [
        Row(rollout.rollout_id, rollout.task_id, group_key(rollout), index, part.call_seqs, part.input_ids,
            part.loss_mask, part.old_logprobs, weight, advantage, reward,
            logprobs_complete=not part.missing_logprob_seqs)
        for index, (part, weight) in enumerate(zip(parts, weights, strict=True))
    ]


def capped_fragments(parts: list[Fragment], config: SampleConfig) -> tuple[list[Fragment], list[SkippedCall]]:
    """The fragments under ``config``'s length caps, and the calls of the dropped ones (with the reason)."""
    kept: list[Fragment] = []
    dropped: list[SkippedCall] = []
    for part in parts:
        out = capped(part, config.max_prompt_tokens, config.max_response_tokens)
        if out is None:
            reason = (f"row prompt of {prompt_length(part)} tokens > "
                      f"samples.max_prompt_tokens={config.max_prompt_tokens}")
            dropped.extend(SkippedCall(seq, reason) for seq in part.call_seqs)
        else:
            kept.append(out)
    return kept, dropped


def rollout_samples(rollout: RolloutRecord, calls: Sequence[CallRecord], advantage: float,
                    config: SampleConfig) -> RolloutSamples:
    """One rollout's rows and bookkeeping, given its (group-relative) advantage."""
    parts, skipped = fragments(calls, config.mode, config.train_purposes)
    parts, dropped = capped_fragments(parts, config)
    masked = masked_reason(rollout, config.include_modes, config.failed_reward, config.context_exceeded)
    advantage = 0.0 if masked else advantage
    return RolloutSamples(rollout.rollout_id, rollout.task_id, group_key(rollout), rollout.status,
                          training_reward(rollout, config.failed_reward), advantage, masked, len(calls),
                          _rows(rollout, parts, masked is not None, advantage, config), skipped + dropped)


def build_sample_set(pairs: Iterable[tuple[RolloutRecord, Sequence[CallRecord]]],
                     config: SampleConfig | None = None) -> SampleSet:
    """Rows of in-memory rollouts and their calls; advantages are relative to the groups among ``pairs``."""
    config = config or SampleConfig()
    pairs = list(pairs)
    by_rollout = advantages([r for r, _ in pairs], config.scale_rewards, config.eps, config.include_modes,
                            config.std_ddof, config.failed_reward, config.context_exceeded)
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


def _seqs(seqs: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    spans: list[list[int]] = []
    for seq in seqs:
        if spans and seq == spans[-1][1] + 1:
            spans[-1][1] = seq
        else:
            spans.append([seq, seq])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def header(info: RolloutSamples, config: SampleConfig) -> str:
    """One line: the rollout's status, reward and masking, and how rows are built."""
    reward = "-" if info.reward is None else f"{info.reward:g}"
    masked = f"MASKED ({info.masked})" if info.masked else "trained"
    return (f"rollout {info.rollout_id} -> rows: {info.status}, reward {reward}, {masked} · mode {config.mode}, "
            f"weighting {config.weighting}, scale {config.scale_rewards}")


def chain_labels(rows: list[Row], purposes: dict[int, str]) -> list[str]:
    """What each row is as a chain of the rollout's calls: its purpose, and whether it is that purpose's first
    chain or a new one (its first prompt extends no earlier row: a rewritten history, a subagent, a side call)."""
    seen: set[str] = set()
    labels = []
    for row in rows:
        purpose = purposes.get(row.call_seqs[0], "?")
        labels.append(f"{purpose}, {'new chain' if purpose in seen else 'first chain'}")
        seen.add(purpose)
    return labels


def rows_table(info: RolloutSamples, group: SampleSet, purposes: dict[int, str] | None = None) -> RenderableType:
    """For each row (a chain of calls): the calls merged, its token counts, weight and advantage (within the
    rollout's group)."""
    from rich.table import Table

    valid = sum(1 for r in group.rollouts.values() if r.masked is None)
    table = Table(title=f"calls -> rows of rollout {info.rollout_id} ({info.n_calls} calls, {len(info.rows)} rows)",
                  caption=f"advantage within group {info.group_id}: {len(group.rollouts)} rollouts, {valid} valid")
    for column in ("row", "chain", "call seqs", "tokens", "sampled (mask=1)", "masked out", "weight", "advantage",
                   "logprobs"):
        table.add_column(column, no_wrap=True)
    for row, chain in zip(info.rows, chain_labels(info.rows, purposes or {}), strict=True):
        table.add_row(str(row.row_index), chain, _seqs(row.call_seqs), str(row.n_tokens), str(row.n_sampled),
                      str(row.n_tokens - row.n_sampled), f"{row.weight:.4f}", f"{row.advantage:+.4f}",
                      "ok" if row.logprobs_complete else "MISSING (NaN)")
    return table


def skipped_line(skipped: list[SkippedCall]) -> str | None:
    """The calls that gave no rows, grouped by reason."""
    if not skipped:
        return None
    by_reason: dict[str, list[int]] = defaultdict(list)
    for call in skipped:
        by_reason[call.reason].append(call.seq)
    parts = [f"{reason}: seq {_seqs(seqs)}" for reason, seqs in by_reason.items()]
    return f"skipped calls ({len(skipped)}): " + "; ".join(parts)


def rows_view(store: SqliteTraceStore, rollout_id: str, config: SampleConfig | None = None) -> RenderableType:
    """``repro inspect RUN ROLLOUT``'s "calls -> rows": header, rows table and skipped calls of one rollout, its
    advantage taken within its group (rich imported here: only the terminal view needs it)."""
    from rich.console import Group
    from rich.text import Text

    config = config or SampleConfig()
    sample_set = group_sample_set(store, rollout_id, config)
    info = sample_set.rollouts[rollout_id]
    parts: list[RenderableType] = [Text(header(info, config))]
    purposes = {c.seq: c.purpose for c in store.calls(rollout_id)}
    parts.append(rows_table(info, sample_set, purposes) if info.rows else Text("no rows: no trainable call"))
    skipped = skipped_line(info.skipped)
    if skipped is not None:
        parts.append(Text(skipped))
    return Group(*parts)
