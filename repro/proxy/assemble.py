"""Turn upstream responses (vLLM dialect) into what the store keeps (a :class:`CallRecord`'s token ids,
logprobs, usage counts and a compact body).

Token columns describe choice 0. vLLM puts ``prompt_token_ids`` at the top level for chat completions
and inside each choice for text completions; both places are read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from repro.store.trace_records import CallRecord


def _choice_logprobs(choice: dict[str, Any]) -> list[float] | None:
    logprobs = choice.get("logprobs")
    if not logprobs:
        return None
    if "content" in logprobs:  # chat format
        return [entry["logprob"] for entry in logprobs["content"] or ()]
    return logprobs.get("token_logprobs")  # text-completion format


def extract_response(body: dict[str, Any], call: CallRecord) -> None:
    """Fill ``call``'s token columns, finish reason, usage counts and stored body (``body`` without choice 0's token
    arrays) from a non-streaming response; on an unreadable body it raises before touching ``call``."""
    choices = body.get("choices") or []
    prompt_ids = body.pop("prompt_token_ids", None)
    completion_ids = logprobs = finish_reason = None
    if choices:
        first = dict(choices[0])
        completion_ids = first.pop("token_ids", None)
        logprobs = _choice_logprobs(first)
        first.pop("logprobs", None)
        if prompt_ids is None:
            prompt_ids = first.get("prompt_token_ids")
        first.pop("prompt_token_ids", None)
        finish_reason = first.get("finish_reason")
        body["choices"] = [first, *choices[1:]]
    usage = body.get("usage") or {}
    _set_tokens(call, prompt_ids, completion_ids, logprobs, finish_reason, usage.get("prompt_tokens"),
                usage.get("completion_tokens"))
    call.response = body


def _set_tokens(call: CallRecord, prompt_ids: list[int] | None, completion_ids: list[int] | None,
                logprobs: list[float] | None, finish_reason: str | None, prompt_tokens: int | None,
                completion_tokens: int | None) -> None:
    call.prompt_ids, call.completion_ids, call.logprobs = prompt_ids, completion_ids, logprobs
    call.finish_reason, call.prompt_tokens, call.completion_tokens = finish_reason, prompt_tokens, completion_tokens


class StreamFormatError(ValueError):
    """An SSE event the proxy cannot read as a completion chunk (not JSON, not an object, wrong field types)."""


@dataclass
class _ToolCall:
    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class StreamAccumulator:
    """Parses SSE bytes as they pass through and assembles choice 0 of the stream into one record."""

    def __init__(self, keep_chunks: bool = False) -> None:
        self._pending = b""
        self.keep_chunks = keep_chunks  # keep parsed chunks for :meth:`take_chunks` (a translating route's stream)
        self._chunks: list[dict[str, Any]] = []
        self.done = False
        self.meta: dict[str, Any] = {}
        self.prompt_ids: list[int] | None = None
        self.completion_ids: list[int] = []
        self.logprobs: list[float] = []
        self.has_logprobs = False
        self.content: list[str] = []
        self.text: list[str] = []
        self.tool_calls: dict[int, _ToolCall] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.upstream_error: str | None = None  # an error event the upstream sent mid-stream

    def feed(self, data: bytes) -> bytes:
        """Consume raw bytes from upstream (any split); returns the events this piece completed (what may be
        passed on: a client never gets half an event). StreamFormatError on an event that is not a chunk."""
        buffer = self._pending + data if self._pending else data
        end = buffer.rfind(b"\n\n")
        if end < 0:
            self._pending = buffer
            return b""
        complete, self._pending = buffer[: end + 2], buffer[end + 2 :]
        for line in complete.split(b"\n"):
            if line.startswith(b"data:"):
                self._on_data(line[5:].strip())
        return complete

    def _on_data(self, payload: bytes) -> None:
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            chunk = orjson.loads(payload)
            if chunk.get("object") in (None, "error"):  # not a completion chunk: vLLM's mid-stream error event
                self._on_error_event(chunk)
            self._on_chunk(chunk)
        except orjson.JSONDecodeError as exc:
            raise StreamFormatError(f"upstream sent an unreadable event ({exc}): {payload[:200]!r}") from None
        except (AttributeError, TypeError, KeyError, ValueError) as exc:
            what = "an event that is not a JSON object" if not isinstance(chunk, dict) else (
                f"a malformed chunk ({type(exc).__name__}: {exc})")
            raise StreamFormatError(f"upstream sent {what}: {payload[:200]!r}") from None

    def _on_error_event(self, chunk: dict[str, Any]) -> None:
        error = chunk.get("error", chunk if chunk.get("object") == "error" else None)
        if error is not None:
            message = error.get("message") if isinstance(error, dict) else error
            self.upstream_error = self.upstream_error or str(message)[:2000]

    def take_chunks(self) -> list[dict[str, Any]]:
        """The chunks parsed since the last call (only with ``keep_chunks``)."""
        chunks, self._chunks = self._chunks, []
        return chunks

    def _on_chunk(self, chunk: dict[str, Any]) -> None:
        if self.keep_chunks:
            self._chunks.append(chunk)
        if not self.meta:
            self.meta = {k: chunk.get(k) for k in ("id", "created", "model")}
        if chunk.get("prompt_token_ids") is not None:
            self.prompt_ids = chunk["prompt_token_ids"]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) == 0:
                self._on_choice(choice)

    def _on_choice(self, choice: dict[str, Any]) -> None:
        if choice.get("token_ids"):
            self.completion_ids.extend(choice["token_ids"])
        if self.prompt_ids is None and choice.get("prompt_token_ids") is not None:
            self.prompt_ids = choice["prompt_token_ids"]
        logprobs = _choice_logprobs(choice)
        if logprobs:
            self.has_logprobs = True
            self.logprobs.extend(logprobs)
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
        if "text" in choice:
            self.text.append(choice["text"] or "")
        delta = choice.get("delta") or {}
        if delta.get("content"):
            self.content.append(delta["content"])
        for call in delta.get("tool_calls") or ():
            self._on_tool_call(call)

    def _on_tool_call(self, call: dict[str, Any]) -> None:
        entry = self.tool_calls.setdefault(call.get("index", 0), _ToolCall())
        entry.id = call.get("id") or entry.id
        function = call.get("function") or {}
        entry.name += function.get("name") or ""
        entry.arguments.append(function.get("arguments") or "")

    def fill(self, call: CallRecord) -> None:
        """Fill ``call``'s token columns, finish reason, usage counts and stored body (a non-streaming-shaped response
        body without token arrays) from what was assembled."""
        usage = self.usage or {}
        _set_tokens(call, self.prompt_ids, self.completion_ids, self.logprobs if self.has_logprobs else None,
                    self.finish_reason, usage.get("prompt_tokens"),
                    usage.get("completion_tokens", len(self.completion_ids)))
        call.response = self._response(call.endpoint)

    def _response(self, endpoint: str) -> dict[str, Any]:
        if endpoint == "completions":
            choice: dict[str, Any] = {"index": 0, "text": "".join(self.text)}
        else:
            message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
            if self.tool_calls:
                message["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": "".join(c.arguments)}}
                    for _, c in sorted(self.tool_calls.items())
                ]
            choice = {"index": 0, "message": message}
        choice["finish_reason"] = self.finish_reason
        return {**self.meta, "choices": [choice], "usage": self.usage, "streamed": True}
