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
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson

from repro.common.asgi import SSE_HEADERS, Receive, Send, send_bytes
from repro.proxy.assemble import StreamAccumulator, StreamFormatError, extract_response
from repro.proxy.config import ProxyConfig, replica_index
from repro.proxy.dialects import Dialect, StreamTranslator
from repro.proxy.errors import ProxyError, upstream_error
from repro.proxy.overflow import ContextExceeded, context_exceeded
from repro.proxy.sampled import check_sampled
from repro.proxy.upstream import Response, UpstreamError, UpstreamPool, UpstreamTimeout
from repro.store import CallRecord, GroupCommitWriter
from repro.store.trace_records import CONTEXT_EXCEEDED
from repro.store.writer import CallNotStored, TraceWriteError

_PATHS = {"chat": b"/v1/chat/completions", "completions": b"/v1/completions"}  # a dialect's call goes to chat
_FAILURES = (UpstreamError, UpstreamTimeout, OSError)
_DONE = b"data: [DONE]"


@dataclass
class Answer:
    """How a call's answer is written: the upstream's bytes unchanged, or in a dialect's API (``original`` is the
    harness's request before translation)."""

    dialect: Dialect | None = None
    original: dict[str, Any] | None = None

    def body(self, data: bytes, call: CallRecord) -> bytes:
        if self.dialect is None:
            return data
        return orjson.dumps(self.dialect.response(call.response or {}, self.original or {}))

    def error_body(self, error: ProxyError) -> bytes:
        return error.body() if self.dialect is None else self.dialect.error_body(error)

    def translator(self) -> StreamTranslator | None:
        return None if self.dialect is None else self.dialect.stream(self.original or {})

    def overflow_event(self, error: ProxyError, streamed: bool) -> bytes | None:
        """The stream a streamed over-long request is answered with, for an API that reports it in-stream
        (None: answer with the error body)."""
        if not (streamed and isinstance(error, ContextExceeded) and self.dialect is not None
                and self.dialect.overflow_in_stream):
            return None
        return self.translator().error(error)


_PASS_THROUGH = Answer()


class Upstream:
    """One upstream server: its base URL, path prefix and pooled connections."""

    def __init__(self, url: str, config: ProxyConfig) -> None:
        self.base = url.rstrip("/")
        parts = urlsplit(self.base)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream url must be http://host:port[/prefix], got {url!r}")
        self.prefix = parts.path.encode()
        self.pool = UpstreamPool(parts.hostname, parts.port or 80, config.connect_timeout_s, config.read_timeout_s,
                                 api_key=config.resolved_upstream_api_key())


