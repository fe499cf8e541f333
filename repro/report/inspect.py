"""`repro inspect`: what a run recorded, readable in a terminal.

``repro inspect RUN`` opens with a summary of every rollout the run holds (its trace stores and the reports of
every phase folder: ``repro.report.rollout_index``) by phase, rollout mode and outcome, then lists the rollouts
``--phase`` / ``--outcome`` select, one table per outcome cut at ``--limit`` rows (the reasons of each verdict;
store-only rollouts with their prefix drift). ``repro inspect RUN ROLLOUT_OR_INSTANCE`` shows a
rollout's turns (action, observation) and the grader's verdict, then its calls table and how its calls became
training rows (``repro.train.samples``: merge mode, weighting, advantage within its group).
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from repro.report.rollout_index import index_run, select
from repro.report.run_layout import STORE_FILE, scan_run
from repro.report.run_view import Selection, resolve_target, run_overview
from repro.report.turns import rollout_view
from repro.store import CallRecord, SqliteTraceStore, open_store
from repro.train.samples import SampleConfig, rows_view


def _locate(path: Path) -> tuple[Path, list[Path] | None]:
    """(the run directory, the trace stores to read: ``None`` for every store under the run)."""
    if path.is_file():
        return path.parent, [path]
    if path.is_dir() and scan_run(path).stores:
        return path, None
    raise SystemExit(f"no trace store at {path / STORE_FILE}: pass a run directory (outputs/...) or a traces.sqlite "
                     "file")


def _message_text(call: CallRecord, limit: int = 160) -> str:
    choices = (call.response or {}).get("choices") or [{}]
    choice = choices[0]
    message = choice.get("message") or {}
    parts = []
    if message.get("content") or choice.get("text"):
        parts.append(message.get("content") or choice.get("text"))
    for tool_call in message.get("tool_calls") or ():
        fn = tool_call.get("function") or {}
        parts.append(f"<tool {fn.get('name')}: {fn.get('arguments')}>")
    text = " ".join(parts).replace("\n", "\\n") if parts else (call.error or "")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def rollouts_table(store: SqliteTraceStore) -> Table:
    table = Table(title="rollouts")
    for column in ("rollout", "task", "harness", "mode", "status", "reward", "calls", "prefix extends", "failure"):
        table.add_column(column)
    for r in store.list_rollouts():
        drift = store.drift_summary(r.rollout_id)
        extends = f"{drift.extending}/{drift.comparable}" if drift.comparable else "-"
        table.add_row(r.rollout_id, r.task_id, f"{r.harness}@{r.harness_version}".strip("@"), r.mode, r.status,
                      "-" if r.reward is None else f"{r.reward:g}", str(drift.calls), extends, r.failure_reason or "")
    return table


def calls_table(store: SqliteTraceStore, rollout_id: str) -> Table:
    table = Table(title=f"calls of rollout {rollout_id}")
    for column in ("seq", "status", "stream", "prompt ids", "completion ids", "finish", "extends prev", "retry",
                   "ms"):
        table.add_column(column, no_wrap=True)
    table.add_column("assistant", overflow="ellipsis", no_wrap=True, max_width=60)
    for c in store.calls(rollout_id):
        ms = "-" if c.t_end is None else f"{1000 * (c.t_end - c.t_start):.0f}"
        extends = "-" if c.extends_previous is None else ("yes" if c.extends_previous else "NO")
        table.add_row(str(c.seq), c.status, "y" if c.streamed else "n", str(len(c.prompt_ids or [])),
                      str(len(c.completion_ids or [])), c.finish_reason or "-", extends,
                      "-" if c.retry_count is None else str(c.retry_count), ms, _message_text(c))
    return table


def console() -> Console:
    """A console that stays wide when output is piped (tables would otherwise fold into unreadable columns)."""
    plain = Console()
    return plain if plain.is_terminal else Console(width=160)


def inspect_path(path: Path, target: str | None = None, samples: SampleConfig | None = None,
                 selection: Selection | None = None) -> None:
    """``target``: a rollout id, or an instance id of the run (its samples in every phase); ``samples``: how rows
    are built; ``selection``: which rollouts the run's listing shows (phases, outcomes, rows per table)."""
    run_dir, stores = _locate(Path(path))
    entries = index_run(run_dir, stores)
    out = console()
    if target is None:
        selection = selection or Selection()
        for part in run_overview(run_dir, entries, select(entries, selection.phases, selection.outcomes), selection):
            out.print(part)
        return
    chosen = resolve_target(entries, target)
    if not chosen:
        raise SystemExit(f"no rollout or instance {target!r} in {path}; `repro inspect {path}` lists them")
    for entry in chosen:
        if entry.store is None or entry.rollout is None:
            out.print(f"rollout {entry.rollout_id} has a report but is not in the trace store")
            continue
        store = open_store(entry.store)
        try:
            out.print(rollout_view(entry.rollout, store.calls(entry.rollout_id), entry.report))
            out.print(calls_table(store, entry.rollout_id))
            out.print(rows_view(store, entry.rollout_id, samples))
        finally:
            store.close()
