"""An OpenAI-compatible chat stub (threads, no model) and the replies it gives, for harness tests."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

# (rollout id, body) -> (status, body): a dict is sent as JSON, a str as a server-sent event stream (its raw text)
StubReply = Callable[[str, dict[str, Any]], tuple[int, dict[str, Any] | str]]
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
    at once) and answered with ``reply(rollout_id, body)`` after ``delay_s(rollout_id)`` seconds (a reply body
    given as text goes out as an event stream); the rollout id is the ``<id>`` of a ``/rollouts/<id>/...`` path
    ('' for another path)."""

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

    def answer(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> tuple[int, dict[str, Any] | str]:
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
                streamed = isinstance(payload, str)
                data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
                self.send_response(code)
                self.send_header("content-type", "text/event-stream" if streamed else "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        return Handler
