"""CPU model server speaking vLLM's OpenAI dialect (raw ASGI app, run by uvicorn).

Routes: ``GET /health``, ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``,
``POST /tokenize`` (vLLM's: a chat request's prompt ids and their count), ``POST /v1/load_weights``
(``{"model_dir": DIR}``: swap in a checkpoint's weights between batches, see :mod:`repro.serving.cpu_weights`).
With ``expert_tasks`` the completions are scripted by the miniature's expert (plugged in by name,
:data:`EXPERT_SCRIPT`), with ``scenarios`` by replies per scenario (:mod:`repro.serving.scripted`).
vLLM extensions honoured: ``return_token_ids`` (prompt ids top-level for chat / per choice for
completions; completion ids per choice, as deltas when streaming), ``stop_token_ids``,
``chat_template_kwargs``, ``add_generation_prompt``, ``stop_reason``. Tool calls are parsed with the
Hermes parser when the request has tools. A client that disconnects cancels its rows. Request
bodies and headers are never logged. With an API key (``--api-key`` or ``REPRO_SERVER_API_KEY``, as
``vllm serve --api-key``), every ``/v1`` route requires ``Authorization: Bearer <key>`` (401 otherwise).

Run: ``python -m repro.serving.cpu_server --model DIR --port N`` (see :mod:`repro.serving.commands`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import traceback
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from repro.common.asgi import Receive, Send, send_json
from repro.serving.cpu_server_args import CpuServerArgs, ServerConfig
from repro.serving.cpu_weights import reload_weights
from repro.serving.engine import (
    Engine,
    ErrorEvent,
    Event,
    FinishEvent,
    PromptTooLongError,
    SamplingParams,
    TokenEvent,
)
from repro.serving.openai_api import (
    BadRequestError,
    ChoiceOutput,
    CommonParams,
    ModelNotFoundError,
    check_model,
    error_body,
    parse_chat_request,
    parse_completion_request,
)
from repro.serving.scripted import Script, ScriptedEngine, load_script, scenario_script
from repro.serving.streaming import (
    ChatStreamer,
    CompletionStreamer,
    SendJson,
    build_chat_response,
    build_completion_response,
)

log = logging.getLogger(__name__)

Scope = dict[str, Any]
EXPERT_SCRIPT = "repro.tinymodel.expert:serving_script"  # (tasks JSONL, slip rate, slip seed, slip operators) -> Script
__all__ = ["EXPERT_SCRIPT", "CPUServerApp", "Generation", "ServerConfig", "create_app", "main", "run_server",
           "server_script", "stream_sse"]


class Generation:
    """The engine rows of one HTTP request: ``n`` rows per prompt, tagged ``prompt_index * n + j``."""

    def __init__(self, engine: Engine, prompts: list[list[int]], common: CommonParams) -> None:
        for prompt in prompts:
            if not prompt:
                raise BadRequestError("the prompt is empty")
            engine.resolve_max_tokens(len(prompt), common.sampling.max_tokens)
        self.common = common
        self.queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        self.requests = [
            engine.submit(prompt, common.row_params(j), self.queue, tag=i * common.n + j)
            for i, prompt in enumerate(prompts)
            for j in range(common.n)
        ]

    async def events(self) -> AsyncIterator[tuple[int, Event]]:
        """Yield ``(tag, event)`` until every row has finished."""
        running = len(self.requests)
        while running:
            tag, event = await self.queue.get()
            if isinstance(event, ErrorEvent):
                raise RuntimeError(event.message)
            if isinstance(event, FinishEvent):
                running -= 1
            yield tag, event

    async def collect(self) -> list[ChoiceOutput]:
        """Wait for every row; return one :class:`ChoiceOutput` per tag."""
        outs = [ChoiceOutput() for _ in self.requests]
        async for tag, event in self.events():
            out = outs[tag]
            if isinstance(event, TokenEvent):
                out.token_ids.append(event.token_id)
                out.logprobs.append(event.logprob)
                out.top_logprobs.append(event.top_logprobs or [])
                out.text += event.text
            elif isinstance(event, FinishEvent):
                out.text += event.text
                out.finish_reason, out.stop_reason = event.reason, event.stop_reason
        return outs

    def cancel(self) -> None:
        """Stop generating every row (idempotent)."""
        for req in self.requests:
            req.cancelled.set()


@dataclass
class CPUServerApp:
    """The ASGI application."""

    engine: Engine
    served_model_name: str
    max_logprobs: int = 20
    api_key: str | None = field(default=None, repr=False)
    _token_text: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        diff = self.engine.model.generation_config.to_diff_dict()
        self.defaults = SamplingParams(
            temperature=float(diff.get("temperature", 1.0)), top_p=float(diff.get("top_p", 1.0))
        )

    def token_text(self, token_id: int) -> str:
        """The decoded text of one token (cached)."""
        text = self._token_text.get(token_id)
        if text is None:
            text = self.engine.tokenizer.decode([token_id], skip_special_tokens=False)
            self._token_text[token_id] = text
        return text

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await asyncio.to_thread(self.engine.close)
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _authorized(self, scope: Scope) -> bool:
        if not self.api_key or not scope["path"].startswith("/v1"):
            return True
        given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        return hmac.compare_digest(given, b"Bearer " + self.api_key.encode())

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._authorized(scope):
            await send_json(send, 401, error_body("missing or wrong API key", "authentication_error", 401))
            return
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        handler = asyncio.ensure_future(self._respond(scope["method"], scope["path"], body, send))
        watcher = asyncio.ensure_future(_wait_disconnect(receive))
        done, _ = await asyncio.wait({handler, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if handler in done:
            watcher.cancel()
            handler.result()
            return
        handler.cancel()  # the client went away: the handler's finally-blocks cancel its rows
        with contextlib.suppress(asyncio.CancelledError):
            await handler

    async def _respond(self, method: str, path: str, body: bytes, send: Send) -> None:
        routes = {
            "/health": ("GET", self._health),
            "/v1/models": ("GET", self._models),
            "/v1/chat/completions": ("POST", self._chat),
            "/v1/completions": ("POST", self._completions),
            "/v1/load_weights": ("POST", self._load_weights),
            "/tokenize": ("POST", self._tokenize),
        }
        if path not in routes:
            await send_json(send, 404, error_body(f"{path} not found", "not_found_error", 404))
            return
        allowed, handler = routes[path]
        if method != allowed:
            await send_json(send, 405, error_body("method not allowed", "invalid_request_error", 405))
            return
        try:
            await handler(body, send)
        except (BadRequestError, PromptTooLongError) as exc:
            await send_json(send, 400, error_body(str(exc), "invalid_request_error", 400))
        except ModelNotFoundError as exc:
            await send_json(send, 404, error_body(str(exc), "NotFoundError", 404))
        except orjson.JSONDecodeError as exc:
            await send_json(send, 400, error_body(f"malformed JSON body: {exc}", "invalid_request_error", 400))
        except Exception as exc:
            # frames only: an exception message may quote the request body, which is never logged
            log.error(
                "request to %s failed with %s:\n%s",
                path,
                type(exc).__name__,
                "".join(traceback.format_tb(exc.__traceback__)),
            )
            await send_json(send, 500, error_body(f"{type(exc).__name__}: {exc}", "internal_server_error", 500))

    async def _health(self, body: bytes, send: Send) -> None:
        await send_json(send, 200, {"status": "ok", "pid": os.getpid()})

    async def _models(self, body: bytes, send: Send) -> None:
        card = {
            "id": self.served_model_name,
            "object": "model",
            "created": 0,
            "owned_by": "repro",
            "root": str(self.engine.loaded_dir),
            "parent": None,
            "max_model_len": self.engine.max_model_len,
        }
        await send_json(send, 200, {"object": "list", "data": [card]})

    async def _load_weights(self, body: bytes, send: Send) -> None:
        await send_json(send, 200, await reload_weights(self.engine, body))

    def _render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
        kwargs: dict[str, Any],
    ) -> list[int]:
        try:
            ids = self.engine.tokenizer.apply_chat_template(
                messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                tokenize=True,
                return_dict=False,
                **kwargs,
            )
        except Exception as exc:  # template errors are the request's fault
            raise BadRequestError(f"cannot apply the chat template: {type(exc).__name__}: {exc}") from exc
        return list(ids)

    async def _chat(self, body: bytes, send: Send) -> None:
        req = parse_chat_request(orjson.loads(body), self.defaults, self.max_logprobs)
        check_model(req.common.model, self.served_model_name)
        prompt_ids = self._render_chat(req.messages, req.tools, req.add_generation_prompt, req.chat_template_kwargs)
        generation = Generation(self.engine, [prompt_ids], req.common)
        await self._answer(
            send, generation,
            lambda: ChatStreamer(req.common, self.served_model_name, prompt_ids, req.parse_tools, self.token_text),
            lambda outs: build_chat_response(
                outs, req.common, self.served_model_name, prompt_ids, req.parse_tools, self.token_text),
        )

    async def _tokenize(self, body: bytes, send: Send) -> None:
        """vLLM's ``/tokenize``: a chat request's rendered prompt (``messages``, ``tools``) or a ``prompt`` string."""
        fields = orjson.loads(body)
        if isinstance(fields, dict) and isinstance(fields.get("prompt"), str):
            ids = list(self.engine.tokenizer(fields["prompt"])["input_ids"])
        else:
            req = parse_chat_request(fields, self.defaults, self.max_logprobs)
            ids = self._render_chat(req.messages, req.tools, req.add_generation_prompt, req.chat_template_kwargs)
        await send_json(send, 200, {"count": len(ids), "max_model_len": self.engine.max_model_len, "tokens": ids})

    async def _completions(self, body: bytes, send: Send) -> None:
        req = parse_completion_request(orjson.loads(body), self.defaults, self.max_logprobs)
        check_model(req.common.model, self.served_model_name)
        tokenizer = self.engine.tokenizer
        prompts = [p if isinstance(p, list) else tokenizer(p)["input_ids"] for p in req.prompts]
        vocab = len(tokenizer)
        if any(not 0 <= t < vocab for p in prompts for t in p):
            raise BadRequestError(f"prompt token ids must be in [0, {vocab})")
        generation = Generation(self.engine, prompts, req.common)
        await self._answer(
            send, generation,
            lambda: CompletionStreamer(req.common, self.served_model_name, prompts, self.token_text),
            lambda outs: build_completion_response(outs, req.common, self.served_model_name, prompts, self.token_text),
        )

    @staticmethod
    async def _answer(send: Send, generation: Generation, streamer: Callable[[], Any],
                      build: Callable[[list], dict[str, Any]]) -> None:
        """Stream SSE chunks or send the whole response; the engine rows stop whatever happens."""
        try:
            if generation.common.stream:
                await stream_sse(send, streamer().run(generation.events()))
            else:
                await send_json(send, 200, build(await generation.collect()))
        finally:
            generation.cancel()


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def stream_sse(send: Send, chunks: AsyncIterator[dict[str, Any]]) -> None:
    """Send server-sent events ``data: {...}`` for each chunk, then ``data: [DONE]``."""
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")],
        }
    )
    send_chunk: SendJson = lambda obj: send(  # noqa: E731
        {"type": "http.response.body", "body": b"data: " + orjson.dumps(obj) + b"\n\n", "more_body": True}
    )
    try:
        async for chunk in chunks:
            await send_chunk(chunk)
    except RuntimeError as exc:  # generation failed after the headers went out
        log.error("streaming generation failed: %s", exc)
        await send_chunk(error_body(str(exc), "internal_server_error", 500))
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


def server_script(config: ServerConfig) -> Script | None:
    """What scripts the completions under ``config``: scenario replies, the expert, or nothing (the model samples)."""
    if config.scenarios is not None:
        return scenario_script(config.scenarios)
    if config.expert_tasks is not None:
        return load_script(EXPERT_SCRIPT, Path(config.expert_tasks), config.expert_slip_rate, config.expert_slip_seed,
                           config.expert_slip_operators)
    return None


def create_app(config: ServerConfig, script: Script | None = None) -> CPUServerApp:
    """Load the engine and build the ASGI app; the completions are scripted by ``script`` when given, else by what
    :func:`server_script` finds in ``config``, else sampled from the model."""
    script = script or server_script(config)
    engine = Engine(config.engine) if script is None else ScriptedEngine(config.engine, script)
    name = config.served_model_name or config.engine.model_dir.resolve().name
    return CPUServerApp(engine, name, config.max_logprobs, api_key=config.api_key)


def run_server(config: ServerConfig) -> None:
    """Load the model and serve until interrupted."""
    import uvicorn
    from transformers.utils import logging as hf_logging

    logging.basicConfig(level=config.log_level.upper())
    hf_logging.disable_progress_bar()
    app = create_app(config)
    uvicorn.run(app, host=config.host, port=config.port, log_level=config.log_level, lifespan="on")


def main(argv: list[str] | None = None) -> None:
    """``python -m repro.serving.cpu_server`` entry point (same flags as ``repro serve``)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m repro.serving.cpu_server", description=__doc__)
    CpuServerArgs.add_arguments(parser)
    run_server(CpuServerArgs.from_args(parser.parse_args(argv)).server_config())


if __name__ == "__main__":
    main()
