"""Row <-> record conversion for the SQLite store."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

import orjson

from repro.store.trace_records import CallRecord, RolloutRecord, decode_floats, decode_ids, encode_floats, encode_ids


def _dumps(value: Any) -> bytes | None:
    return None if value is None else orjson.dumps(value)


def _loads(blob: bytes | str | None) -> Any:
    return None if blob is None else orjson.loads(blob)


def _bool_or_none(value: int | None) -> bool | None:
    return None if value is None else bool(value)


class CorruptTraceError(RuntimeError):
    """A delta-encoded prompt or request whose previous call is missing or does not match."""


@dataclass
class Previous:
    """What the next call of a rollout is compared with: call ``seq``'s full prompt, completion and messages."""

    seq: int
    prompt: bytes | None
    completion: bytes
    messages: list | None


def call_to_row(call: CallRecord, request: dict[str, Any] | None, prompt_blob: bytes | None,
                completion_blob: bytes | None, prompt_prefix_len: int = 0, messages_prefix_len: int = 0,
                prefix_seq: int | None = None) -> tuple:
    """A CallRecord as a row tuple in CALL_COLUMNS order. ``request`` and ``prompt_blob`` are what is stored
    (only the new messages / tokens when the matching prefix length is > 0, taken from call ``prefix_seq``)."""
    return (
        call.rollout_id, call.seq, call.endpoint, call.status, _dumps(request), _dumps(call.response),
        prompt_blob, completion_blob, encode_floats(call.logprobs), call.finish_reason, call.prompt_tokens,
        call.completion_tokens, call.http_status, call.error, int(call.streamed), call.retry_count,
        _dumps(call.client_headers), _dumps(call.sampling_overrides), call.t_start, call.t_first_byte,
        call.t_end, None if call.extends_previous is None else int(call.extends_previous), prompt_prefix_len,
        messages_prefix_len, call.purpose, prefix_seq, call.policy_version,
    )


def _corrupt(row: sqlite3.Row, what: str, base_seq: int) -> CorruptTraceError:
    return CorruptTraceError(f"call {row['rollout_id']}#{row['seq']}: its {what} prefix from call "
                             f"#{base_seq} cannot be rebuilt")


def _base_seq(row: sqlite3.Row) -> int:
    """The call a delta-encoded row extends (``prefix_seq``; stores before version 5: the call before)."""
    keys = row.keys()
    return row["prefix_seq"] if "prefix_seq" in keys and row["prefix_seq"] is not None else row["seq"] - 1


def rebuild(rows: list[sqlite3.Row]) -> list[tuple[bytes | None, dict[str, Any] | None]]:
    """Full (prompt blob, request) for one rollout's rows given in seq order, undoing the delta encoding."""
    out: list[tuple[bytes | None, dict[str, Any] | None]] = []
    done: dict[int, Previous] = {}
    for row in rows:
        prompt, request = row["prompt_ids"], _loads(row["request_json"])
        base_seq = _base_seq(row)
        prev = done.get(base_seq)
        if row["prompt_prefix_len"]:
            if prev is None or prev.prompt is None:
                raise _corrupt(row, "prompt", base_seq)
            prefix = prev.prompt + prev.completion
            if len(prefix) != 4 * row["prompt_prefix_len"]:
                raise _corrupt(row, "prompt", base_seq)
            prompt = prefix + (prompt or b"")
        if row["messages_prefix_len"]:
            if prev is None or prev.messages is None or len(prev.messages) != row["messages_prefix_len"]:
                raise _corrupt(row, "messages", base_seq)
            request["messages"] = prev.messages + request["messages"]
        out.append((prompt, request))
        messages = request.get("messages") if isinstance(request, dict) else None
        done[row["seq"]] = Previous(row["seq"], prompt, row["completion_ids"] or b"", messages)
    return out


def row_to_call(row: sqlite3.Row, prompt_blob: bytes | None, request: dict[str, Any] | None) -> CallRecord:
    """Inverse of :func:`call_to_row` for a row read with all CALL_COLUMNS (full prompt and request passed in)."""
    return CallRecord(
        rollout_id=row["rollout_id"], seq=row["seq"], endpoint=row["endpoint"], status=row["status"],
        request=request, response=_loads(row["response_json"]),
        prompt_ids=decode_ids(prompt_blob), completion_ids=decode_ids(row["completion_ids"]),
        logprobs=decode_floats(row["logprobs"]), finish_reason=row["finish_reason"],
        prompt_tokens=row["prompt_tokens"], completion_tokens=row["completion_tokens"],
        http_status=row["http_status"], error=row["error"], streamed=bool(row["streamed"]),
        retry_count=row["retry_count"], client_headers=_loads(row["client_headers"]) or {},
        sampling_overrides=_loads(row["sampling_overrides"]) or {}, t_start=row["t_start"],
        t_first_byte=row["t_first_byte"], t_end=row["t_end"],
        extends_previous=_bool_or_none(row["extends_previous"]), purpose=row["purpose"],
        policy_version=row["policy_version"],
    )


def rollout_to_row(r: RolloutRecord) -> tuple:
    """A RolloutRecord as a row tuple in ROLLOUT_COLUMNS order."""
    return (
        r.rollout_id, r.run_id, r.task_id, r.group_id, r.loop_kind, r.harness, r.harness_version, r.mode,
        r.status, r.reward, r.failure_reason, r.created_at, r.finished_at, _dumps(r.metadata),
    )


def row_to_rollout(row: sqlite3.Row) -> RolloutRecord:
    """Inverse of :func:`rollout_to_row`."""
    return RolloutRecord(
        rollout_id=row["rollout_id"], run_id=row["run_id"], task_id=row["task_id"], group_id=row["group_id"],
        loop_kind=row["loop_kind"], harness=row["harness"], harness_version=row["harness_version"],
        mode=row["mode"], status=row["status"], reward=row["reward"], failure_reason=row["failure_reason"],
        created_at=row["created_at"], finished_at=row["finished_at"],
        metadata=_loads(row["metadata_json"]) or {},
    )


__all__ = ["call_to_row", "encode_ids", "rollout_to_row", "row_to_call", "row_to_rollout"]
