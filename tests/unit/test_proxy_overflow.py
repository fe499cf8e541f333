"""An over-long prompt is answered in the client API's own error and recorded as ``context_exceeded``, apart from
upstream faults (repro.proxy.overflow)."""

from __future__ import annotations

import json

import httpx
import pytest

from repro.proxy.overflow import CODE, RESPONSES_MESSAGE, context_exceeded
from repro.testing.fake_upstream import over_context_body
from tests.support import RunningProxy

pytestmark = pytest.mark.timeout(120)
_TIMEOUT = httpx.Timeout(10.0)
_USER = [{"role": "user", "content": "x" * 40}]  # the fake counts a token per 4 bytes: 10 prompt tokens


def _post(base: str, path: str, body: dict, stream: bool) -> tuple[int, str]:
    with httpx.stream("POST", f"{base}/{path}", json={**body, "stream": stream}, timeout=_TIMEOUT) as resp:
        return resp.status_code, resp.read().decode()


def _recorded(proxy: RunningProxy, rollout_id: str) -> tuple[str, str]:
    (call,) = proxy.store().calls(rollout_id)
    return call.status, call.error


@pytest.mark.parametrize("stream", [False, True])
def test_chat_gets_openais_context_length_exceeded(proxy: RunningProxy, stream: bool) -> None:
    base = proxy.new_rollout(f"chat-{stream}")
    status, text = _post(base, "chat/completions", {"model": "over-context", "messages": _USER}, stream)
    error = json.loads(text)["error"]
    assert status == 400 and (error["code"], error["param"], error["type"]) == (CODE, "messages",
                                                                                "invalid_request_error")
    assert error["message"].startswith("This model's maximum context length is 8 tokens.")
    call_status, call_error = _recorded(proxy, f"chat-{stream}")
    assert call_status == "context_exceeded" and "10 input tokens" in call_error


def test_responses_unary_gets_its_400_and_a_stream_gets_response_failed(proxy: RunningProxy) -> None:
    base = proxy.new_rollout("resp")
    body = {"model": "over-context", "input": "x" * 40}
    status, text = _post(base, "responses", body, stream=False)
    error = json.loads(text)["error"]
    assert status == 400 and (error["code"], error["param"], error["message"]) == (CODE, "input", RESPONSES_MESSAGE)
    status, text = _post(base, "responses", body, stream=True)
    events = [json.loads(line[len("data: "):]) for line in text.splitlines() if line.startswith("data: ")]
    assert status == 200 and [e["type"] for e in events] == ["response.created", "response.in_progress",
                                                     "response.failed"]
    assert events[-1]["response"]["error"] == {"code": CODE, "message": RESPONSES_MESSAGE}
    assert [c.status for c in proxy.store().calls("resp")] == ["context_exceeded"] * 2


@pytest.mark.parametrize("stream", [False, True])
def test_messages_get_anthropics_prompt_is_too_long(proxy: RunningProxy, stream: bool) -> None:
    base = proxy.new_rollout(f"msg-{stream}")
    body = {"model": "over-context", "max_tokens": 4, "messages": _USER}
    status, text = _post(base, "messages", body, stream)
    assert status == 400 and json.loads(text) == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "prompt is too long: 10 tokens > 8 maximum"}}
    assert _recorded(proxy, f"msg-{stream}")[0] == "context_exceeded"


def test_another_refusal_stays_an_upstream_error(proxy: RunningProxy) -> None:
    """Control: an upstream 500 is still a recorded error with the upstream's words, not an overflow."""
    base = proxy.new_rollout("other")
    status, text = _post(base, "chat/completions", {"model": "fail-500", "messages": _USER}, stream=False)
    assert status == 502 and CODE not in text and "fake upstream failure" in text
    assert _recorded(proxy, "other")[0] == "error"


@pytest.mark.parametrize(("message", "counts"), [
    (json.loads(over_context_body(4097, limit=4096))["error"]["message"], (4096, 4097, None)),
    ("This model's maximum context length is 128 tokens. However, your request has 130 input tokens. Please "
     "reduce the length of the input messages.", (128, 130, None)),  # the CPU server's two refusals
    ("This model's maximum context length is 128 tokens. However, you requested 140 tokens (100 in the messages, "
     "40 in the completion). Please reduce the length of the messages or completion.", (128, 100, 40)),
])
def test_the_servers_refusals_are_read_with_their_counts(message: str, counts: tuple) -> None:
    found = context_exceeded(400, json.dumps({"error": {"message": message, "code": 400}}).encode())
    assert found is not None and (found.limit, found.prompt_tokens, found.completion_tokens) == counts
    assert context_exceeded(400, b'{"error": {"message": "temperature must be >= 0"}}') is None
    assert context_exceeded(500, json.dumps({"error": {"message": message}}).encode()) is None
    assert context_exceeded(400, b"not json") is None


def test_a_prompt_that_fits_without_room_to_answer_tells_anthropic_clients_both_counts() -> None:
    message = ("This model's maximum context length is 128 tokens. However, you requested 140 tokens (100 in the "
               "messages, 40 in the completion). Please reduce the length of the messages or completion.")
    found = context_exceeded(400, json.dumps({"error": {"message": message}}).encode())
    assert found is not None and found.anthropic_message() == (
        "input length and `max_tokens` exceed context limit: 100 + 40 > 128, decrease input length or "
        "`max_tokens` and try again")
