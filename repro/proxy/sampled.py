"""Checks on what the upstream says it sampled, before the proxy acknowledges a call.

The store keeps token ids as int32 and logprobs as float32 aligned with the sampled tokens, and the trainer
takes both as ground truth, so values that do not fit are refused by rule (the call is recorded as an upstream
error with the reason) instead of being stored wrong or crashing the writer:

- token ids (prompt and completion) must be integers that fit int32; the bound ``[0, proxy.vocab_size)`` is checked
  by the writer on the tokens a call adds (:mod:`repro.store.encoder`), so a long prompt is not scanned again on
  every turn;
- the ``logprobs`` column holds one finite number per sampled token. With ``echo: true`` vLLM puts the prompt's
  logprobs (the first one ``null``) in front of the completion's; those are scores of the prompt, not samples,
  so they are cut off and the column stays aligned with ``completion_ids``. A ``null`` or non-finite logprob
  for a sampled token, or a count that differs from the sampled tokens, is refused;
- usage counts must be non-negative integers the store can hold, and ``finish_reason`` a string.
"""

from __future__ import annotations

import math
from array import array
from typing import Any

from repro.store import CallRecord
from repro.store.trace_records import INT32_LIMIT

_INT64_LIMIT = 2**63


def check_sampled(call: CallRecord, request: dict[str, Any]) -> str | None:
    """Why ``call``'s tokens cannot be recorded as sampled (None when they can).

    On success the ids are packed as int32 arrays (what the store writes, so they are packed once) and echoed
    prompt logprobs are cut off ``call.logprobs``."""
    reason, prompt_ids = _pack_ids("prompt_token_ids", call.prompt_ids)
    if reason:
        return reason
    reason, completion_ids = _pack_ids("token_ids", call.completion_ids)
    if reason:
        return reason
    if call.logprobs is not None:
        reason = _check_logprobs(call, bool(request.get("echo")))
        if reason:
            return reason
    for name in ("prompt_tokens", "completion_tokens"):
        value = getattr(call, name)
        if value is not None and (type(value) is not int or not 0 <= value < _INT64_LIMIT):
            return f"upstream returned usage.{name}={value!r}: not a token count"
    if call.finish_reason is not None and not isinstance(call.finish_reason, str):
        return f"upstream returned finish_reason={call.finish_reason!r}: not a string"
    call.prompt_ids, call.completion_ids = prompt_ids, completion_ids
    return None


def _pack_ids(name: str, ids: Any) -> tuple[str | None, array | None]:
    """(why ``ids`` are not int32 integers, the ids packed as an int32 array)."""
    if ids is None:
        return None, None
    if not isinstance(ids, list | array):
        return f"upstream returned {name} that is not a list: {type(ids).__name__}", None
    try:
        return None, array("i", ids)  # in C: refuses non-integers and anything outside int32
    except (TypeError, OverflowError):
        bad = next(i for i, v in enumerate(ids) if type(v) is not int or not -INT32_LIMIT <= v < INT32_LIMIT)
        return f"upstream returned {name}[{bad}]={ids[bad]!r}: not a token id (an int32)", None


def _check_logprobs(call: CallRecord, echo: bool) -> str | None:
    logprobs = call.logprobs
    if not isinstance(logprobs, list):
        return f"upstream returned logprobs that are not a list: {type(logprobs).__name__}"
    sampled = len(call.completion_ids or ())
    prompt = len(call.prompt_ids or ())
    if echo and prompt and len(logprobs) == prompt + sampled:
        logprobs = call.logprobs = logprobs[prompt:]  # the echoed prompt's scores are not samples
    if call.completion_ids and len(logprobs) != sampled:
        return f"upstream returned {len(logprobs)} logprobs for {sampled} sampled tokens"
    try:
        finite = math.isfinite(sum(logprobs))  # NaN or an infinity anywhere makes the sum non-finite
    except TypeError:
        finite = False
    if not finite:
        bad = next(i for i, v in enumerate(logprobs) if type(v) not in (int, float) or not math.isfinite(v))
        return f"upstream returned logprob {logprobs[bad]!r} for sampled token {bad}: not a finite number"
    return None
