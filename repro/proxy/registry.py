"""Which rollouts exist, their mode, and the next call sequence number of each (in memory, backed by the store)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from repro.common.seeding import call_seed
from repro.proxy.errors import ProxyError, bad_request
from repro.proxy.validation import check_rollout_id
from repro.store import RolloutRecord, SqliteTraceStore

_ROLLOUT_FIELDS = {"rollout_id", "run_id", "task_id", "group_id", "loop_kind", "harness", "harness_version",
                   "mode", "metadata"}


@dataclass
class RolloutState:
    overrides: dict[str, Any]  # sampling fields forced on every call: the mode's, then the rollout's own
    next_seq: int


# demo: a scripted expert's demonstration (warm-start data); probe: the warm start probing RL tasks (the task filter)
ROLLOUT_MODES = ("train", "eval", "demo", "probe")


def rollout_overrides(record: RolloutRecord, by_mode: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The mode's overrides from config, updated with ``metadata["sampling"]`` of the rollout (e.g. a
    per-sample seed of a frozen evaluation)."""
    return {**(by_mode.get(record.mode) or {}), **(record.metadata.get("sampling") or {})}


class RolloutRegistry:
    """Known rollouts; an id not seen yet is looked up in the store (another process may have made it)."""

    def __init__(self, store: SqliteTraceStore, overrides_by_mode: dict[str, dict[str, Any]]) -> None:
        self._store = store
        self._by_mode = overrides_by_mode
        self._known: dict[str, RolloutState] = {}

    def lookup(self, rollout_id: str) -> RolloutState:
        """The rollout's state; 404 when no such rollout was registered."""
        state = self._known.get(rollout_id)
        if state is None:
            record = self._store.get_rollout(rollout_id)
            if record is None:
                raise ProxyError(404, f"unknown rollout {rollout_id!r}: create it first (POST /rollouts)",
                                 kind="not_found_error")
            state = RolloutState(rollout_overrides(record, self._by_mode), self._store.max_seq(rollout_id) + 1)
            self._known[rollout_id] = state
        return state

    def next_seq(self, rollout_id: str) -> tuple[int, dict[str, Any]]:
        """Reserve the next sequence number; returns (seq, the call's sampling overrides). A rollout's seed is
        not sent as is: each call gets its own, derived from it and ``seq`` (:func:`repro.common.seeding.call_seed`)."""
        state = self.lookup(rollout_id)
        seq = state.next_seq
        state.next_seq += 1
        overrides = state.overrides
        if isinstance(overrides.get("seed"), int) and not isinstance(overrides["seed"], bool):
            overrides = {**overrides, "seed": call_seed(overrides["seed"], seq)}
        return seq, overrides

    def create(self, fields: dict[str, Any]) -> RolloutRecord:
        """Register a rollout from a JSON body (unknown fields are a 400)."""
        unknown = set(fields) - _ROLLOUT_FIELDS
        if unknown:
            raise bad_request(f"unknown rollout fields {sorted(unknown)}; allowed: {sorted(_ROLLOUT_FIELDS)}")
        for name, value in fields.items():
            if name != "metadata" and not isinstance(value, str):
                raise bad_request(f"rollout field {name!r} must be a string")
        metadata = fields.get("metadata", {})
        if not isinstance(metadata, dict) or not isinstance(metadata.get("sampling", {}), dict):
            raise bad_request("rollout 'metadata' must be an object and its 'sampling' an object")
        if fields.get("mode", "eval") not in ROLLOUT_MODES:
            raise bad_request(f"rollout 'mode' must be one of {', '.join(ROLLOUT_MODES)}")
        rollout_id = fields.get("rollout_id") or uuid.uuid4().hex
        check_rollout_id(rollout_id)
        try:
            record = self._store.create_rollout(RolloutRecord(**{**fields, "rollout_id": rollout_id}))
        except ValueError as exc:
            raise ProxyError(409, str(exc), kind="conflict_error") from None
        self._known[rollout_id] = RolloutState(rollout_overrides(record, self._by_mode), next_seq=0)
        return record
