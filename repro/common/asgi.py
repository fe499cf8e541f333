"""Minimal ASGI helpers shared by the proxy and the CPU model server (no web framework: each layer costs CPU
on every call)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson


class HttpError(Exception):
    """An error with an HTTP status and a message meant for the client, sent in the OpenAI error format."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind

    def body(self) -> bytes:
        return orjson.dumps({"error": {"message": self.message, "type": self.kind, "code": self.status}})


Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

JSON = b"application/json"
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole request body; 413 once it grows past ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise HttpError(499, "client disconnected while sending the request")
        body = message.get("body", b"")
        size += len(body)
        if size > limit:
            raise HttpError(413, f"request body exceeds the proxy limit of {limit} bytes (proxy.max_body_bytes)")
        chunks.append(body)
        if not message.get("more_body", False):
            return b"".join(chunks) if len(chunks) != 1 else chunks[0]


def declared_length(scope: dict[str, Any]) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                raise HttpError(400, "invalid Content-Length header") from None
    return None


async def send_bytes(send: Send, status: int, body: bytes, content_type: bytes = JSON) -> None:
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode())],
    })
    await send({"type": "http.response.body", "body": body})


async def send_json(send: Send, status: int, value: Any) -> None:
    await send_bytes(send, status, orjson.dumps(value))
