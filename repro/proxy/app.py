"""The recording proxy: an ASGI app that forwards OpenAI-compatible calls and stores each one under its rollout.

Routes (``C``: the control plane, needs the control token; ``{cap}``: the rollout's capability, :mod:`.auth`)::

  C POST /rollouts                                   register a rollout (JSON: task_id, mode, ...); 201 with its
                                                     ``base_url_path`` (/rollouts/{id}/{cap}/v1)
  C GET  /rollouts/{id}                              the rollout, its call count, prefix drift and how its calls ended
  C POST /rollouts/{id}/finish                       set status / reward / failure_reason
  C POST /policy_version                             the weights' version recorded with every later call
    POST /rollouts/{id}/{cap}/v1/chat/completions    forwarded + recorded (streaming or not)
    POST /rollouts/{id}/{cap}/v1/completions         forwarded + recorded
    POST /rollouts/{id}/{cap}/v1/messages            Anthropic Messages, translated to chat (repro.proxy.dialects)
    POST /rollouts/{id}/{cap}/v1/messages/count_tokens  the translated prompt's length (upstream /tokenize)
    POST /rollouts/{id}/{cap}/v1/responses           OpenAI Responses, translated to chat
    POST /rollouts/{id}/{cap}/purpose/{purpose}/v1/...  the same, the call recorded with that purpose (auxiliary,
                                                     summary: a harness's side calls; see routes.purpose_base_url)
    GET  /rollouts/{id}/{cap}/v1/models, GET /v1/models  forwarded
    GET  /rollouts/{id}/{cap}/call_outcomes          how the rollout's own calls ended (what a harness adapter reads)
    GET  /health                                     200 {"status": "ok", "pid"}; 503 {"status": "unhealthy", "reason"}
                                                     once the trace writer has stopped
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any

from repro.common.asgi import Receive, Send, declared_length, read_body, send_bytes, send_json
from repro.proxy.anthropic_stream import MessagesDialect
from repro.proxy.auth import capability, new_control_token, require_capability, require_control
from repro.proxy.config import ProxyConfig
from repro.proxy.dialects import Dialect
from repro.proxy.errors import ProxyError, bad_request
from repro.proxy.forward import Answer, Forwarder
from repro.proxy.openai_responses import ResponsesDialect
from repro.proxy.registry import RolloutRegistry
from repro.proxy.routes import PURPOSE_SEGMENT, check_purpose, rollout_base_path
from repro.proxy.validation import check_chat, check_completion, check_rollout_id, parse_json_object, storable_request
from repro.store import CallRecord, GroupCommitWriter, SqliteTraceStore, TraceStoreConfig

_RECORDED_HEADERS = frozenset({b"user-agent", b"x-stainless-retry-count", b"x-stainless-lang",
                               b"x-stainless-package-version", b"x-stainless-runtime", b"x-request-id",
                               b"anthropic-version", b"anthropic-beta"})
_ENDPOINTS = {"v1/chat/completions": "chat", "v1/completions": "completions"}
_DIALECTS: dict[str, Dialect] = {"v1/messages": MessagesDialect(), "v1/responses": ResponsesDialect()}
_COUNT_TOKENS = "v1/messages/count_tokens"
log = logging.getLogger(__name__)


class ProxyApp:
    """ASGI application; state (store, writer, upstream session) is created in the lifespan startup."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.store: SqliteTraceStore | None = None
        self.writer: GroupCommitWriter | None = None
        self.registry: RolloutRegistry | None = None
        self.forwarder: Forwarder | None = None
        self.policy_version: int | None = None  # set by the trainer after each weight sync (POST /policy_version)
        self.control_token = config.resolved_control_token() or new_control_token()

    async def startup(self) -> None:
        store_config = TraceStoreConfig(path=self.config.store_path, synchronous=self.config.synchronous)
        self.store = SqliteTraceStore(store_config)
        self.writer = GroupCommitWriter(store_config, write_timeout_s=self.config.write_timeout_s,
                                        vocab_size=self.config.vocab_size)
        self.registry = RolloutRegistry(self.store, self.config.sampling_overrides)
        self.forwarder = Forwarder(self.config, self.writer)
        await self.forwarder.open()

    async def shutdown(self) -> None:
        if self.forwarder is not None:
            await self.forwarder.close()
        if self.writer is not None and not self.writer.close(timeout_s=self.config.shutdown_timeout_s + 5):
            log.error("the trace writer did not finish within its bound; calls not yet acknowledged may be lost")
        if self.store is not None:
            self.store.close()

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                await self._route(scope, receive, send)
            except ProxyError as exc:
                await send_bytes(send, exc.status, _error_body(scope["path"], exc))
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:  # reported to the server, which exits
                    await send({"type": "lifespan.startup.failed", "message": repr(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _route(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        method, path = scope["method"], scope["path"]
        if path.startswith("/rollouts/"):
            rollout_id, _, rest = path[len("/rollouts/") :].partition("/")
            check_rollout_id(rollout_id)
            if rest in ("", "finish"):
                require_control(dict(scope["headers"]), self.control_token)
                if rest == "" and method == "GET":
                    return await send_json(send, 200, self._rollout_info(rollout_id))
                if rest == "finish" and method == "POST":
                    return await self._finish(rollout_id, scope, receive, send)
            else:
                return await self._model_route(rollout_id, rest, method, scope, receive, send)
        elif path == "/rollouts" and method == "POST":
            require_control(dict(scope["headers"]), self.control_token)
            fields = parse_json_object(await self._body(scope, receive))
            record = self.registry.create(fields)
            path = rollout_base_path(record.rollout_id, capability(self.control_token, record.rollout_id))
            return await send_json(send, 201, {**dataclasses.asdict(record), "base_url_path": path})
        elif path == "/v1/models" and method == "GET":
            return await self.forwarder.models(send)
        elif path == "/health" and method == "GET":
            return await self._health(send)
        elif path == "/policy_version" and method == "POST":
            require_control(dict(scope["headers"]), self.control_token)
            return await self._set_policy_version(scope, receive, send)
        raise ProxyError(404, f"no route {method} {path}; model calls go to the base URL a rollout's registration "
                              "returned (/rollouts/{rollout_id}/{capability}/v1/...)", kind="not_found_error")

    async def _model_route(self, rollout_id: str, rest: str, method: str, scope: dict[str, Any], receive: Receive,
                           send: Send) -> None:
        """``{cap}/v1/...`` of a rollout: the capability checked before anything is read or written."""
        given, _, rest = rest.partition("/")
        require_capability(self.control_token, rollout_id, given)
        purpose, rest = _purpose_of(rest)
        endpoint = _ENDPOINTS.get(rest)
        if endpoint is not None and method == "POST":
            return await self._completion(rollout_id, endpoint, scope, receive, send, purpose)
        if rest in _DIALECTS and method == "POST":
            return await self._translated(rollout_id, _DIALECTS[rest], scope, receive, send, purpose)
        if rest == _COUNT_TOKENS and method == "POST":
            return await self._count_tokens(rollout_id, scope, receive, send)
        if rest == "v1/models" and method == "GET":
            return await self.forwarder.models(send)
        if rest == "call_outcomes" and method == "GET":  # how this rollout's own calls ended (the harness's reading)
            self.registry.lookup(rollout_id)
            return await send_json(send, 200, {"calls": self.store.drift_summary(rollout_id).calls,
                                               "call_outcomes": self.store.call_outcomes(rollout_id)})
        raise ProxyError(404, f"no route {method} .../{rest} for a rollout", kind="not_found_error")

    async def _body(self, scope: dict[str, Any], receive: Receive) -> bytes:
        limit = self.config.max_body_bytes
        length = declared_length(scope)
        if length is not None and length > limit:
            raise ProxyError(413, f"request body of {length} bytes exceeds the limit of {limit} (proxy.max_body_bytes)")
        return await read_body(receive, limit)

    async def _completion(self, rollout_id: str, endpoint: str, scope: dict[str, Any], receive: Receive,
                          send: Send, purpose: str = "policy") -> None:
        t_start = time.time()
        request = parse_json_object(await self._body(scope, receive))
        (check_chat if endpoint == "chat" else check_completion)(request)
        call = self._new_call(rollout_id, endpoint, scope, storable_request(request), request, t_start, purpose)
        await self.forwarder.forward(call, request, receive, send)

    async def _translated(self, rollout_id: str, dialect: Dialect, scope: dict[str, Any], receive: Receive,
                          send: Send, purpose: str) -> None:
        """A dialect's call: translated to chat, recorded in that shape (``translated_from`` names the API and what
        it dropped), answered in the dialect's API."""
        t_start = time.time()
        original = parse_json_object(await self._body(scope, receive))
        translated = dialect.to_chat(original)
        check_chat(translated.chat)
        stored = {**storable_request(translated.chat),
                  "translated_from": {"api": dialect.api, "ignored": sorted(set(translated.ignored))}}
        call = self._new_call(rollout_id, dialect.api, scope, stored, translated.chat, t_start, purpose)
        await self.forwarder.forward(call, translated.chat, receive, send, Answer(dialect, original))

    def _new_call(self, rollout_id: str, endpoint: str, scope: dict[str, Any], stored: dict[str, Any],
                  request: dict[str, Any], t_start: float, purpose: str) -> CallRecord:
        seq, overrides = self.registry.next_seq(rollout_id)  # 404 here: nothing has been written
        headers = {k.decode(): v.decode("latin-1") for k, v in scope["headers"] if k in _RECORDED_HEADERS}
        retry = headers.get("x-stainless-retry-count")
        return CallRecord(
            rollout_id=rollout_id, seq=seq, endpoint=endpoint, status="ok", request=stored,
            streamed=request.get("stream") is True, retry_count=int(retry) if retry and retry.isdigit() else None,
            client_headers=headers, sampling_overrides=overrides,
            t_start=t_start, purpose=purpose, policy_version=self.policy_version,
        )

    async def _count_tokens(self, rollout_id: str, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        """Anthropic's count_tokens: the length of the translated prompt as the upstream renders it."""
        request = parse_json_object(await self._body(scope, receive))
        translated = _DIALECTS["v1/messages"].to_chat({"max_tokens": 1, **request})
        count = await self.forwarder.count_tokens(translated.chat)
        await send_json(send, 200, {"input_tokens": count})

    async def _set_policy_version(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        """Calls that start from now on record ``version`` (the RL step whose weights the server now holds), so
        that a rollout's staleness (trainer step minus the versions that sampled it) is measurable."""
        version = parse_json_object(await self._body(scope, receive)).get("version")
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise bad_request("'version' must be a non-negative integer")
        self.policy_version = version
        await send_json(send, 200, {"policy_version": version})

    async def _health(self, send: Send) -> None:
        if self.writer is not None and self.writer.healthy:
            return await send_json(send, 200, {"status": "ok", "pid": os.getpid()})
        reason = self.writer.failure if self.writer is not None else "starting"
        await send_json(send, 503, {"status": "unhealthy", "reason": reason or "the trace writer has stopped"})

    def _rollout_info(self, rollout_id: str) -> dict[str, Any]:
        record = self.store.get_rollout(rollout_id)
        if record is None:
            raise ProxyError(404, f"unknown rollout {rollout_id!r}", kind="not_found_error")
        drift = self.store.drift_summary(rollout_id)
        return {**dataclasses.asdict(record), "calls": drift.calls, "drift": dataclasses.asdict(drift),
                "call_outcomes": self.store.call_outcomes(rollout_id)}

    async def _finish(self, rollout_id: str, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        fields = parse_json_object(await self._body(scope, receive))
        reward = fields.get("reward")
        if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))):
            raise bad_request("'reward' must be a number")
        try:
            self.store.finish_rollout(rollout_id, str(fields.get("status", "finished")), reward,
                                      fields.get("failure_reason"))
        except ValueError as exc:
            raise bad_request(str(exc)) from None
        except KeyError:
            raise ProxyError(404, f"unknown rollout {rollout_id!r}", kind="not_found_error") from None
        await send_json(send, 200, self._rollout_info(rollout_id))


def _error_body(path: str, error: ProxyError) -> bytes:
    """The error in the format of the API the path belongs to (Anthropic's for ``/v1/messages``...)."""
    for suffix, dialect in _DIALECTS.items():
        if path.endswith(suffix) or path.endswith(suffix + "/count_tokens"):
            return dialect.error_body(error)
    return error.body()


def _purpose_of(rest: str) -> tuple[str, str]:
    """``purpose/auxiliary/v1/chat/completions`` -> (``auxiliary``, ``v1/chat/completions``); else ``policy``."""
    head, _, tail = rest.partition("/")
    if head != PURPOSE_SEGMENT:
        return "policy", rest
    purpose, _, tail = tail.partition("/")
    try:
        return check_purpose(purpose), tail
    except ValueError as exc:
        raise ProxyError(404, str(exc), kind="not_found_error") from None
