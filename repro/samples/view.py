"""`repro inspect RUN ROLLOUT`: how a rollout's calls became training rows ("calls -> rows")."""

from __future__ import annotations

from collections import defaultdict

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from repro.samples.build import RolloutSamples, SampleConfig, SampleSet, group_sample_set
from repro.samples.rows import SkippedCall
from repro.store import SqliteTraceStore


def _seqs(seqs: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    spans: list[list[int]] = []
    for seq in seqs:
        if spans and seq == spans[-1][1] + 1:
            spans[-1][1] = seq
        else:
            spans.append([seq, seq])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def header(info: RolloutSamples, config: SampleConfig) -> Text:
    """One line: the rollout's status, reward and masking, and how rows are built."""
    reward = "-" if info.reward is None else f"{info.reward:g}"
    masked = f"MASKED ({info.masked})" if info.masked else "trained"
    return Text(f"rollout {info.rollout_id} -> rows: {info.status}, reward {reward}, {masked} · mode {config.mode}, "
                f"weighting {config.weighting}, scale {config.scale_rewards}")


def rows_table(info: RolloutSamples, group: SampleSet) -> Table:
    """For each row: the calls merged, its token counts, weight and advantage (within the rollout's group)."""
    valid = sum(1 for r in group.rollouts.values() if r.masked is None)
    table = Table(title=f"calls -> rows of rollout {info.rollout_id} ({info.n_calls} calls, {info.n_rows} rows)",
                  caption=f"advantage within group {info.group_id}: {len(group.rollouts)} rollouts, {valid} valid")
    for column in ("row", "call seqs", "tokens", "sampled (mask=1)", "masked out", "weight", "advantage",
                   "logprobs"):
        table.add_column(column, no_wrap=True)
    for row in info.rows:
        table.add_row(str(row.row_index), _seqs(row.call_seqs), str(row.n_tokens), str(row.n_sampled),
                      str(row.n_tokens - row.n_sampled), f"{row.weight:.4f}", f"{row.advantage:+.4f}",
                      "ok" if row.logprobs_complete else "MISSING (NaN)")
    return table


def skipped_line(skipped: list[SkippedCall]) -> Text | None:
    """The calls that gave no rows, grouped by reason."""
    if not skipped:
        return None
    by_reason: dict[str, list[int]] = defaultdict(list)
    for call in skipped:
        by_reason[call.reason].append(call.seq)
    parts = [f"{reason}: seq {_seqs(seqs)}" for reason, seqs in by_reason.items()]
    return Text(f"skipped calls ({len(skipped)}): " + "; ".join(parts))


def samples_view(store: SqliteTraceStore, rollout_id: str, config: SampleConfig | None = None) -> RenderableType:
    """Header, calls -> rows table and skipped calls of one rollout, its advantage taken within its group."""
    config = config or SampleConfig()
    sample_set = group_sample_set(store, rollout_id, config)
    info = sample_set.rollouts[rollout_id]
    parts: list[RenderableType] = [header(info, config)]
    parts.append(rows_table(info, sample_set) if info.rows else Text("no rows: no trainable call"))
    skipped = skipped_line(info.skipped)
    if skipped is not None:
        parts.append(skipped)
    return Group(*parts)
