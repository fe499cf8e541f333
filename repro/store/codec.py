"""Row <-> record conversion for the SQLite store."""

from __future__ import annotations

import sqlite3
from typing import Any

import orjson

from repro.store.records import CallRecord, RolloutRecord, decode_floats, decode_ids, encode_floats, encode_ids


def _dumps(value: Any) -> bytes | None:
    return None if value is None else orjson.dumps(value)


def _loads(blob: bytes | str | None) -> Any:
    return None if blob is None else orjson.loads(blob)


def _bool_or_none(value: int | None) -> bool | None:
    return None if value is None else bool(value)


class CorruptTraceError(RuntimeError):
    """A delta-encoded prompt whose previous call is missing or does not match."""


def call_to_row(call: CallRecord, prompt_blob: bytes | None, completion_blob: bytes | None,
                prompt_prefix_len: int = 0) -> tuple:
    """A CallRecord as a row tuple in CALL_COLUMNS order (token blobs passed in, already encoded;
    ``prompt_blob`` is only the suffix when ``prompt_prefix_len`` > 0)."""
    return (
        call.rollout_id, call.seq, call.endpoint, call.status, _dumps(call.request), _dumps(call.response),
        prompt_blob, completion_blob, encode_floats(call.logprobs), call.finish_reason, call.prompt_tokens,
        call.completion_tokens, call.http_status, call.error, int(call.streamed), call.retry_count,
        _dumps(call.client_headers), _dumps(call.sampling_overrides), call.t_start, call.t_first_byte,
        call.t_end, None if call.extends_previous is None else int(call.extends_previous), prompt_prefix_len,
    )


def rebuild_prompts(rows: list[sqlite3.Row]) -> list[bytes | None]:
    """Full prompt blobs for one rollout's rows given in seq order (undoing the prefix delta encoding)."""
    full: list[bytes | None] = []
    prev_seq, prev_prompt, prev_completion = None, b"", b""
    for row in rows:
        blob, prefix_len = row["prompt_ids"], row["prompt_prefix_len"]
        if prefix_len:
            prefix = prev_prompt + prev_completion
            if prev_seq != row["seq"] - 1 or len(prefix) != 4 * prefix_len:
                raise CorruptTraceError(f"call {row['rollout_id']}#{row['seq']}: its prompt prefix "
                                        f"({prefix_len} tokens from call #{row['seq'] - 1}) cannot be rebuilt")
            blob = prefix + (blob or b"")
        full.append(blob)
        if blob is not None:
            prev_seq, prev_prompt, prev_completion = row["seq"], blob, row["completion_ids"] or b""
    return full


def row_to_call(row: sqlite3.Row, prompt_blob: bytes | None) -> CallRecord:
    """Inverse of :func:`call_to_row` for a row read with all CALL_COLUMNS (full prompt blob passed in)."""
    return CallRecord(
        rollout_id=row["rollout_id"], seq=row["seq"], endpoint=row["endpoint"], status=row["status"],
        request=_loads(row["request_json"]), response=_loads(row["response_json"]),
        prompt_ids=decode_ids(prompt_blob), completion_ids=decode_ids(row["completion_ids"]),
        logprobs=decode_floats(row["logprobs"]), finish_reason=row["finish_reason"],
        prompt_tokens=row["prompt_tokens"], completion_tokens=row["completion_tokens"],
        http_status=row["http_status"], error=row["error"], streamed=bool(row["streamed"]),
        retry_count=row["retry_count"], client_headers=_loads(row["client_headers"]) or {},
        sampling_overrides=_loads(row["sampling_overrides"]) or {}, t_start=row["t_start"],
        t_first_byte=row["t_first_byte"], t_end=row["t_end"],
        extends_previous=_bool_or_none(row["extends_previous"]),
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
