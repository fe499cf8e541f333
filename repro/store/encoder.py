"""Delta encoding of a call against the previous call of its rollout and purpose (for the writer thread).

A call whose prompt extends the previous call's prompt + completion stores only the new tokens (and only the
new messages); the previous call is taken from a small cache of what was committed, else read from the store.
Only committed calls enter the cache, so a call never references a prefix that is not in the store.

Token ids are checked here against ``[0, vocab_size)`` (int32 without a vocabulary), on the tokens a call adds
only: the prefix it shares with the previous call was checked when that call was written.
"""

from __future__ import annotations

import sqlite3
import sys
from array import array
from collections import OrderedDict
from dataclasses import replace

import numpy as np

from repro.store.codec import Previous, call_to_row, rebuild
from repro.store.drift import extends
from repro.store.trace_records import INT32_LIMIT, CallRecord, encode_ids

_UP_TO = ("SELECT rollout_id, seq, prompt_ids, completion_ids, request_json, prompt_prefix_len, messages_prefix_len, "
          "prefix_seq FROM calls WHERE rollout_id=? AND seq<=? ORDER BY seq")
_LAST_OF_PURPOSE = "SELECT max(seq) FROM calls WHERE rollout_id=? AND purpose=? AND seq<?"
Key = tuple[str, str]  # (rollout id, purpose)


class TokenRangeError(ValueError):
    """The upstream returned a token id outside the model's vocabulary (or a negative one)."""


def check_token_range(blob: bytes | None, name: str, first_index: int, vocab_size: int | None) -> None:
    """TokenRangeError when an id in ``blob`` (packed int32, starting at index ``first_index``) is outside
    ``[0, vocab_size)``."""
    if not blob:
        return
    limit = vocab_size or INT32_LIMIT
    if len(blob) <= 256 and sys.byteorder == "little":  # numpy's per-call cost only pays off on longer runs
        unsigned = array("I")
        unsigned.frombytes(blob)
        highest = max(unsigned)
    else:
        highest = int(np.frombuffer(blob, dtype="<u4").max())
    if highest < limit:  # a negative id reads as >= 2**31 unsigned
        return
    values = np.frombuffer(blob, dtype="<i4").tolist()
    bad = next(i for i, v in enumerate(values) if not 0 <= v < limit)
    where = f"the model's vocabulary of {vocab_size} tokens (proxy.vocab_size)" if vocab_size else "non-negative"
    raise TokenRangeError(f"upstream returned {name}[{first_index + bad}]={int(values[bad])}: not a token id in "
                          f"[0, {limit}) ({where})")


class CallEncoder:
    """Rows for calls, delta-encoded; ``pending`` holds calls encoded in the same (uncommitted) transaction."""

    def __init__(self, cache_rollouts: int = 4096, vocab_size: int | None = None) -> None:
        self._cache_rollouts = cache_rollouts
        self.vocab_size = vocab_size
        self._last: OrderedDict[Key, Previous] = OrderedDict()  # committed: (rollout, purpose) -> last written

    def encode(self, conn: sqlite3.Connection, call: CallRecord,
               pending: dict[Key, Previous] | None = None) -> tuple[tuple, Key, Previous]:
        """The row for ``call``, its key, and what the next call of that key will be compared with."""
        prompt = encode_ids(call.prompt_ids)
        completion = encode_ids(call.completion_ids)
        request = call.request
        messages = request.get("messages") if isinstance(request, dict) else None
        stored_prompt, prompt_prefix, stored_request, messages_prefix = prompt, 0, request, 0
        key = (call.rollout_id, call.purpose)
        previous = self._previous(conn, call, key, pending or {}) if call.seq > 0 else None
        if previous is not None and prompt is not None and previous.prompt is not None:
            call.extends_previous = extends(previous.prompt, previous.completion, prompt)
            if call.extends_previous:
                cut = len(previous.prompt) + len(previous.completion)
                stored_prompt, prompt_prefix = prompt[cut:], cut // 4
        if previous is not None and _extends_messages(previous.messages, messages):
            messages_prefix = len(previous.messages)
            stored_request = {**request, "messages": messages[messages_prefix:]}
        check_token_range(stored_prompt, "prompt_token_ids", prompt_prefix, self.vocab_size)
        check_token_range(completion, "token_ids", 0, self.vocab_size)
        base_seq = previous.seq if prompt_prefix or messages_prefix else None
        row = call_to_row(call, stored_request, stored_prompt, completion, prompt_prefix, messages_prefix, base_seq)
        return row, key, Previous(call.seq, prompt, completion or b"", messages)

    def committed(self, key: Key, previous: Previous) -> None:
        """Remember a committed call as the one the next call of ``key`` is compared with."""
        cached = self._last.get(key)
        if cached is not None and cached.seq > previous.seq:
            return
        self._last[key] = previous
        self._last.move_to_end(key)
        while len(self._last) > self._cache_rollouts:
            self._last.popitem(last=False)

    def forget(self, keys: list[Key]) -> None:
        """Drop cached entries (after a failed transaction they are read back from the store)."""
        for key in keys:
            self._last.pop(key, None)

    def _previous(self, conn: sqlite3.Connection, call: CallRecord, key: Key,
                  pending: dict[Key, Previous]) -> Previous | None:
        """The latest call of ``key`` before ``call``: uncommitted in this batch, cached, or read from the store."""
        for source in (pending, self._last):
            found = source.get(key)
            if found is not None and found.seq < call.seq:
                return found
        seq = conn.execute(_LAST_OF_PURPOSE, (call.rollout_id, call.purpose, call.seq)).fetchone()[0]
        if seq is None:
            return None
        rows = conn.execute(_UP_TO, (call.rollout_id, seq)).fetchall()
        prompt, request = rebuild(rows)[-1]
        messages = request.get("messages") if isinstance(request, dict) else None
        return Previous(seq, prompt, rows[-1]["completion_ids"] or b"", messages)


def failed_versions(call: CallRecord, reason: str, upstream_fault: bool) -> list[CallRecord]:
    """What to store when ``call`` cannot be: the call as a failure without its token columns, then (should that
    fail too) without its request and response as well."""
    error = reason if upstream_fault else f"the proxy could not store this call as received: {reason}"
    without_tokens = replace(call, status="error", error=error, prompt_ids=None, completion_ids=None, logprobs=None,
                             prompt_tokens=None, completion_tokens=None, extends_previous=None,
                             finish_reason=call.finish_reason if isinstance(call.finish_reason, str) else None)
    bare = replace(without_tokens, request=None, response=None, client_headers={}, sampling_overrides={})
    return [without_tokens, bare]


def _extends_messages(previous: list | None, messages: list | None) -> bool:
    """True when ``messages`` starts with all of ``previous`` (a non-empty list)."""
    if not previous or not isinstance(messages, list) or len(messages) < len(previous):
        return False
    return messages[: len(previous)] == previous
