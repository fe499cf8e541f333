"""Deterministic fakes for unit tests and the proxy benchmark. Never used on the main path.

``FakeVllmUpstream`` speaks vLLM's OpenAI dialect (``prompt_token_ids``, per-choice ``token_ids``, logprobs)
with one token per byte of text, so tests can check exactly what was attributed to which call. The model
name selects a behaviour: ``fail-500``, ``over-context`` (vLLM's 400 for a prompt longer than the context),
``silent`` (never answers), ``drop`` (stream cut before
``[DONE]``), ``slow-stream`` (a pause between chunks), or one of ``UPSTREAM_FAULTS`` (a misbehaving upstream:
values the store cannot keep, malformed SSE); anything else answers normally. ``echo: true`` on text
completions puts the prompt's logprobs (the first one ``null``) in front, as vLLM does.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import orjson

from repro.common.asgi import SSE_HEADERS, Receive, Send, read_body, send_bytes


def _content_text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


def fake_prompt_ids(request: dict[str, Any]) -> list[int]:
    """Prompt ids the fake reports: one per 4 bytes of the prompt, about what a real BPE gives for code.

    Each id is the first byte of its 4-byte piece, so a prompt that extends another one gets ids that
    extend the other's (chat: message contents joined by newlines).
    """
    if "messages" in request:
        text = "\n".join(_content_text(m.get("content")) for m in request["messages"])
    else:
        prompt = request["prompt"]
        if isinstance(prompt, list):
            return list(prompt)
        text = prompt
    return list(text.encode()[::4])


def fake_completion_text(request: dict[str, Any], tokens: int) -> str:
    """An answer that names what was asked, padded to ``tokens`` bytes."""
    is_chat = "messages" in request
    asked = _content_text(request["messages"][-1].get("content")) if is_chat else str(request["prompt"])
    text = ("echo:" + asked[-40:]).encode("ascii", "replace").decode()
    text = (text + " " + "x" * tokens)[:tokens]
    return text


UPSTREAM_FAULTS = {
    "null-logprob": "a null logprob for a sampled token",
    "huge-id": "a token id of 2**31 (outside int32)",
    "nan-logprob": "a NaN literal where a logprob goes",
    "inf-logprob": "1e999 (infinity) where a logprob goes",
    "sse-array": "a non-object SSE event (data: [1, 2]) mid-stream",
    "sse-truncated": "an SSE event cut off mid-JSON, then the rest of the stream",
    "sse-truncated-end": "an SSE event cut off mid-JSON, then the connection closes",
    "error-event": "an error object mid-stream, then data: [DONE]",
}
_ERROR_EVENT = b'data: {"error": {"message": "fake engine failure", "type": "InternalServerError", "code": 500}}\n\n'


def over_context_body(prompt_tokens: int, limit: int = 8) -> bytes:
    """vLLM 0.32's refusal of a prompt longer than the context (``vllm/renderers/params.py``), word for word."""
    return orjson.dumps({"error": {
        "message": f"This model's maximum context length is {limit} tokens. However, your prompt contains "
                   f"{prompt_tokens} input tokens, which exceeds this limit even without any output tokens. Please "
                   "reduce the length of the input prompt.",
        "type": "BadRequestError", "param": "input_tokens", "code": 400}})


def _first_logprob_path(body: dict[str, Any]) -> tuple[Any, Any]:
    """(container, key) of the first sampled token's logprob in a response or chunk body."""
    logprobs = body["choices"][0]["logprobs"]
    if "content" in logprobs:
        return logprobs["content"][0], "logprob"
    return logprobs["token_logprobs"], -len(body["choices"][0]["token_ids"])


def faulty_json(model: str, body: dict[str, Any]) -> bytes:
    """``body`` serialised with the value fault ``model`` names (a response or a chunk with tokens)."""
    if model == "null-logprob":
        container, key = _first_logprob_path(body)
        container[key] = None
    elif model == "huge-id":
        body["choices"][0]["token_ids"][0] = 2**31
    elif model in ("nan-logprob", "inf-logprob"):
        container, key = _first_logprob_path(body)
        container[key] = -12345.5
        return orjson.dumps(body).replace(b"-12345.5", b"NaN" if model == "nan-logprob" else b"1e999", 1)
    return orjson.dumps(body)


def faulty_stream(model: str, chunks: list[bytes]) -> list[bytes]:
    """SSE events of a stream with the stream fault ``model`` names (the last event is ``[DONE]``)."""
    middle = len(chunks) // 2
    if model == "sse-array":
        return [*chunks[:middle], b"data: [1, 2]\n\n", *chunks[middle:]]
    if model == "sse-truncated":
        return [*chunks[:middle], chunks[middle][:24] + b"\n\n", *chunks[middle + 1 :]]
    if model == "sse-truncated-end":
        return [*chunks[:middle], chunks[middle][:24]]
    if model == "error-event":
        return [*chunks[:middle], _ERROR_EVENT, chunks[-1]]
    if model in UPSTREAM_FAULTS:  # a value fault in the first chunk that carries tokens
        return [chunks[0], b"data: " + faulty_json(model, orjson.loads(chunks[1][6:])) + b"\n\n", *chunks[2:]]
    return chunks


