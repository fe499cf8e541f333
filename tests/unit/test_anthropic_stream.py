"""Anthropic Messages streamed from chat chunks (repro.proxy.anthropic_stream), and the /v1/messages route's faults
against the fake upstream with the official ``anthropic`` SDK: errors in Anthropic's format, recorded as failed."""

from __future__ import annotations

import json

import anthropic
import httpx
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from repro.proxy.anthropic_stream import MessagesDialect, MessagesStream
from repro.proxy.errors import ProxyError
from repro.store import CallRecord
from tests.support import RunningProxy


def _events(raw: bytes) -> list[dict]:
    """Parse SSE bytes; each event's ``event:`` line must name its data's type."""
    out = []
    for block in raw.decode().split("\n\n"):
        if not block:
            continue
        name, data = block.split("\n")
        assert name == "event: " + json.loads(data[len("data: "):])["type"]
        out.append(json.loads(data[len("data: "):]))
    return out


def _chunk(content: str | None = None, tool: dict | None = None, **top) -> dict:
    delta = {"content": content} if content is not None else {}
    if tool is not None:
        delta["tool_calls"] = [tool]
    return {"id": "c1", "choices": [{"index": 0, "delta": delta}], **top}


def _finished(stream: MessagesStream, finish: str, tokens: int) -> list[dict]:
    call = CallRecord(rollout_id="r", seq=0, endpoint="messages", status="ok", finish_reason=finish,
                      completion_tokens=tokens)
    return _events(stream.finish(call))


pieces = st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=12)


@given(text=pieces, arguments=pieces)
def test_deltas_concatenate_to_the_text_and_the_tool_input(text: list[str], arguments: list[str]) -> None:
    stream = MessagesStream("m")
    raw = stream.events(_chunk(text[0], prompt_token_ids=[1, 2, 3]))
    raw += b"".join(stream.events(_chunk(t)) for t in text[1:])
    raw += stream.events(_chunk(tool={"index": 0, "id": "t1", "function": {"name": "Bash", "arguments": ""}}))
    raw += b"".join(stream.events(_chunk(tool={"index": 0, "function": {"arguments": a}})) for a in arguments)
    events = _events(raw) + _finished(stream, "tool_calls", 7)
    assert events[0]["message"]["usage"]["input_tokens"] == 3
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert "".join(d["text"] for d in deltas if d["type"] == "text_delta") == "".join(text)
    assert "".join(d["partial_json"] for d in deltas if d["type"] == "input_json_delta") == "".join(arguments)
    starts = [e for e in events if e["type"] == "content_block_start"]
    assert [s["index"] for s in starts] == [0, 1]
    assert starts[1]["content_block"] == {"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}
    assert [e["index"] for e in events if e["type"] == "content_block_stop"] == [0, 1]
    assert events[-2] == {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                          "usage": {"output_tokens": 7}}
    assert events[-1] == {"type": "message_stop"}


def test_two_tool_calls_are_two_blocks_and_an_empty_stream_is_a_whole_message() -> None:
    stream = MessagesStream("m")
    raw = b"".join(stream.events(_chunk(tool={"index": i, "id": f"t{i}", "function": {"name": "Bash",
                                                                                   "arguments": "{}"}}))
                   for i in range(2))
    kinds = [(e["type"], e.get("index")) for e in _events(raw) + _finished(stream, "tool_calls", 2)]
    assert kinds == [("message_start", None), ("content_block_start", 0), ("content_block_delta", 0),
                     ("content_block_stop", 0), ("content_block_start", 1), ("content_block_delta", 1),
                     ("content_block_stop", 1), ("message_delta", None), ("message_stop", None)]
    empty = MessagesStream("m")
    assert [e["type"] for e in _finished(empty, "length", 0)] == ["message_start", "message_delta", "message_stop"]
    assert _finished(MessagesStream("m"), "length", 0)[1]["delta"]["stop_reason"] == "max_tokens"


def test_errors_are_in_anthropic_format() -> None:
    assert _events(MessagesStream("m").error(ProxyError(502, "upstream down", kind="upstream_error"))) == [
        {"type": "error", "error": {"type": "api_error", "message": "upstream down"}}]
    body = orjson.loads(MessagesDialect().error_body(ProxyError(404, "unknown rollout")))
    assert body == {"type": "error", "error": {"type": "not_found_error", "message": "unknown rollout"}}


def _client(proxy: RunningProxy, rollout_id: str) -> anthropic.Anthropic:
    base = proxy.new_rollout(rollout_id).removesuffix("/v1")
    return anthropic.Anthropic(base_url=base, api_key="k", max_retries=0, timeout=10)


def test_upstream_failure_is_a_typed_error_and_a_failed_record(proxy: RunningProxy) -> None:
    client = _client(proxy, "a500")
    with pytest.raises(anthropic.InternalServerError) as failed:
        client.messages.create(model="fail-500", max_tokens=8, messages=[{"role": "user", "content": "x"}])
    assert failed.value.status_code == 502 and failed.value.body["error"]["type"] == "api_error"
    (call,) = proxy.store().calls("a500")
    assert call.status == "error" and call.endpoint == "messages"


def test_stream_cut_by_upstream_ends_with_an_error_event(proxy: RunningProxy) -> None:
    client = _client(proxy, "acut")
    with pytest.raises(anthropic.APIStatusError, match="upstream stream failed"), client.messages.stream(
            model="drop", max_tokens=8, messages=[{"role": "user", "content": "x"}]) as events:
        for _ in events:
            pass
    (call,) = proxy.store().calls("acut")
    assert call.status == "error" and "upstream stream failed" in call.error


def test_malformed_messages_request_is_400_in_anthropic_format_and_writes_nothing(proxy: RunningProxy) -> None:
    base = proxy.new_rollout("abad")
    resp = httpx.post(f"{base}/messages", content=b"{not json", headers={"content-type": "application/json"})
    assert resp.status_code == 400 and resp.json()["type"] == "error"
    assert resp.json()["error"]["type"] == "invalid_request_error"
    resp = httpx.post(f"{base}/messages", json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert resp.status_code == 400 and "max_tokens" in resp.json()["error"]["message"]
    assert proxy.store().calls("abad") == []
