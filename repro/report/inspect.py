"""`repro inspect`: what a run recorded, rollout by rollout and call by call, readable in a terminal."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from repro.store import CallRecord, SqliteTraceStore, open_store


def _store_for(path: Path) -> SqliteTraceStore:
    db = path / "traces.sqlite" if path.is_dir() else path
    if not db.exists():
        raise SystemExit(f"no trace store at {db}: pass a run directory (outputs/...) or a traces.sqlite file")
    return open_store(db)


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


def inspect_path(path: Path, rollout_id: str | None = None) -> None:
    store = _store_for(path)
    out = console()
    if rollout_id is None:
        out.print(rollouts_table(store))
    else:
        if store.get_rollout(rollout_id) is None:
            raise SystemExit(f"no rollout {rollout_id!r} in {path}; `repro inspect {path}` lists them")
        out.print(calls_table(store, rollout_id))
