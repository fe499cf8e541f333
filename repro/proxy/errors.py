"""HTTP errors the proxy answers with, in the OpenAI error format."""

from __future__ import annotations

import orjson


class ProxyError(Exception):
    """An error with an HTTP status and a message meant for the client."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind

    def body(self) -> bytes:
        return orjson.dumps({"error": {"message": self.message, "type": self.kind, "code": self.status}})


def bad_request(message: str) -> ProxyError:
    return ProxyError(400, message)


def upstream_error(status: int, message: str) -> ProxyError:
    return ProxyError(status, message, kind="upstream_error")
