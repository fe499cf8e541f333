"""Chat answers as OpenAI Responses output (the answer side of :mod:`repro.proxy.openai_responses`): the ``response``
object for a whole chat body, and the SSE events of a streamed one, built from the chat chunks.

Output: a ``message`` item (one ``output_text`` part) for the text, then a ``function_call`` item per tool call
(``call_id`` the chat call's id); ids are ``resp_`` / ``msg_`` + the chat id and ``fc_`` + the call id. A ``length``
finish reason makes the response ``incomplete`` with reason ``max_output_tokens`` (``content_filter`` likewise) and
its last item ``incomplete``. Usage: the chat usage's counts (a stream: the recorded call's), no cached or reasoning
tokens. The request's ``instructions``, ``tools``, ``tool_choice``... are echoed, as the ``openai`` SDK's
``Response`` needs.

Stream order (what the ``openai`` SDK and Codex CLI read), each event with an increasing ``sequence_number``:
``response.created`` and ``response.in_progress`` at the first chunk; for text ``response.output_item.added`` (a
message), ``response.content_part.added``, then ``response.output_text.delta`` events; for each tool call
``response.output_item.added`` (a function_call with empty arguments), then ``response.function_call_arguments.delta``
events. The message is closed (``response.output_text.done``, ``response.content_part.done``,
``response.output_item.done``) when a tool call starts (text after a tool call opens a new message); the tool calls
and any open message are closed after the commit (:meth:`ResponsesStream.finish`), which ends the stream with
``response.completed`` (or ``response.incomplete``) carrying the whole response: the same object
:func:`chat_to_response` gives for the recorded body. An error ends the stream with an ``error`` event and
``response.failed`` (what Codex reads for the message).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson

from repro.proxy.dialects import chunk_deltas
from repro.proxy.errors import ProxyError
from repro.proxy.overflow import CODE, RESPONSES_MESSAGE, ContextExceeded
from repro.store import CallRecord

_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def response_meta(chat: dict[str, Any]) -> dict[str, Any]:
    """The response's id (``resp_`` + the chat id), creation time and model, from a chat body or its first chunk;
    ``base`` is the chat id the item ids derive from."""
    base = str(chat.get("id") or f"chatcmpl-{uuid.uuid4().hex}")
    created = chat.get("created")
    created_at = created if isinstance(created, int | float) and not isinstance(created, bool) else int(time.time())
    return {"base": base, "id": f"resp_{base}", "created_at": created_at, "model": chat.get("model")}


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [output_text(text)]}


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens}


def response_object(request: dict[str, Any], meta: dict[str, Any], status: str,
                    output: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``response`` object with the request's settings echoed (no usage yet)."""
    instructions, tools, metadata = request.get("instructions"), request.get("tools"), request.get("metadata")
    return {"id": meta["id"], "object": "response", "created_at": meta["created_at"], "status": status,
            "error": None, "incomplete_details": None, "model": str(request.get("model") or meta.get("model") or ""),
            "instructions": instructions if isinstance(instructions, str) else None, "output": output,
            "tools": tools if isinstance(tools, list) else [], "tool_choice": request.get("tool_choice") or "auto",
            "parallel_tool_calls": request.get("parallel_tool_calls") is not False,
            "temperature": request.get("temperature"), "top_p": request.get("top_p"),
            "max_output_tokens": request.get("max_output_tokens"),
            "metadata": metadata if isinstance(metadata, dict) else {}, "usage": None}


def finished_response(request: dict[str, Any], meta: dict[str, Any], output: list[dict[str, Any]],
                      finish_reason: str | None, input_tokens: int, output_tokens: int) -> dict[str, Any]:
    """The final ``response``: ``completed``, or ``incomplete`` (its last item too) when the model was cut off."""
    reason = _INCOMPLETE.get(finish_reason or "")
    if reason and output:
        output[-1]["status"] = "incomplete"
    response = response_object(request, meta, "incomplete" if reason else "completed", output)
    response["incomplete_details"] = {"reason": reason} if reason else None
    response["usage"] = usage(input_tokens, output_tokens)
    return response


