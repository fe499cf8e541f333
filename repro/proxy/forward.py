"""Forwarding to the upstream model server, with recording: unary and streaming paths.

The harness gets the upstream's bytes unchanged (the vLLM extension fields included, which OpenAI clients
ignore). A call is committed to the store before its response completes: a unary response is sent after
the commit; a stream's final ``data: [DONE]`` event is held back until the commit. Token ids and logprobs
are checked first (:mod:`repro.proxy.sampled`): values the store cannot keep make the call an upstream error.
What the client gets for each kind of fault is listed in docs/architecture.md ("The proxy's failure contract").
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import urlsplit

import orjson

from repro.asgi import SSE_HEADERS, Receive, Send, send_bytes
from repro.proxy.assemble import StreamAccumulator, StreamFormatError, extract_response
from repro.proxy.config import ProxyConfig
from repro.proxy.errors import ProxyError, upstream_error
from repro.proxy.sampled import check_sampled
from repro.proxy.upstream import Response, UpstreamError, UpstreamPool, UpstreamTimeout
from repro.store import CallRecord, GroupCommitWriter
from repro.store.writer import CallNotStored, TraceWriteError

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
        self.pool = UpstreamPool(url.hostname, url.port or 80, config.connect_timeout_s, config.read_timeout_s,
                                 api_key=config.resolved_upstream_api_key())
        self._queued: set[tuple[str, int]] = set()  # calls handed to the writer, so a cancel does not add a second

    async def forward(self, call: CallRecord, request: dict[str, Any], receive: Receive, send: Send) -> None:
        """Forward and record one call. A call cancelled in flight (the proxy is stopping) is recorded as aborted."""
        try:
            if call.streamed:
                await self.stream(call, request, receive, send)
            else:
                await self.unary(call, request, send)
        except asyncio.CancelledError:
            if (call.rollout_id, call.seq) not in self._queued:
                call.status, call.error = "aborted", "the proxy stopped while this call was in flight"
                call.prompt_ids = call.completion_ids = call.logprobs = None
                call.t_end = time.time()
                self.writer.submit(call, _ignore)  # flushed by the writer's close at shutdown
            raise

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
            extract_response(orjson.loads(data), call)
        except (orjson.JSONDecodeError, AttributeError, TypeError, KeyError) as exc:
            return await self._fail(call, send, upstream_error(502, f"upstream returned an unreadable body: {exc}"))
        _set_finished(call)
        reason = check_sampled(call, request)
        if reason:
            _refuse_tokens(call)
            return await self._fail(call, send, upstream_error(502, reason))
        failure = await self._record(call)
        if failure is not None:
            return await send_bytes(send, failure.status, failure.body())
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
            held = await self._pump(call, request, resp, send, disconnected)
        finally:
            watcher.cancel()
            self.pool.release(resp)
        failure = await self._record(call)
        if failure is not None and call.status != "error":
            held = _error_event(failure)
        if call.status != "aborted":
            await send({"type": "http.response.body", "body": held, "more_body": False})

    async def _pump(self, call: CallRecord, request: dict[str, Any], resp: Response, send: Send,
                    disconnected: asyncio.Event) -> bytes:
        """Pass chunks through as they arrive; returns the tail to send after the commit."""
        acc = StreamAccumulator()
        held = b""
        try:
            async for data in resp.chunks():
                if call.t_first_byte is None:
                    call.t_first_byte = time.time()
                events = acc.feed(data)
                if acc.done:
                    cut = events.find(_DONE)
                    if cut > 0:
                        await send({"type": "http.response.body", "body": events[:cut], "more_body": True})
                    held = events[cut:]
                    break
                if events:
                    await send({"type": "http.response.body", "body": events, "more_body": True})
        except _FAILURES as exc:
            if not disconnected.is_set():
                call.status, call.error = "error", f"upstream stream failed: {_describe(exc, self.config)}"
        except StreamFormatError as exc:
            call.status, call.error = "error", str(exc)
        call.t_end = time.time()
        acc.fill(call)
        if call.status != "error":
            _set_finished(call)
        if disconnected.is_set():
            call.status, call.error = "aborted", "client disconnected mid-stream; upstream request cancelled"
        elif acc.upstream_error is not None and call.status != "error":
            call.status, call.error = "error", f"upstream reported an error mid-stream: {acc.upstream_error}"
        elif not acc.done and call.status != "error":
            call.status, call.error = "error", "upstream stream ended before data: [DONE]"
        reason = check_sampled(call, request)
        if reason:
            _refuse_tokens(call)
            call.error = f"{call.error}; {reason}" if call.status in ("error", "aborted") else reason
            call.status = "error" if call.status != "aborted" else call.status
        if call.status == "error":
            held = _error_event(upstream_error(502, call.error))
        return held

    # recording and failures -----------------------------------------------------------------------
    async def _record(self, call: CallRecord) -> ProxyError | None:
        """Commit ``call``; the error to answer with when it was not acknowledged as sent (None when it was)."""
        key = (call.rollout_id, call.seq)
        self._queued.add(key)
        try:
            await self.writer.write(call)
        except CallNotStored as exc:
            if exc.upstream_fault:
                return upstream_error(502, exc.reason)
            what = "recorded as a failed call" if exc.recorded else "not recorded"
            return ProxyError(500, f"the proxy could not store this call ({what}): {exc.reason}", kind="store_error")
        except TraceWriteError as exc:
            return ProxyError(503, f"the trace store is unavailable: {exc}", kind="store_error")
        finally:
            self._queued.discard(key)
        return None

    async def _fail(self, call: CallRecord, send: Send, error: ProxyError) -> None:
        call.status, call.error = "error", error.message
        call.t_end = call.t_end or time.time()
        failure = await self._record(call)
        if failure is not None and failure.status == 503:
            error = failure  # the store is down: say so rather than the upstream fault that was not recorded
        await send_bytes(send, error.status, error.body())

    def _connection_error(self, exc: BaseException) -> ProxyError:
        status = 504 if isinstance(exc, UpstreamTimeout) else 502
        return upstream_error(status, _describe(exc, self.config))

    def _status_error(self, status: int, data: bytes) -> ProxyError:
        text = data[:2000].decode("utf-8", "replace")
        if status in (401, 403):  # the proxy's own credentials, not the harness's: a fault of the set-up
            given = "its key was refused" if self.pool.has_api_key else "no key was sent"
            return upstream_error(502, f"upstream {self.base} refused the proxy ({status}, {given}): set "
                                       f"proxy.upstream_api_key or REPRO_UPSTREAM_API_KEY; upstream said: {text}")
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


def _ignore(_: BaseException | None) -> None:
    """Nobody waits on an aborted call's record."""


def _error_event(error: ProxyError) -> bytes:
    return b"data: " + error.body() + b"\n\n"


def _refuse_tokens(call: CallRecord) -> None:
    """Token columns that failed :func:`check_sampled` are not stored (the response body keeps the rest)."""
    call.prompt_ids = call.completion_ids = call.logprobs = None
    call.prompt_tokens = call.completion_tokens = None
    if not isinstance(call.finish_reason, str):
        call.finish_reason = None


def _set_finished(call: CallRecord) -> None:
    """The status of a call whose response was read whole: ``truncated`` at the length limit, else ``ok``."""
    call.status = "truncated" if call.finish_reason == "length" else "ok"
