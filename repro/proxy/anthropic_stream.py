"""Anthropic Messages as a :class:`~repro.proxy.dialects.Dialect`: a streamed Message built from chat chunks, errors in
Anthropic's format.

Stream order (what the ``anthropic`` SDK reads): ``message_start`` at the first chunk (its ``usage.input_tokens``
from the prompt's token ids), then for each text run or tool call a ``content_block_start``, its deltas
(``text_delta`` / ``input_json_delta``) and a ``content_block_stop``; after the commit ``message_delta`` (stop
reason, output tokens) and ``message_stop``.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson

from repro.proxy.anthropic_messages import STOP_REASONS, chat_to_message, message_id, messages_to_chat
from repro.proxy.dialects import Translated, chunk_deltas
from repro.proxy.errors import ProxyError
from repro.proxy.overflow import ContextExceeded
from repro.store import CallRecord

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 504: "timeout_error"}


def event(kind: str, data: dict[str, Any]) -> bytes:
    """One SSE event with Anthropic's ``event:`` line."""
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


def error_object(error: ProxyError) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(error.status, "api_error" if error.status >= 500 else "invalid_request_error")
    message = error.anthropic_message() if isinstance(error, ContextExceeded) else error.message
    return {"type": kind, "message": message}


class MessagesDialect:
    """``/v1/messages``: Anthropic Messages served by the upstream's chat completions."""

    api = "messages"
    overflow_in_stream = False  # Anthropic refuses an over-long prompt before any event: HTTP 400

    def to_chat(self, request: dict[str, Any]) -> Translated:
        return messages_to_chat(request)

    def response(self, body: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
        return chat_to_message(body, str(request.get("model", "")))

    def stream(self, request: dict[str, Any]) -> MessagesStream:
        return MessagesStream(str(request.get("model", "")))

    def error_body(self, error: ProxyError) -> bytes:
        return orjson.dumps({"type": "error", "error": error_object(error)})


class MessagesStream:
    """One streamed Message: content blocks opened and closed as the chat deltas switch between text and tools."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.started = False
        self.index = -1  # the open block's index
        self.open: tuple[str, int] | None = None  # ("text", 0) or ("tool", chat tool-call index)

    def events(self, chunk: dict[str, Any]) -> bytes:
        out = [] if self.started else [self._start(chunk)]
        self.started = True
        out += [self._text(value) if kind == "text" else self._tool(value) for kind, value in chunk_deltas(chunk)]
        return b"".join(out)

    def finish(self, call: CallRecord) -> bytes:
        out = [] if self.started else [self._start({"id": None})]
        out.append(self._close())
        stop = STOP_REASONS.get(call.finish_reason or "stop", "end_turn")
        out.append(event("message_delta", {"delta": {"stop_reason": stop, "stop_sequence": None},
                                           "usage": {"output_tokens": call.completion_tokens or 0}}))
        out.append(event("message_stop", {}))
        return b"".join(out)

    def error(self, error: ProxyError) -> bytes:
        return event("error", {"error": error_object(error)})

    def _start(self, chunk: dict[str, Any]) -> bytes:
        prompt = chunk.get("prompt_token_ids") or ()
        message = {"id": message_id(chunk.get("id")), "type": "message", "role": "assistant", "model": self.model,
                   "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": len(prompt), "output_tokens": 0}}
        return event("message_start", {"message": message})

    def _text(self, text: str) -> bytes:
        head = b""
        if self.open != ("text", 0):
            head = self._close() + self._open(("text", 0), {"type": "text", "text": ""})
        return head + event("content_block_delta", {"index": self.index, "delta": {"type": "text_delta", "text": text}})

    def _tool(self, call: dict[str, Any]) -> bytes:
        key = ("tool", int(call.get("index", 0)))
        function = call.get("function") or {}
        head = b""
        if self.open != key:
            block = {"type": "tool_use", "id": call.get("id") or f"toolu_{uuid.uuid4().hex[:24]}",
                     "name": function.get("name") or "", "input": {}}
            head = self._close() + self._open(key, block)
        arguments = function.get("arguments") or ""
        if not arguments:
            return head
        delta = {"type": "input_json_delta", "partial_json": arguments}
        return head + event("content_block_delta", {"index": self.index, "delta": delta})

    def _open(self, key: tuple[str, int], block: dict[str, Any]) -> bytes:
        self.index += 1
        self.open = key
        return event("content_block_start", {"index": self.index, "content_block": block})

    def _close(self) -> bytes:
        if self.open is None:
            return b""
        self.open = None
        return event("content_block_stop", {"index": self.index})

