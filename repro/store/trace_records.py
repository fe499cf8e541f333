"""Plain records exchanged with the store, and the compact encodings of token ids and logprobs."""

from __future__ import annotations

import sys
from array import array
from dataclasses import dataclass, field
from typing import Any

CONTEXT_EXCEEDED = "context_exceeded"  # a call the model server refused as longer than its context
CALL_STATUSES = ("ok", "error", "aborted", "truncated", CONTEXT_EXCEEDED)
INT32_LIMIT = 2**31  # token ids are stored as int32
ROLLOUT_STATUSES = ("pending", "running", "finished", "failed")


def encode_ids(ids: list[int] | array | None) -> bytes | None:
    """Token ids as little-endian int32 bytes (4 bytes a token); an int32 ``array`` is taken as it is."""
    if ids is None:
        return None
    as_is = isinstance(ids, array) and ids.typecode == "i" and sys.byteorder == "little"  # nothing to swap in place
    return _little_endian(ids if as_is else array("i", ids))


def decode_ids(blob: bytes | None) -> list[int] | None:
    """Inverse of :func:`encode_ids`."""
    return None if blob is None else _from_little_endian(blob, "i")


def encode_floats(values: list[float] | None) -> bytes | None:
    """Logprobs as little-endian float32 bytes."""
    return None if values is None else _little_endian(array("f", values))


def decode_floats(blob: bytes | None) -> list[float] | None:
    """Inverse of :func:`encode_floats`."""
    return None if blob is None else _from_little_endian(blob, "f")


def _little_endian(packed: array) -> bytes:
    """The bytes of ``packed`` (an array this module owns: swapped in place on a big-endian host)."""
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def _from_little_endian(blob: bytes, typecode: str) -> list:
    packed = array(typecode)
    packed.frombytes(blob)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tolist()


CALL_PURPOSES = ("policy", "auxiliary", "summary")  # what a call is for; harness side calls are not "policy"


@dataclass
class RolloutRecord:
    """One attempt at one task by one agent loop; the unit the trainer reads."""

    rollout_id: str
    run_id: str = ""
    task_id: str = ""
    group_id: str = ""
    loop_kind: str = "proxy"  # "proxy" (real harness) or "rebuilt" (trainer-owned loop)
    harness: str = ""
    harness_version: str = ""
    mode: str = "eval"  # "train", "eval", "demo" or "probe": selects the proxy's sampling overrides
    status: str = "pending"
    reward: float | None = None
    failure_reason: str | None = None
    created_at: float = 0.0
    finished_at: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class CallRecord:
    """One model call as the proxy saw it: what the model was shown and what it sampled.

    Token columns describe choice 0; other choices (n > 1) stay complete in ``response``.
    """

    rollout_id: str
    seq: int
    endpoint: str  # "chat" or "completions"
    status: str
    request: dict[str, Any] | None = None
    response: dict[str, Any] | None = None
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    http_status: int | None = None
    error: str | None = None
    streamed: bool = False
    retry_count: int | None = None
    client_headers: dict[str, str] = field(default_factory=dict)
    sampling_overrides: dict[str, Any] = field(default_factory=dict)
    t_start: float = 0.0
    t_first_byte: float | None = None
    t_end: float | None = None
    extends_previous: bool | None = None  # prompt extends the previous call of the same purpose
    purpose: str = "policy"  # "policy" | "auxiliary" (e.g. a title request) | "summary" (a condenser's call)
    policy_version: int | None = None  # the weights the server held when the call started (RL step; None: not set)
