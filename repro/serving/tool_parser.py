"""Hermes-style tool-call parsing (what vLLM's ``--tool-call-parser hermes`` does for Qwen models).

A model emits tool calls as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks.
:func:`parse_tool_calls` turns a finished completion into OpenAI ``tool_calls``;
:class:`StreamingToolParser` does the same incrementally for streamed text deltas.

Conventions (mirroring vLLM):
- content is the text before the first ``<tool_call>``; text between or after blocks is dropped;
- content is ``None`` when a tool call exists and the text before it is empty or whitespace;
- a block whose body is not a JSON object with a string ``name`` invalidates the whole parse:
  the full text becomes the content and there are no tool calls (non-streaming);
- an unclosed final ``<tool_call>`` block is still parsed if its body is valid JSON.

Streaming differs from non-streaming only when one text mixes valid and invalid blocks: what was sent
cannot be taken back, so streaming sends each valid call and passes an invalid block's text as content
(until the first call was sent; after it, non-call text is dropped as in the non-streaming parser).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"

_BLOCK_RE = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


def new_tool_call_id() -> str:
    """A fresh OpenAI-style tool call id: ``call_`` + 24 random hex digits."""
    return "call_" + secrets.token_hex(12)


def _parse_block(body: str) -> tuple[str, str] | None:
    """(name, arguments JSON string) of one block body, or None when it is not a valid call."""
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get("arguments", {})
    return obj["name"], json.dumps(arguments, ensure_ascii=False)


def _tool_call(name: str, arguments: str, make_id: Callable[[], str]) -> dict[str, Any]:
    return {"id": make_id(), "type": "function", "function": {"name": name, "arguments": arguments}}


def parse_tool_calls(
    text: str, make_id: Callable[[], str] = new_tool_call_id
) -> tuple[str | None, list[dict[str, Any]]]:
    """Split a finished completion into (content, OpenAI ``tool_calls``)."""
    start = text.find(TOOL_CALL_START)
    if start < 0:
        return text, []
    calls: list[dict[str, Any]] = []
    for match in _BLOCK_RE.finditer(text, start):
        body = match.group(1) if match.group(1) is not None else match.group(2)
        parsed = _parse_block(body)
        if parsed is None:
            return text, []
        calls.append(_tool_call(parsed[0], parsed[1], make_id))
    prefix = text[:start]
    return (prefix if prefix.strip() else None), calls


def _partial_tag_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


@dataclass
class StreamDelta:
    """What one fed text delta released: a content delta and tool-call deltas (OpenAI streaming shape)."""

    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class StreamingToolParser:
    """Incremental Hermes parser: :meth:`feed` text deltas, then :meth:`finish` once.

    Content is released as soon as it cannot be the start of ``<tool_call>`` (leading whitespace is held
    until something else arrives, since it is dropped when a tool call follows); a tool call is released
    whole (index, id, name and full arguments in one delta) when its closing tag arrives.
    """

    make_id: Callable[[], str] = new_tool_call_id
    _buffer: str = ""
    _in_block: bool = False
    _held_whitespace: str = ""
    _content_started: bool = False
    _n_calls: int = 0

    @property
    def n_tool_calls(self) -> int:
        """How many tool calls were released so far."""
        return self._n_calls

    def feed(self, text: str) -> StreamDelta:
        """Consume a text delta; return what can be released now."""
        self._buffer += text
        out = StreamDelta()
        while self._step(out):
            pass
        return out

    def finish(self) -> StreamDelta:
        """Flush at end of generation (an unclosed block is parsed like the non-streaming parser)."""
        out = StreamDelta()
        if self._in_block:
            parsed = _parse_block(self._buffer)
            if parsed is not None:
                self._emit_call(parsed, out)
            else:
                self._release(TOOL_CALL_START + self._buffer, out)
        else:
            self._release(self._buffer, out)
        if self._n_calls == 0:
            out.content += self._held_whitespace
        self._buffer = self._held_whitespace = ""
        self._in_block = False
        return out

    def _step(self, out: StreamDelta) -> bool:
        """Process the buffer once; True if another step may make progress."""
        if self._in_block:
            end = self._buffer.find(TOOL_CALL_END)
            if end < 0:
                return False
            body, self._buffer = self._buffer[:end], self._buffer[end + len(TOOL_CALL_END) :]
            self._in_block = False
            parsed = _parse_block(body)
            if parsed is None:
                self._release(TOOL_CALL_START + body + TOOL_CALL_END, out)
            else:
                self._emit_call(parsed, out)
            return True
        start = self._buffer.find(TOOL_CALL_START)
        if start >= 0:
            self._release(self._buffer[:start], out)
            self._buffer = self._buffer[start + len(TOOL_CALL_START) :]
            self._in_block = True
            return True
        keep = _partial_tag_suffix(self._buffer, TOOL_CALL_START)
        self._release(self._buffer[: len(self._buffer) - keep], out)
        self._buffer = self._buffer[len(self._buffer) - keep :]
        return False

    def _release(self, text: str, out: StreamDelta) -> None:
        """Send text outside tool-call blocks as content (dropped once a tool call was sent)."""
        if self._n_calls or not text:
            return
        if not self._content_started:
            self._held_whitespace += text
            if not self._held_whitespace.strip():
                return
            text, self._held_whitespace = self._held_whitespace, ""
            self._content_started = True
        out.content += text

    def _emit_call(self, parsed: tuple[str, str], out: StreamDelta) -> None:
        call = _tool_call(parsed[0], parsed[1], self.make_id)
        out.tool_calls.append({"index": self._n_calls, **call})
        self._n_calls += 1