def chat_to_response(body: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """The ``response`` for a (non-streamed) chat completion ``body`` answering the Responses ``request``."""
    meta = response_meta(body)
    choice = (body.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    output = []
    if message.get("content"):
        output.append(message_item(f"msg_{meta['base']}", message["content"], "completed"))
    for i, call in enumerate(message.get("tool_calls") or ()):
        function = call.get("function") or {}
        call_id = str(call.get("id") or f"call_{meta['base']}_{i}")
        output.append(call_item(f"fc_{call_id}", call_id, function.get("name") or "", function.get("arguments") or "",
                                "completed"))
    tokens = body.get("usage") or {}
    return finished_response(request, meta, output, choice.get("finish_reason"), tokens.get("prompt_tokens") or 0,
                             tokens.get("completion_tokens") or 0)


@dataclass
class _Item:
    """One output item being streamed: its text or arguments so far."""

    index: int
    item_id: str
    kind: str  # "message" or "function_call"
    call_id: str = ""
    name: str = ""
    parts: list[str] = field(default_factory=list)
    status: str = "in_progress"

    def body(self, status: str | None = None) -> dict[str, Any]:
        text, status = "".join(self.parts), status or self.status
        if self.kind == "message":
            return message_item(self.item_id, text, status)
        return call_item(self.item_id, self.call_id, self.name, text, status)

    def where(self) -> dict[str, Any]:
        return {"item_id": self.item_id, "output_index": self.index}


class ResponsesStream:
    """One streamed ``response``: its items opened as the chat deltas bring text and tool calls."""

    def __init__(self, request: dict[str, Any]) -> None:
        self.request = request
        self.meta: dict[str, Any] = {}
        self.items: list[_Item] = []
        self.message: _Item | None = None  # the open message item
        self.calls: dict[int, _Item] = {}  # function_call items by chat tool-call index
        self.seq = 0

    def events(self, chunk: dict[str, Any]) -> bytes:
        out = [self._start(chunk)]
        out += [self._text(value) if kind == "text" else self._call(value) for kind, value in chunk_deltas(chunk)]
        return b"".join(out)

    def finish(self, call: CallRecord) -> bytes:
        out = [self._start({})]
        cut = call.finish_reason in _INCOMPLETE
        for item in [item for item in self.items if item.status == "in_progress"]:
            out.append(self._close(item, "incomplete" if cut and item is self.items[-1] else "completed"))
        self.message = None
        response = finished_response(self.request, self.meta, [item.body() for item in self.items],
                                     call.finish_reason, _count(call.prompt_tokens, call.prompt_ids),
                                     _count(call.completion_tokens, call.completion_ids))
        out.append(self._emit(f"response.{response['status']}", {"response": response}))
        return b"".join(out)

    def error(self, error: ProxyError) -> bytes:
        out = [self._start({})]
        overflow = isinstance(error, ContextExceeded)
        if not overflow:  # an over-long input fails the response alone, as Codex's own fixture has it
            out.append(self._emit("error", {"code": error.kind, "message": error.message, "param": None}))
        output = [item.body("incomplete" if item.status == "in_progress" else None) for item in self.items]
        failed = response_object(self.request, self.meta, "failed", output)
        failed["error"] = ({"code": CODE, "message": RESPONSES_MESSAGE} if overflow
                           else {"code": "server_error", "message": error.message})
        out.append(self._emit("response.failed", {"response": failed}))
        return b"".join(out)

    def _start(self, chunk: dict[str, Any]) -> bytes:
        if self.meta:
            return b""
        self.meta = response_meta(chunk)
        created = response_object(self.request, self.meta, "in_progress", [])
        return self._emit("response.created", {"response": created}) + self._emit("response.in_progress",
                                                                                  {"response": created})

    def _text(self, text: str) -> bytes:
        out = b""
        if self.message is None:
            n = sum(item.kind == "message" for item in self.items)
            self.message, out = self._open("message", f"msg_{self.meta['base']}" + (f"_{n}" if n else ""))
            out += self._emit("response.content_part.added",
                              {**self.message.where(), "content_index": 0, "part": output_text("")})
        self.message.parts.append(text)
        return out + self._emit("response.output_text.delta",
                                {**self.message.where(), "content_index": 0, "delta": text, "logprobs": []})

    def _call(self, delta: dict[str, Any]) -> bytes:
        index, function = delta.get("index", 0), delta.get("function") or {}
        item, out = self.calls.get(index), b""
        if item is None:
            call_id = str(delta.get("id") or f"call_{self.meta['base']}_{index}")
            out = self._close_message()
            item, added = self._open("function_call", f"fc_{call_id}", call_id=call_id, name=function.get("name") or "")
            self.calls[index] = item
            out += added
        elif function.get("name"):
            item.name += function["name"]
        if function.get("arguments"):
            item.parts.append(function["arguments"])
            out += self._emit("response.function_call_arguments.delta", {**item.where(), "delta": item.parts[-1]})
        return out

    def _open(self, kind: str, item_id: str, **fields: Any) -> tuple[_Item, bytes]:
        """A new item and its ``response.output_item.added`` event (a message without content yet)."""
        item = _Item(len(self.items), item_id, kind, **fields)
        self.items.append(item)
        added = item.body()
        if kind == "message":
            added["content"] = []
        return item, self._emit("response.output_item.added", {"output_index": item.index, "item": added})

    def _close_message(self) -> bytes:
        if self.message is None:
            return b""
        item, self.message = self.message, None
        return self._close(item, "completed")

    def _close(self, item: _Item, status: str) -> bytes:
        item.status, text = status, "".join(item.parts)
        if item.kind == "message":
            where = {**item.where(), "content_index": 0}
            head = self._emit("response.output_text.done", {**where, "text": text, "logprobs": []})
            head += self._emit("response.content_part.done", {**where, "part": output_text(text)})
        else:
            head = self._emit("response.function_call_arguments.done", {**item.where(), "arguments": text})
        return head + self._emit("response.output_item.done", {"output_index": item.index, "item": item.body()})

    def _emit(self, kind: str, data: dict[str, Any]) -> bytes:
        payload = {"type": kind, **data, "sequence_number": self.seq}
        self.seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def _count(tokens: int | None, ids: list[int] | None) -> int:
    return tokens if tokens is not None else len(ids or ())
