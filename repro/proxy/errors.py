"""HTTP errors the proxy answers with, in the OpenAI error format."""

from __future__ import annotations

from repro.common.asgi import HttpError

ProxyError = HttpError  # the proxy's errors are plain HTTP errors in the OpenAI format


def bad_request(message: str) -> ProxyError:
    return ProxyError(400, message)


def upstream_error(status: int, message: str) -> ProxyError:
    return ProxyError(status, message, kind="upstream_error")
