"""SQLite (WAL) implementation of the trace store and its small query API."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from repro.store import drift
from repro.store.codec import rebuild, rollout_to_row, row_to_call, row_to_rollout
from repro.store.schema import ADDED_CALL_COLUMNS, CALL_COLUMNS, DDL, PAGE_SIZE, ROLLOUT_COLUMNS, SCHEMA_VERSION
from repro.store.trace_records import ROLLOUT_STATUSES, CallRecord, RolloutRecord

_ROLLOUT_INSERT = (
    f"INSERT INTO rollouts ({', '.join(ROLLOUT_COLUMNS)}) VALUES ({', '.join('?' * len(ROLLOUT_COLUMNS))})"
)


@dataclass
class TraceStoreConfig:
    """Where the store lives and how hard it syncs.

    ``synchronous="NORMAL"`` in WAL mode survives a crash of any process (what the crash test checks);
    ``"FULL"`` also survives power loss, at one fsync per group commit.
    """

    path: str = "traces.sqlite"
    synchronous: str = "NORMAL"
    busy_timeout_ms: int = 10_000


def connect(config: TraceStoreConfig) -> sqlite3.Connection:
    """A new connection with the store's pragmas; creates the schema if needed."""
    if config.synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
        raise ValueError(f"synchronous must be OFF/NORMAL/FULL/EXTRA, got {config.synchronous!r}")
    Path(config.path).parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(config.path, isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout={int(config.busy_timeout_ms)}")
    conn.execute(f"PRAGMA page_size={PAGE_SIZE}")  # takes effect only when the file is new
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={config.synchronous.upper()}")
    conn.executescript(DDL)
    _add_missing_columns(conn)
    conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
    return conn


def _add_missing_columns(conn: sqlite3.Connection) -> None:
    """Bring a store written by an older version up to date (new columns only; their defaults fit old rows)."""
    present = {row[1] for row in conn.execute("PRAGMA table_info(calls)")}
    for name, ddl in ADDED_CALL_COLUMNS.items():
        if name not in present:
            try:
                conn.execute(f"ALTER TABLE calls ADD COLUMN {name} {ddl}")
            except sqlite3.OperationalError as exc:  # another process added it first
                if "duplicate column" not in str(exc):
                    raise


class SqliteTraceStore:
    """Runs, rollouts and calls behind a narrow API (so a server database could replace SQLite).

    One instance owns one connection; use it from one thread at a time. The proxy's writer thread
    opens its own connection (see :class:`repro.store.writer.GroupCommitWriter`).
    """

    def __init__(self, config: TraceStoreConfig) -> None:
        self.config = config
        self.conn = connect(config)

    def close(self) -> None:
        self.conn.close()

    # runs -----------------------------------------------------------------------------------------
    def create_run(self, run_id: str, config: dict[str, Any] | None = None) -> None:
        self.conn.execute(
            "INSERT OR IGNORE INTO runs VALUES (?, ?, ?)",
            (run_id, time.time(), None if config is None else orjson.dumps(config).decode()),
        )

    # rollouts -------------------------------------------------------------------------------------
    def create_rollout(self, rollout: RolloutRecord) -> RolloutRecord:
        """Insert a new rollout; raises ``ValueError`` if the id is taken."""
        if not rollout.created_at:
            rollout.created_at = time.time()
        try:
            self.conn.execute(_ROLLOUT_INSERT, rollout_to_row(rollout))
        except sqlite3.IntegrityError as exc:
            raise ValueError(f"rollout {rollout.rollout_id!r} already exists") from exc
        return rollout

    def finish_rollout(
        self, rollout_id: str, status: str, reward: float | None = None, failure_reason: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        """Set a rollout's final status, reward and (for failures) the reason; ``metadata`` entries are added to
        the rollout's (e.g. ``context_exceeded_seq``: it ended on a call refused as too long)."""
        if status not in ROLLOUT_STATUSES:
            raise ValueError(f"status must be one of {ROLLOUT_STATUSES}, got {status!r}")
        if metadata:
            rollout = self.get_rollout(rollout_id)
            if rollout is None:
                raise KeyError(f"unknown rollout {rollout_id!r}")
            merged = orjson.dumps({**rollout.metadata, **metadata})
            self.conn.execute("UPDATE rollouts SET metadata_json=? WHERE rollout_id=?", (merged, rollout_id))
        cur = self.conn.execute(
            "UPDATE rollouts SET status=?, reward=?, failure_reason=?, finished_at=? WHERE rollout_id=?",
            (status, reward, failure_reason, time.time(), rollout_id),
        )
        if cur.rowcount == 0:
            raise KeyError(f"unknown rollout {rollout_id!r}")

    def set_rollout_status(self, rollout_id: str, status: str) -> None:
        if status not in ROLLOUT_STATUSES:
            raise ValueError(f"status must be one of {ROLLOUT_STATUSES}, got {status!r}")
        self.conn.execute("UPDATE rollouts SET status=? WHERE rollout_id=?", (status, rollout_id))

    def get_rollout(self, rollout_id: str) -> RolloutRecord | None:
        row = self.conn.execute("SELECT * FROM rollouts WHERE rollout_id=?", (rollout_id,)).fetchone()
        return None if row is None else row_to_rollout(row)

    def list_rollouts(self, run_id: str | None = None) -> list[RolloutRecord]:
        if run_id is None:
            rows = self.conn.execute("SELECT * FROM rollouts ORDER BY created_at, rollout_id")
        else:
            rows = self.conn.execute(
                "SELECT * FROM rollouts WHERE run_id=? ORDER BY created_at, rollout_id", (run_id,)
            )
        return [row_to_rollout(r) for r in rows]

    # calls ----------------------------------------------------------------------------------------
    def calls(self, rollout_id: str) -> list[CallRecord]:
        """The rollout's calls in sequence order."""
        rows = self.conn.execute(
            f"SELECT {', '.join(CALL_COLUMNS)} FROM calls WHERE rollout_id=? ORDER BY seq", (rollout_id,)
        ).fetchall()
        return [row_to_call(r, prompt, request) for r, (prompt, request) in zip(rows, rebuild(rows), strict=True)]

    def stored_token_bytes(self) -> int:
        """Bytes of token-id blobs on disk (prompts after delta encoding, plus completions)."""
        row = self.conn.execute("SELECT sum(length(prompt_ids)), sum(length(completion_ids)) FROM calls").fetchone()
        return int((row[0] or 0) + (row[1] or 0))

    def max_seq(self, rollout_id: str) -> int:
        """Highest call sequence number recorded for the rollout (-1 when none)."""
        row = self.conn.execute("SELECT max(seq) FROM calls WHERE rollout_id=?", (rollout_id,)).fetchone()
        return -1 if row[0] is None else int(row[0])

    def count_calls(self, rollout_ids: Iterable[str] | None = None) -> int:
        if rollout_ids is None:
            return int(self.conn.execute("SELECT count(*) FROM calls").fetchone()[0])
        ids = list(rollout_ids)
        marks = ", ".join("?" * len(ids))
        sql = f"SELECT count(*) FROM calls WHERE rollout_id IN ({marks})"
        return int(self.conn.execute(sql, ids).fetchone()[0])

    def usage_by_rollout(self) -> dict[str, tuple[int, int, int]]:
        """rollout id -> (calls, prompt tokens, completion tokens) over every rollout with calls, in one query."""
        sql = ("SELECT rollout_id, count(*), coalesce(sum(prompt_tokens), 0), coalesce(sum(completion_tokens), 0) "
               "FROM calls GROUP BY rollout_id")
        return {row[0]: (int(row[1]), int(row[2]), int(row[3])) for row in self.conn.execute(sql)}

    def policy_versions(self, rollout_ids: Iterable[str]) -> dict[int | None, int]:
        """Calls of ``rollout_ids`` by the policy version that served them (``None``: no version was set)."""
        ids = list(rollout_ids)
        if not ids:
            return {}
        marks = ", ".join("?" * len(ids))
        sql = f"SELECT policy_version, count(*) FROM calls WHERE rollout_id IN ({marks}) GROUP BY policy_version"
        return {row[0]: int(row[1]) for row in self.conn.execute(sql, ids)}

    def call_outcomes(self, rollout_id: str) -> dict[str, Any]:
        """How a rollout's calls ended: counts by status, and the last call's status and finish reason."""
        counts = dict(self.conn.execute("SELECT status, count(*) FROM calls WHERE rollout_id=? GROUP BY status",
                                        (rollout_id,)).fetchall())
        last = self.conn.execute("SELECT status, finish_reason FROM calls WHERE rollout_id=? ORDER BY seq DESC "
                                 "LIMIT 1", (rollout_id,)).fetchone()
        return {"by_status": counts, "last_status": last[0] if last else None,
                "last_finish_reason": last[1] if last else None}

    # prefix drift ---------------------------------------------------------------------------------
    def drift_summary(self, rollout_id: str) -> drift.DriftSummary:
        """How often this rollout's prompts extended the previous call's prompt + completion."""
        rows = self.conn.execute(
            "SELECT seq, extends_previous FROM calls WHERE rollout_id=? ORDER BY seq", (rollout_id,)
        ).fetchall()
        return drift.summarise([(r[0], r[1]) for r in rows])

    def run_drift_summary(self, run_id: str) -> drift.RunDriftSummary:
        """Prefix drift over every rollout of a run."""
        per_rollout = [self.drift_summary(r.rollout_id) for r in self.list_rollouts(run_id)]
        return drift.summarise_run(per_rollout)

    def integrity_check(self) -> str:
        return str(self.conn.execute("PRAGMA integrity_check").fetchone()[0])


def open_store(path: str | Path, synchronous: str = "NORMAL") -> SqliteTraceStore:
    """Open (and create if needed) the store at ``path``."""
    return SqliteTraceStore(TraceStoreConfig(path=str(path), synchronous=synchronous))