class Forwarder:
    """The pooled upstream clients (one a replica) and the two forwarding paths."""

    def __init__(self, config: ProxyConfig, writer: GroupCommitWriter) -> None:
        self.config = config
        self.writer = writer
        self.upstreams = [Upstream(url, config) for url in config.upstream_urls]
        self._queued: set[tuple[str, int]] = set()  # calls handed to the writer, so a cancel does not add a second

    def upstream_for(self, rollout_id: str) -> Upstream:
        """The replica that serves every call of ``rollout_id`` (:func:`repro.proxy.config.replica_index`)."""
        return self.upstreams[replica_index(rollout_id, len(self.upstreams))]

    async def forward(self, call: CallRecord, request: dict[str, Any], receive: Receive, send: Send,
                      answer: Answer = _PASS_THROUGH) -> None:
        """Forward and record one call (``request`` is a chat or completions request; ``answer`` says in which API to
        answer). A call cancelled in flight (the proxy is stopping) is recorded as aborted."""
        try:
            if call.streamed:
                await self.stream(call, request, receive, send, answer)
            else:
                await self.unary(call, request, send, answer)
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
        for upstream in self.upstreams:
            upstream.pool.close()

    def upstream_body(self, call: CallRecord, request: dict[str, Any]) -> bytes:
        """The harness's request plus mode overrides, with token ids and sampled logprobs forced on."""
        body = dict(request)
        body.update(call.sampling_overrides)
        body["return_token_ids"] = True
        if call.endpoint != "completions":
            body["logprobs"] = True
        elif body.get("logprobs") is None:
            body["logprobs"] = 0
        if self.config.upstream_model:
            body["model"] = self.config.upstream_model
        return orjson.dumps(body)

    async def count_tokens(self, chat: dict[str, Any]) -> int:
        """The upstream's token count for a chat request's prompt (vLLM's ``/tokenize``)."""
        fields = {name: chat[name] for name in ("messages", "tools") if chat.get(name)}
        body = orjson.dumps({"model": self.config.upstream_model or chat.get("model", ""), **fields,
                             "add_generation_prompt": True})
        upstream = self.upstreams[0]  # every replica serves the same tokenizer
        try:
            resp = await upstream.pool.request(b"POST", upstream.prefix + b"/tokenize", body)
            data = await resp.read()
        except _FAILURES as exc:
            raise self._connection_error(exc, upstream) from None
        upstream.pool.release(resp)
        if resp.status != 200:
            raise self._status_error(resp.status, data, upstream)
        try:
            return int(orjson.loads(data)["count"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise upstream_error(502, f"upstream /tokenize returned an unreadable body: {exc}") from None

    async def models(self, send: Send) -> None:
        upstream = self.upstreams[0]
        try:
            resp = await upstream.pool.request(b"GET", upstream.prefix + b"/v1/models")
            data = await resp.read()
        except _FAILURES as exc:
            raise self._connection_error(exc, upstream) from None
        upstream.pool.release(resp)
        await send_bytes(send, resp.status, data)

    # unary ----------------------------------------------------------------------------------------
    async def unary(self, call: CallRecord, request: dict[str, Any], send: Send,
                    answer: Answer = _PASS_THROUGH) -> None:
        upstream = self.upstream_for(call.rollout_id)
        try:
            resp = await upstream.pool.request(b"POST", upstream.prefix + _upstream_path(call),
                                               self.upstream_body(call, request))
            data = await resp.read()
        except _FAILURES as exc:
            return await self._fail(call, send, self._connection_error(exc, upstream), answer)
        upstream.pool.release(resp)
        status = resp.status
        call.t_first_byte = call.t_end = time.time()
        call.http_status = status
        if status != 200:
            return await self._fail(call, send, self._status_error(status, data, upstream), answer)
        try:
            extract_response(orjson.loads(data), call)
        except (orjson.JSONDecodeError, AttributeError, TypeError, KeyError) as exc:
            error = upstream_error(502, f"upstream returned an unreadable body: {exc}")
            return await self._fail(call, send, error, answer)
        _set_finished(call)
        reason = check_sampled(call, request)
        if reason:
            _refuse_tokens(call)
            return await self._fail(call, send, upstream_error(502, reason), answer)
        failure = await self._record(call)
        if failure is not None:
            return await send_bytes(send, failure.status, answer.error_body(failure))
        await send_bytes(send, 200, answer.body(data, call))

    # streaming ------------------------------------------------------------------------------------
    async def stream(self, call: CallRecord, request: dict[str, Any], receive: Receive, send: Send,
                     answer: Answer = _PASS_THROUGH) -> None:
        upstream = self.upstream_for(call.rollout_id)
        try:
            resp = await upstream.pool.request(b"POST", upstream.prefix + _upstream_path(call),
                                               self.upstream_body(call, request))
            data = await resp.read() if resp.status != 200 else b""
        except _FAILURES as exc:
            return await self._fail(call, send, self._connection_error(exc, upstream), answer)
        call.http_status = resp.status
        if resp.status != 200:
            upstream.pool.release(resp)
            return await self._fail(call, send, self._status_error(resp.status, data, upstream), answer, streamed=True)
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        disconnected = asyncio.Event()
        watcher = asyncio.ensure_future(_watch_disconnect(receive, disconnected, resp))
        try:
            translator = answer.translator()
            held = await self._pump(call, request, resp, send, disconnected, translator, upstream)
        finally:
            watcher.cancel()
            upstream.pool.release(resp)
        failure = await self._record(call)
        if failure is not None and call.status != "error":
            held = _error_event(failure, translator)
        elif translator is not None and call.status != "error":
            held = translator.finish(call)
        if call.status != "aborted":
            await send({"type": "http.response.body", "body": held, "more_body": False})

    async def _pump(self, call: CallRecord, request: dict[str, Any], resp: Response, send: Send,
                    disconnected: asyncio.Event, translator: StreamTranslator | None, upstream: Upstream) -> bytes:
        """Pass chunks through as they arrive (or their translation); returns the tail to send after the commit."""
        acc = StreamAccumulator(keep_chunks=translator is not None)
        held = b""
        try:
            async for data in resp.chunks():
                if call.t_first_byte is None:
                    call.t_first_byte = time.time()
                events = acc.feed(data)
                if translator is not None:
                    events = b"".join(translator.events(chunk) for chunk in acc.take_chunks())
                    if events:
                        await send({"type": "http.response.body", "body": events, "more_body": True})
                    if acc.done:
                        break
                    continue
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
                call.status, call.error = "error", f"upstream stream failed: {_describe(exc, self.config, upstream)}"
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
            held = _error_event(upstream_error(502, call.error), translator)
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

    async def _fail(self, call: CallRecord, send: Send, error: ProxyError, answer: Answer,
                    streamed: bool = False) -> None:
        call.status = CONTEXT_EXCEEDED if isinstance(error, ContextExceeded) else "error"
        call.error = error.message
        call.t_end = call.t_end or time.time()
        failure = await self._record(call)
        if failure is not None and failure.status == 503:
            error = failure  # the store is down: say so rather than the upstream fault that was not recorded
        events = answer.overflow_event(error, streamed)
        if events is not None:
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
            await send({"type": "http.response.body", "body": events, "more_body": False})
            return
        await send_bytes(send, error.status, answer.error_body(error))

    def _connection_error(self, exc: BaseException, upstream: Upstream) -> ProxyError:
        status = 504 if isinstance(exc, UpstreamTimeout) else 502
        return upstream_error(status, _describe(exc, self.config, upstream))

    def _status_error(self, status: int, data: bytes, upstream: Upstream) -> ProxyError:
        overflow = context_exceeded(status, data)
        if overflow is not None:  # the model's answer to this prompt, in the client's API (repro.proxy.overflow)
            return overflow
        text = data[:2000].decode("utf-8", "replace")
        if status in (401, 403):  # the proxy's own credentials, not the harness's: a fault of the set-up
            given = "its key was refused" if upstream.pool.has_api_key else "no key was sent"
            return upstream_error(502, f"upstream {upstream.base} refused the proxy ({status}, {given}): set "
                                       f"proxy.upstream_api_key or REPRO_UPSTREAM_API_KEY; upstream said: {text}")
        if status >= 500:
            return upstream_error(502, f"upstream {upstream.base} answered {status}: {text}")
        return ProxyError(status, f"upstream rejected the request ({status}): {text}")


async def _watch_disconnect(receive: Receive, disconnected: asyncio.Event, resp: Response) -> None:
    """On client disconnect, drop the upstream connection: the upstream sees it go and stops generating."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            disconnected.set()
            resp.abort()
            return


def _describe(exc: BaseException, config: ProxyConfig, upstream: Upstream) -> str:
    if isinstance(exc, UpstreamTimeout):
        return f"upstream {upstream.base} sent nothing for {config.read_timeout_s}s (proxy.read_timeout_s)"
    return f"upstream {upstream.base} unreachable: {type(exc).__name__}: {exc}"


def _ignore(_: BaseException | None) -> None:
    """Nobody waits on an aborted call's record."""


def _error_event(error: ProxyError, translator: StreamTranslator | None = None) -> bytes:
    return b"data: " + error.body() + b"\n\n" if translator is None else translator.error(error)


def _upstream_path(call: CallRecord) -> bytes:
    return _PATHS.get(call.endpoint, _PATHS["chat"])


def _refuse_tokens(call: CallRecord) -> None:
    """Token columns that failed :func:`check_sampled` are not stored (the response body keeps the rest)."""
    call.prompt_ids = call.completion_ids = call.logprobs = None
    call.prompt_tokens = call.completion_tokens = None
    if not isinstance(call.finish_reason, str):
        call.finish_reason = None


def _set_finished(call: CallRecord) -> None:
    """The status of a call whose response was read whole: ``truncated`` at the length limit, else ``ok``."""
    call.status = "truncated" if call.finish_reason == "length" else "ok"
