"""Trace store: runs, rollouts and the calls made under them (SQLite in WAL mode by default)."""

from repro.store.sqlite_store import SqliteTraceStore, TraceStoreConfig, open_store
from repro.store.trace_records import CallRecord, RolloutRecord, decode_floats, decode_ids, encode_floats, encode_ids
from repro.store.writer import GroupCommitWriter

__all__ = [
    "CallRecord",
    "GroupCommitWriter",
    "RolloutRecord",
    "SqliteTraceStore",
    "TraceStoreConfig",
    "decode_floats",
    "decode_ids",
    "encode_floats",
    "encode_ids",
    "open_store",
]
