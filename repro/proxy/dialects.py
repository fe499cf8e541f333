"""The APIs the proxy speaks besides chat completions, each served by translation to the upstream's chat completions
(the model servers return the sampled token ids and logprobs there only).

A :class:`Dialect` turns the harness's request into a chat request (:class:`Translated`), and the upstream's chat
answer back into its own API: a whole response, or a stream of its SSE events built from the chat chunks. The
forwarder records the call in the chat shape the model saw (``request`` is the translated chat request with a
``translated_from`` entry naming the API and what it dropped; ``response`` is the chat body), with ``endpoint`` the
API the harness spoke.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from repro.proxy.errors import ProxyError, bad_request
from repro.store import CallRecord


@dataclass
class Translated:
    """A chat completions request and what of the original request it could not carry."""

    chat: dict[str, Any]
    ignored: list[str] = field(default_factory=list)


class StreamTranslator(Protocol):
    """Builds one streamed response of a dialect from the upstream's chat chunks (choice 0)."""

    def events(self, chunk: dict[str, Any]) -> bytes:
        """The SSE bytes for one upstream chat chunk (possibly empty)."""
        ...

    def finish(self, call: CallRecord) -> bytes:
        """The closing events, sent after the call is committed (``call`` has its finish reason and token
        counts)."""
        ...

    def error(self, error: ProxyError) -> bytes:
        """An error event that ends the stream."""
        ...


class Dialect(Protocol):
    """One API served by translation: its name (recorded as the call's ``endpoint``) and its three directions."""

    api: str
    overflow_in_stream: bool  # a streamed over-long request is answered by an error event, not an error status

    def to_chat(self, request: dict[str, Any]) -> Translated:
        """The chat request for ``request`` (a 400 :class:`ProxyError` for a malformed one)."""
        ...

    def response(self, body: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
        """The non-streamed answer for the upstream's chat ``body`` (token arrays already removed)."""
        ...

    def stream(self, request: dict[str, Any]) -> StreamTranslator:
        """A translator for one streamed answer to ``request``."""
        ...

    def error_body(self, error: ProxyError) -> bytes:
        """An error response body in this API's format."""
        ...


def chunk_deltas(chunk: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """Choice 0's deltas in one chat chunk, in order: ``("text", str)`` then ``("tool", tool-call delta)`` each."""
    for choice in chunk.get("choices") or ():
        if choice.get("index", 0) != 0:
            continue
        delta = choice.get("delta") or {}
        if delta.get("content"):
            yield "text", delta["content"]
        for call in delta.get("tool_calls") or ():
            yield "tool", call


def text_or_blocks(content: Any, where: str, what: str) -> str | list[Any]:
    """A message's content: a string as is, or its list of blocks (parts); a 400 naming ``where`` otherwise."""
    if isinstance(content, str | list):
        return content
    raise bad_request(f"{where} must be a string or a list of {what}")
