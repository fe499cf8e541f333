"""Deterministic fakes for unit tests and the proxy benchmark. Never used on the main path.

``FakeVllmUpstream`` speaks vLLM's OpenAI dialect (``prompt_token_ids``, per-choice ``token_ids``, logprobs)
with one token per byte of text, so tests can check exactly what was attributed to which call. The model
name selects a behaviour: ``fail-500``, ``silent`` (never answers), ``drop`` (stream cut before
``[DONE]``), ``slow-stream`` (a pause between chunks), or one of ``UPSTREAM_FAULTS`` (a misbehaving upstream:
values the store cannot keep, malformed SSE); anything else answers normally. ``echo: true`` on text
completions puts the prompt's logprobs (the first one ``null``) in front, as vLLM does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self

import orjson

from harness_adapters.processes import stream_in_threads
from repro.asgi import SSE_HEADERS, Receive, Send, read_body, send_bytes
from repro.protocols import GradeResult, HarnessResult, HarnessRollout
from repro.sandbox.repos import RepoError


class FakeTrainingRow:
    """A training row for trainer unit tests: loss on every token after the first ``prompt_len``, weight 1, no
    recorded logprobs (0.0: the ratio check is off in those tests)."""

    def __init__(self, ids: list[int], advantage: float, prompt_len: int = 2) -> None:
        self.input_ids = ids
        self.loss_mask = [0] * prompt_len + [1] * (len(ids) - prompt_len)
        self.old_logprobs = [0.0] * len(ids)
        self.weight = 1.0
        self.advantage = advantage


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

    parser = argparse.ArgumentParser(description="Fake vLLM-dialect upstream (tests and benchmarks only).")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--completion-tokens", type=int, default=16)
    args = parser.parse_args(argv)
    app = FakeVllmUpstream(completion_tokens=args.completion_tokens)
    uvicorn.run(app, host="127.0.0.1", port=args.port, loop="uvloop", http="httptools", log_level="warning",
                access_log=False, lifespan="on", backlog=4096)


if __name__ == "__main__":
    main()


class ServerThread:
    """Run an ASGI app with uvicorn in a background thread of this process (tests only)."""

    def __init__(self, app: Any, port: int) -> None:
        import threading

        import uvicorn

        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on",
                                access_log=False, timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"server on port {self.port} did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


class FakeHarness:
    """A ``Harness`` for unit tests of what drives one (no process, no model call): each rollout finishes at once;
    the rollouts it ran are kept in ``seen``."""

    name = "fake"
    version = "0"
    cfg: Any

    def __init__(self, cfg: Any = None) -> None:
        self.cfg = cfg
        self.seen: list[HarnessRollout] = []
        self.closed = False

    def identity(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version}

    def run(self, rollouts: list[HarnessRollout], concurrency: int) -> list[HarnessResult]:
        self.seen += rollouts
        return [HarnessResult(r.rollout_id, "finished") for r in rollouts]

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FakeWorkspace:
    """A :class:`FakeSandbox` workspace: no files; its diff names it; ``cleaned`` once cleaned up."""

    def __init__(self, name: str) -> None:
        self.path, self.name, self.cleaned = Path("/nowhere") / name, name, False

    def diff(self) -> str:
        return f"patch of {self.name}"

    def cleanup(self) -> None:
        self.cleaned = True


class FakeSandbox:
    """A sandbox for unit tests of what drives one: a workspace per rollout (kept in ``made``), except for the task
    ``broken``, whose repository is missing; tasks named ``good...`` grade resolved, others unresolved."""

    def __init__(self) -> None:
        self.made: list[FakeWorkspace] = []

    def workspace(self, task: Any, rollout_id: str) -> FakeWorkspace:
        if task.instance_id == "broken":
            raise RepoError("no repository for broken: run `repro tasks fetch`")
        self.made.append(FakeWorkspace(rollout_id))
        return self.made[-1]

    def grade(self, task: Any, workspace: FakeWorkspace) -> GradeResult:
        return GradeResult("resolved" if task.instance_id.startswith("good") else "unresolved", workspace.name)


class FakeStreamingHarness(FakeHarness):
    """:class:`FakeHarness` with ``run_each`` (``repro.protocols.StreamingHarness``): each rollout takes
    ``delay_s`` on a thread; ``max_in_flight`` is the most that ran at once."""

    def __init__(self, cfg: Any = None, delay_s: float = 0.01) -> None:
        super().__init__(cfg)
        self.delay_s, self.in_flight, self.max_in_flight = delay_s, 0, 0
        self._lock = threading.Lock()

    def _run_one(self, rollout: HarnessRollout) -> HarnessResult:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.seen.append(rollout)
        time.sleep(self.delay_s)
        with self._lock:
            self.in_flight -= 1
        return HarnessResult(rollout.rollout_id, "finished")

    def run_each(self, rollouts: Iterable[HarnessRollout], concurrency: int,
                 on_result: Callable[[HarnessRollout, HarnessResult], None]) -> int:
        return stream_in_threads(rollouts, concurrency, self._run_one, on_result, "fake")


StubReply = Callable[[str, dict[str, Any]], tuple[int, dict[str, Any]]]  # (rollout id, body) -> (status, body)
PerRollout = str | Callable[[str], str]  # a text, or the text for a rollout id


def chat_completion(message: dict[str, Any], finish_reason: str = "stop") -> dict[str, Any]:
    """A non-streamed chat completion holding ``message`` (fixed usage, model ``stub``)."""
    return {"id": "chatcmpl-stub", "object": "chat.completion", "created": int(time.time()), "model": "stub",
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}


def _for_rollout(value: PerRollout, rollout_id: str) -> str:
    return value if isinstance(value, str) else value(rollout_id)


def text_reply(content: PerRollout) -> StubReply:
    """Reply with an assistant text (text mode: the action is in it), the same for every rollout or per rollout."""
    return lambda rollout_id, body: (200, chat_completion(
        {"role": "assistant", "content": _for_rollout(content, rollout_id)}))


def tool_call_reply(command: PerRollout) -> StubReply:
    """Reply with one ``bash`` tool call running ``command`` (the same for every rollout or per rollout)."""
    def reply(rollout_id: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        arguments = json.dumps({"command": _for_rollout(command, rollout_id)})
        call = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": arguments}}
        return 200, chat_completion({"role": "assistant", "content": "Running it.", "tool_calls": [call]},
                                    "tool_calls")

    return reply


class StubChatServer:
    """An OpenAI-compatible chat stub on 127.0.0.1 (threads) for harness tests without a model server.

    Every POST is recorded in ``requests`` (path, headers, JSON body), counted while open (``max_open``: the most
    at once) and answered with ``reply(rollout_id, body)`` after ``delay_s(rollout_id)`` seconds; the rollout id
    is the ``<id>`` of a ``/rollouts/<id>/...`` path ('' for another path)."""

    def __init__(self, reply: StubReply, delay_s: Callable[[str], float] | None = None) -> None:
        self.requests: list[dict[str, Any]] = []
        self.max_open = 0
        self._open = 0
        self._lock = threading.Lock()
        self._reply, self._delay_s = reply, delay_s
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def paths(self) -> list[str]:
        """The request paths, in arrival order."""
        return [r["path"] for r in self.requests]

    def url(self, rollout_id: str) -> str:
        """The base URL a harness gets for ``rollout_id`` (``.../rollouts/<id>/v1``, as the proxy's)."""
        return f"http://127.0.0.1:{self.port}/rollouts/{rollout_id}/v1"

    def requests_for(self, rollout_id: str) -> list[str]:
        """The paths requested under ``rollout_id``'s URL."""
        return [p for p in self.paths if p.startswith(f"/rollouts/{rollout_id}/")]

    def answer(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Record one request and compute its reply (after the delay)."""
        parts = path.split("/")
        rollout_id = parts[2] if len(parts) > 2 and parts[1] == "rollouts" else ""
        with self._lock:
            self.requests.append({"path": path, "headers": headers, "body": body})
            self._open += 1
            self.max_open = max(self.max_open, self._open)
        try:
            if self._delay_s is not None:
                time.sleep(self._delay_s(rollout_id))
            return self._reply(rollout_id, body)
        finally:
            with self._lock:
                self._open -= 1

    def __enter__(self) -> Self:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length", 0)))
                code, payload = stub.answer(self.path, dict(self.headers), json.loads(raw) if raw else {})
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        return Handler


class ScenarioEngine:
    """Test fake for harness-behaviour tests: a CPU-server engine that answers from scripted replies.

    ``scenarios_path`` is a JSON object ``{name: [reply text, ...]}``; a prompt belongs to the scenario whose
    marker ``SCENARIO <name>.`` it contains (put it in the task statement), and turn ``i`` (the number of user
    blocks after the first) gets reply ``i`` (the last one repeats). Replies are tokenized canonically and end
    with eos; they go through the real server app, so prompts, token ids and the proxy's records are real."""

    def __new__(cls, config: Any, scenarios_path: Any) -> Any:
        import json
        from pathlib import Path

        from repro.serving.scripted import ScriptedEngine

        scenarios = json.loads(Path(scenarios_path).read_text())

        def reply(prompt: str) -> str:
            name = next((k for k in scenarios if f"SCENARIO {k}." in prompt), None)
            if name is None:
                return ""
            replies, turn = scenarios[name], prompt.count("<|im_start|>user") - 1
            return replies[min(turn, len(replies) - 1)]

        return ScriptedEngine(config, reply)


class FakeByteTokenizer:
    """A byte-level BPE in miniature for drift tests: ids 0-255 are bytes (spelled in GPT-2's byte alphabet),
    ``AB_ID`` is the one merge ``ab`` (so ``[97, 98]`` is a non-canonical spelling of ``ab``), ``EOS_ID`` the
    special ``<e>``. ``decode`` replaces invalid UTF-8 like a real byte-level decoder."""

    AB_ID, EOS_ID, EOS = 256, 257, "<e>"

    def __init__(self) -> None:
        self.eos_token_id = self.EOS_ID
        self.all_special_ids = [self.EOS_ID]
        self.added_tokens_decoder = {self.EOS_ID: self.EOS}

    def _bytes(self, token_id: int) -> bytes:
        return b"ab" if token_id == self.AB_ID else bytes([token_id])

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        out, run = [], b""
        for token_id in ids:
            if token_id == self.EOS_ID:
                out.append(run.decode("utf-8", errors="replace") + ("" if skip_special_tokens else self.EOS))
                run = b""
            else:
                run += self._bytes(token_id)
        return "".join(out) + run.decode("utf-8", errors="replace")

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids: list[int] = []
        for n, part in enumerate(text.split(self.EOS)):
            if n:
                ids.append(self.EOS_ID)
            data, i = part.encode(), 0
            while i < len(data):
                if data[i:i + 2] == b"ab":
                    ids.append(self.AB_ID)
                    i += 2
                else:
                    ids.append(data[i])
                    i += 1
        return ids

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        from repro.tinymodel.qwen3_tokenizer import byte_alphabet

        alphabet = byte_alphabet()
        return [self.EOS if i == self.EOS_ID else "".join(alphabet[b] for b in self._bytes(i)) for i in ids]
