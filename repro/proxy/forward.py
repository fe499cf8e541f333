"""Forwarding to the upstream model server, with recording: unary and streaming paths.

The harness gets the upstream's bytes unchanged (the vLLM extension fields included, which OpenAI clients
ignore). A call is committed to the store before its response completes: a unary response is sent after
the commit; a stream's final ``data: [DONE]`` event is held back until the commit.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import urlsplit

import orjson

from repro.asgi import SSE_HEADERS, Receive, Send, send_bytes
from repro.proxy.assemble import Extracted, StreamAccumulator, extract_response
from repro.proxy.config import ProxyConfig
from repro.proxy.errors import ProxyError, upstream_error
from repro.proxy.upstream import Response, UpstreamError, UpstreamPool, UpstreamTimeout
from repro.store import CallRecord, GroupCommitWriter

_PATHS = {"chat": b"/v1/chat/completions", "completions": b"/v1/completions"}
_FAILURES = (UpstreamError, UpstreamTimeout, OSError)
_DONE = b"data: [DONE]"


class Forwarder:
    """One pooled upstream client and the two forwarding paths."""

    def __init__(self, config: ProxyConfig, writer: GroupCommitWriter) -> None:
        self.config = config
        self.writer = writer
        self.base = config.upstream_url.rstrip("/")
        url = urlsplit(self.base)
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"upstream_url must be http://host:port[/prefix], got {config.upstream_url!r}")
        self.prefix = url.path.encode()
        self.pool = UpstreamPool(url.hostname, url.port or 80, config.connect_timeout_s, config.read_timeout_s)

    async def open(self) -> None:
        """Nothing to do: connections are opened on first use."""

    async def close(self) -> None:
        self.pool.close()

    def upstream_body(self, call: CallRecord, request: dict[str, Any]) -> bytes:
        """The harness's request plus mode overrides, with token ids and sampled logprobs forced on."""
        body = dict(request)
        body.update(call.sampling_overrides)
        body["return_token_ids"] = True
        if call.endpoint == "chat":
            body["logprobs"] = True
        elif body.get("logprobs") is None:
            body["logprobs"] = 0
        if self.config.upstream_model:
            body["model"] = self.config.upstream_model
        return orjson.dumps(body)

    async def models(self, send: Send) -> None:
        try:
            resp = await self.pool.request(b"GET", self.prefix + b"/v1/models")
            data = await resp.read()
        except _FAILURES as exc:
            raise self._connection_error(exc) from None
        self.pool.release(resp)
        await send_bytes(send, resp.status, data)

    # unary ----------------------------------------------------------------------------------------
    async def unary(self, call: CallRecord, request: dict[str, Any], send: Send) -> None:
        path = self.prefix + _PATHS[call.endpoint]
        try:
            resp = await self.pool.request(b"POST", path, self.upstream_body(call, request))
            data = await resp.read()
        except _FAILURES as exc:
            return await self._fail(call, send, self._connection_error(exc))
        self.pool.release(resp)
        status = resp.status
        call.t_first_byte = call.t_end = time.time()
        call.http_status = status
        if status != 200:
            return await self._fail(call, send, self._status_error(status, data))
        try:
            extracted = extract_response(orjson.loads(data))
        except (orjson.JSONDecodeError, AttributeError, TypeError, KeyError) as exc:
            return await self._fail(call, send, upstream_error(502, f"upstream returned an unreadable body: {exc}"))
        _fill(call, extracted)
        await self.writer.write(call)
        await send_bytes(send, 200, data)

    # streaming ------------------------------------------------------------------------------------
    async def stream(self, call: CallRecord, request: dict[str, Any], receive: Receive, send: Send) -> None:
        path = self.prefix + _PATHS[call.endpoint]
        try:
            resp = await self.pool.request(b"POST", path, self.upstream_body(call, request))
            data = await resp.read() if resp.status != 200 else b""
        except _FAILURES as exc:
            return await self._fail(call, send, self._connection_error(exc))
        call.http_status = resp.status
        if resp.status != 200:
            self.pool.release(resp)
            return await self._fail(call, send, self._status_error(resp.status, data))
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        disconnected = asyncio.Event()
        watcher = asyncio.ensure_future(_watch_disconnect(receive, disconnected, resp))
        try:
            held = await self._pump(call, resp, send, disconnected)
        finally:
            watcher.cancel()
            self.pool.release(resp)
        await self.writer.write(call)
        if call.status != "aborted":
            await send({"type": "http.response.body", "body": held, "more_body": False})

    async def _pump(self, call: CallRecord, resp: Response, send: Send,
                    disconnected: asyncio.Event) -> bytes:
        """Pass chunks through as they arrive; returns the tail to send after the commit."""
        acc = StreamAccumulator()
        held = b""
        try:
            async for data in resp.chunks():
                if call.t_first_byte is None:
                    call.t_first_byte = time.time()
                acc.feed(data)
                if acc.done:
                    cut = data.find(_DONE)
                    if cut > 0:
                        await send({"type": "http.response.body", "body": data[:cut], "more_body": True})
                    held = data[cut:] if cut >= 0 else data
                    break
                await send({"type": "http.response.body", "body": data, "more_body": True})
        except _FAILURES as exc:
            if not disconnected.is_set():
                call.status, call.error = "error", f"upstream stream failed: {_describe(exc, self.config)}"
        except orjson.JSONDecodeError as exc:
            call.status, call.error = "error", f"upstream sent an unreadable chunk: {exc}"
        call.t_end = time.time()
        _fill(call, acc.result(call.endpoint), keep_status=call.status == "error")
        if disconnected.is_set():
            call.status, call.error = "aborted", "client disconnected mid-stream; upstream request cancelled"
        elif not acc.done and call.status != "error":
            call.status, call.error = "error", "upstream stream ended before data: [DONE]"
        if call.status == "error":
            held = b"data: " + ProxyError(502, call.error, kind="upstream_error").body() + b"\n\n"
        return held

    # failures -------------------------------------------------------------------------------------
    async def _fail(self, call: CallRecord, send: Send, error: ProxyError) -> None:
        call.status, call.error = "error", error.message
        call.t_end = call.t_end or time.time()
        await self.writer.write(call)
        await send_bytes(send, error.status, error.body())

    def _connection_error(self, exc: BaseException) -> ProxyError:
        status = 504 if isinstance(exc, UpstreamTimeout) else 502
        return upstream_error(status, _describe(exc, self.config))

    def _status_error(self, status: int, data: bytes) -> ProxyError:
        text = data[:2000].decode("utf-8", "replace")
        if status >= 500:
            return upstream_error(502, f"upstream {self.base} answered {status}: {text}")
        return ProxyError(status, f"upstream rejected the request ({status}): {text}")


async def _watch_disconnect(receive: Receive, disconnected: asyncio.Event, resp: Response) -> None:
    """On client disconnect, drop the upstream connection: the upstream sees it go and stops generating."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            disconnected.set()
            resp.abort()
            return


def _describe(exc: BaseException, config: ProxyConfig) -> str:
    if isinstance(exc, UpstreamTimeout):
        return f"upstream {config.upstream_url} sent nothing for {config.read_timeout_s}s (proxy.read_timeout_s)"
    return f"upstream {config.upstream_url} unreachable: {type(exc).__name__}: {exc}"


def _fill(call: CallRecord, ex: Extracted, keep_status: bool = False) -> None:
    call.prompt_ids, call.completion_ids, call.logprobs = ex.prompt_ids, ex.completion_ids, ex.logprobs
    call.finish_reason, call.response = ex.finish_reason, ex.response
    call.prompt_tokens, call.completion_tokens = ex.prompt_tokens, ex.completion_tokens
    if not keep_status:
        call.status = "truncated" if ex.finish_reason == "length" else "ok"