class FakeVllmUpstream:
    """An ASGI app answering /v1/chat/completions and /v1/completions like vLLM would."""

    def __init__(self, completion_tokens: int = 16, tokens_per_chunk: int = 1, chunk_delay_s: float = 0.0) -> None:
        self.completion_tokens = completion_tokens
        self.tokens_per_chunk = tokens_per_chunk
        self.chunk_delay_s = chunk_delay_s
        self.requests = 0
        self.cancelled = 0
        self.last_request: dict[str, Any] | None = None

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        path = scope["path"]
        if path == "/v1/models" or path == "/health":
            return await send_bytes(send, 200, orjson.dumps({"object": "list", "data": [{"id": "fake"}]}))
        body = orjson.loads(await read_body(receive, 1 << 30))
        self.requests += 1
        self.last_request = body
        endpoint = "chat" if path.endswith("chat/completions") else "completions"
        model = body.get("model", "")
        if model == "fail-500":
            return await send_bytes(send, 500, b'{"error": {"message": "fake upstream failure"}}')
        if model == "over-context":
            return await send_bytes(send, 400, over_context_body(len(fake_prompt_ids(body))))
        if model == "silent":
            await asyncio.sleep(3600)
        tokens = int(body.get("max_tokens") or self.completion_tokens)
        text = fake_completion_text(body, min(tokens, self.completion_tokens))
        if body.get("stream"):
            return await self._stream(body, endpoint, text, receive, send)
        await send_bytes(send, 200, faulty_json(model, self._unary(body, endpoint, text)))

    def _unary(self, body: dict[str, Any], endpoint: str, text: str) -> dict[str, Any]:
        ids = list(text.encode())
        lp = [-0.5] * len(ids)
        prompt_ids = fake_prompt_ids(body)
        finish = "length" if len(ids) >= int(body.get("max_tokens") or 1 << 30) else "stop"
        if endpoint == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish,
                      "logprobs": {"content": [{"token": chr(t), "logprob": v, "bytes": [t], "top_logprobs": []}
                                               for t, v in zip(ids, lp, strict=True)]},
                      "token_ids": ids}
            extra = {"prompt_token_ids": prompt_ids}
        else:
            echoed = [None, *[-0.25] * (len(prompt_ids) - 1)] if body.get("echo") and prompt_ids else []
            choice = {"index": 0, "text": text, "finish_reason": finish, "token_ids": ids,
                      "prompt_token_ids": prompt_ids,
                      "logprobs": {"tokens": list(text), "token_logprobs": [*echoed, *lp], "top_logprobs": None,
                                   "text_offset": list(range(len(ids)))}}
            extra = {}
        usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids),
                 "total_tokens": len(prompt_ids) + len(ids)}
        return {"id": "cmpl-fake", "object": "chat.completion" if endpoint == "chat" else "text_completion",
                "created": int(time.time()), "model": body.get("model"), "choices": [choice], "usage": usage,
                **extra}

    def _chunks(self, body: dict[str, Any], endpoint: str, text: str) -> list[bytes]:
        ids = list(text.encode())
        head: dict[str, Any] = {"id": "chunk-fake", "object": "chat.completion.chunk", "model": body.get("model")}
        first = {**head, "prompt_token_ids": fake_prompt_ids(body),
                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
        if endpoint != "chat":
            first = {**head, "choices": [{"index": 0, "text": "", "token_ids": [], "finish_reason": None,
                                          "prompt_token_ids": fake_prompt_ids(body)}]}
        chunks = [first]
        step = self.tokens_per_chunk
        for i in range(0, len(ids), step):
            part = ids[i : i + step]
            piece = bytes(part).decode()
            last = i + step >= len(ids)
            choice: dict[str, Any] = {"index": 0, "token_ids": part, "finish_reason": "stop" if last else None}
            if endpoint == "chat":
                choice["delta"] = {"content": piece}
                choice["logprobs"] = {"content": [{"token": chr(t), "logprob": -0.5, "bytes": [t],
                                                   "top_logprobs": []} for t in part]}
            else:
                choice["text"] = piece
            chunks.append({**head, "choices": [choice]})
        if (body.get("stream_options") or {}).get("include_usage"):
            n_prompt = len(fake_prompt_ids(body))
            chunks.append({**head, "choices": [], "usage": {"prompt_tokens": n_prompt, "completion_tokens": len(ids),
                                                            "total_tokens": n_prompt + len(ids)}})
        events = [b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks]
        return faulty_stream(body.get("model", ""), [*events, b"data: [DONE]\n\n"])

    async def _stream(self, body: dict[str, Any], endpoint: str, text: str, receive: Receive, send: Send) -> None:
        chunks = self._chunks(body, endpoint, text)
        model = body.get("model")
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        delay = 0.05 if model == "slow-stream" else self.chunk_delay_s
        gone = asyncio.Event()
        watcher = asyncio.ensure_future(_watch(receive, gone)) if delay else None
        try:
            for i, chunk in enumerate(chunks[:-1]):
                if model == "drop" and i == len(chunks) // 2:
                    raise RuntimeError("fake upstream drops the connection mid-stream")
                if gone.is_set():
                    self.cancelled += 1
                    return
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                if delay:
                    await asyncio.sleep(delay)
            await send({"type": "http.response.body", "body": chunks[-1], "more_body": False})
        finally:
            if watcher is not None:
                watcher.cancel()


async def _watch(receive: Receive, gone: asyncio.Event) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    gone.set()


def main(argv: list[str] | None = None) -> None:
    """``python -m repro.testing --port N``: serve the fake upstream (used by the proxy benchmark)."""
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m repro.testing",
                                     description="Fake vLLM-dialect upstream (tests and benchmarks only).")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--completion-tokens", type=int, default=16)
    args = parser.parse_args(argv)
    app = FakeVllmUpstream(completion_tokens=args.completion_tokens)
    uvicorn.run(app, host="127.0.0.1", port=args.port, loop="uvloop", http="httptools", log_level="warning",
                access_log=False, lifespan="on", backlog=4096)
