"""OpenAI Responses -> chat completions and back (the proxy's /v1/responses route): the shapes Codex CLI 0.169 sends
(developer messages, environment_context, reasoning items, namespace and hosted tools, function_call round trips),
the response object and its SSE stream, checked against the official ``openai`` SDK's own models."""

from __future__ import annotations

import json
from itertools import pairwise
from typing import Any

import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from repro.proxy.assemble import StreamAccumulator
from repro.proxy.dialects import Dialect
from repro.proxy.errors import ProxyError, upstream_error
from repro.proxy.openai_responses import ResponsesDialect, responses_to_chat
from repro.proxy.openai_responses_stream import chat_to_response
from repro.proxy.validation import check_chat
from repro.store import CallRecord

DIALECT: Dialect = ResponsesDialect()
EVENT = TypeAdapter(ResponseStreamEvent)
SHELL = {"type": "function", "name": "shell", "description": "Runs a shell command.", "strict": False,
         "parameters": {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}},
                        "required": ["command"], "additionalProperties": False}}
NAMESPACE = {"type": "namespace", "name": "mcp__docs", "description": "Docs server",
             "tools": [{"type": "function", "name": "search", "parameters": {"type": "object"}}]}
CODEX = {  # the shape of Codex CLI 0.169's first request (issue 35), shortened
    "model": "tiny", "stream": True, "store": False, "tool_choice": "auto", "parallel_tool_calls": False,
    "reasoning": {"effort": "medium", "summary": "auto"}, "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "0199-session", "text": {"verbosity": "medium"},
    "tools": [SHELL, {"type": "function", "name": "update_plan", "description": "Plan.", "strict": False,
                      "parameters": {"type": "object", "properties": {}}},
              NAMESPACE, {"type": "web_search", "external_web_access": False}],
    "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions>x"}]},
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<collaboration>y"}]},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "<environment_context>\n  <cwd>/w</cwd>\n</environment_context>"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix the failing test."}]}]}
CODEX_TURN_2 = [  # what Codex appends after a shell call (store: false, so the whole history is sent)
    {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
    {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": '{"command":["ls"]}'},
    {"type": "function_call_output", "call_id": "call_1", "output": "a.py\nb.py"}]


# --- request translation ------------------------------------------------------------------------------------------

def test_a_codex_cli_request_translates_with_its_unsupported_parts_named() -> None:
    out = DIALECT.to_chat(CODEX)
    check_chat(out.chat)
    assert out.chat["messages"] == [
        {"role": "system", "content": "<permissions>x"}, {"role": "system", "content": "<collaboration>y"},
        {"role": "user", "content": "<environment_context>\n  <cwd>/w</cwd>\n</environment_context>"},
        {"role": "user", "content": "Fix the failing test."}]
    assert [t["function"]["name"] for t in out.chat["tools"]] == ["shell", "update_plan"]
    assert out.chat["tools"][0]["function"] == {k: v for k, v in SHELL.items() if k != "type"}
    assert out.chat["tool_choice"] == "auto"
    assert out.chat["stream"] is True and out.chat["stream_options"] == {"include_usage": True}
    for name in ("store", "reasoning", "include", "parallel_tool_calls", "prompt_cache_key", "text",
                 "namespace tool mcp__docs", "web_search tool"):
        assert name in out.ignored
    assert not {"store", "reasoning", "include", "parallel_tool_calls", "text"} & set(out.chat)


def test_a_codex_tool_round_trip_becomes_an_assistant_tool_call_and_a_tool_message() -> None:
    out = DIALECT.to_chat({**CODEX, "input": CODEX["input"] + CODEX_TURN_2})
    assert out.chat["messages"][4:] == [
        {"role": "assistant", "content": "Looking.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": '{"command":["ls"]}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.py\nb.py"}]
    assert "reasoning item" in out.ignored


def test_consecutive_calls_share_one_assistant_message_and_a_later_call_starts_another() -> None:
    call = {"type": "function_call", "name": "shell", "arguments": "{}"}
    items = [{"role": "user", "content": "go"}, {**call, "call_id": "a"}, {**call, "call_id": "b"},
             {"type": "function_call_output", "call_id": "a", "output": "A"},
             {"type": "function_call_output", "call_id": "b", "output": [{"type": "input_text", "text": "B"}]},
             {**call, "call_id": "c"}]
    messages = responses_to_chat({"input": items}).chat["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["a", "b"] and messages[1]["content"] is None
    assert messages[3] == {"role": "tool", "tool_call_id": "b", "content": "B"}
    assert [c["id"] for c in messages[4]["tool_calls"]] == ["c"]


def test_instructions_come_first_and_a_developer_message_stays_where_it_is() -> None:
    out = responses_to_chat({"instructions": "Be brief.", "input": [
        {"role": "user", "content": "hi"}, {"role": "developer", "content": "mid"},
        {"type": "message", "role": "system", "content": "sys"}, {"role": "assistant", "content": "ok"}]})
    assert out.chat["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                                    {"role": "system", "content": "mid"}, {"role": "system", "content": "sys"},
                                    {"role": "assistant", "content": "ok"}]


def test_a_string_input_is_one_user_message() -> None:
    assert responses_to_chat({"input": "hello"}).chat["messages"] == [{"role": "user", "content": "hello"}]


def test_content_parts_join_with_a_newline_and_images_and_files_become_named_placeholders() -> None:
    out = responses_to_chat({"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "see"}, {"type": "input_image", "image_url": "data:image/png;base64,AA"},
        {"type": "input_file", "file_id": "f"}, {"type": "output_text", "text": "end"},
        {"type": "refusal", "refusal": "no"}]}]})
    assert out.chat["messages"][0]["content"] == "see\n[image omitted]\n[file omitted]\nend\nno"
    assert {"input_image part", "input_file part"} <= set(out.ignored)


@pytest.mark.parametrize(("choice", "expected"), [
    ("auto", "auto"), ("required", "required"), ("none", "none"),
    ({"type": "function", "name": "shell"}, {"type": "function", "function": {"name": "shell"}})])
def test_tool_choice_maps_to_chat(choice: Any, expected: Any) -> None:
    out = responses_to_chat({"input": "x", "tools": [SHELL], "tool_choice": choice})
    assert out.chat["tool_choice"] == expected and "tool_choice" not in out.ignored


def test_a_tool_choice_naming_no_function_is_auto_and_named() -> None:
    out = responses_to_chat({"input": "x", "tools": [SHELL], "tool_choice": {"type": "web_search"}})
    assert out.chat["tool_choice"] == "auto" and "tool_choice" in out.ignored
    no_tools = responses_to_chat({"input": "x", "tools": [NAMESPACE], "tool_choice": "required"})
    assert "tools" not in no_tools.chat and "tool_choice" not in no_tools.chat
    assert "tool_choice (no function tools)" in no_tools.ignored


def test_sampling_fields_are_carried_and_the_rest_named() -> None:
    out = responses_to_chat({"model": "m", "input": "x", "max_output_tokens": 64, "temperature": 0.5, "top_p": 0.9,
                             "stream": False, "metadata": {"a": "b"}, "user": "u", "service_tier": "auto",
                             "truncation": "auto", "background": False, "some_new_field": 1, "top_logprobs": None})
    assert out.chat == {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 64,
                        "temperature": 0.5, "top_p": 0.9, "stream": False}
    assert out.ignored == ["metadata", "user", "service_tier", "truncation", "background", "some_new_field"]


@pytest.mark.parametrize("request_", [
    {"input": "x", "previous_response_id": "resp_1"}, {"input": "x", "conversation": "conv_1"},
    {"input": [{"type": "item_reference", "id": "msg_1"}]}])
def test_references_to_server_state_are_refused(request_: dict[str, Any]) -> None:
    with pytest.raises(ProxyError) as err:
        responses_to_chat(request_)
    assert err.value.status == 400 and "keeps no server-side state" in err.value.message


def test_a_null_previous_response_id_is_no_reference() -> None:
    assert responses_to_chat({"input": "x", "previous_response_id": None}).ignored == []


@pytest.mark.parametrize(("request_", "message"), [
    ({}, "'input' must be a string or a list of items"),
    ({"input": 3}, "'input' must be a string or a list of items"),
    ({"input": []}, "'input' has no message to send"),
    ({"input": [{"role": "user", "content": "a"}, 5]}, "input[1] must be an object with a type or role"),
    ({"input": [{"content": "a"}]}, "input[0] must be an object with a type or role"),
    ({"input": [{"type": "message", "role": "tool", "content": "a"}]}, "input[0].role must be one of"),
    ({"input": [{"role": ["user"], "content": "a"}]}, "input[0].role must be one of"),
    ({"input": [{"role": "user"}]}, "input[0].content must be a string or a list of content parts"),
    ({"input": [{"role": "user", "content": ["a"]}]}, "input[0].content[0] must be an object with a type"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": 1}]}]},
     "input[0].content[0].text must be a string"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id must be a string"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]},
     "input[0].arguments must be a string"),
    ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input[0].output must be a string or a list"),
    ({"input": [{"type": "function_call_output", "output": "o"}]}, "input[0].call_id must be a string"),
    ({"input": "x", "instructions": 5}, "'instructions' must be a string"),
    ({"input": "x", "tools": {}}, "'tools' must be a list"),
    ({"input": "x", "tools": [{"name": "f"}]}, "tools[0] must be an object with a type"),
    ({"input": "x", "tools": [{"type": "function"}]}, "tools[0].name must be a non-empty string"),
    ({"input": "x", "max_output_tokens": "64"}, "'max_output_tokens' must be an integer"),
    ({"input": "x", "max_output_tokens": True}, "'max_output_tokens' must be an integer")])
def test_malformed_requests_are_a_400_naming_the_field(request_: dict[str, Any], message: str) -> None:
    with pytest.raises(ProxyError) as err:
        responses_to_chat(request_)
    assert err.value.status == 400 and message in err.value.message


_TEXT = st.text(max_size=12)
_CALL = st.builds(lambda cid, name, args: {"type": "function_call", "call_id": cid, "name": name, "arguments": args},
                  _TEXT, st.sampled_from(["shell", "read"]), _TEXT)
_ITEM = st.one_of(
    _TEXT.map(lambda t: {"type": "message", "role": "user", "content": [{"type": "input_text", "text": t}]}),
    _TEXT.map(lambda t: {"role": "assistant", "content": [{"type": "output_text", "text": t}]}),
    st.just({"type": "reasoning", "id": "rs", "summary": []}), _CALL,
    st.builds(lambda cid, out: {"type": "function_call_output", "call_id": cid, "output": out}, _TEXT, _TEXT))


def _groups(items: list[dict[str, Any]]) -> tuple[list[int], list[str | None]]:
    """For each function_call: its group (a run of calls with nothing but reasoning between), and per group the
    assistant text it joins (None: it starts an assistant message of its own)."""
    kept = [item for item in items if item.get("type") != "reasoning"]
    groups: list[int] = []
    texts: list[str | None] = []
    for j, item in enumerate(kept):
        if item.get("type") != "function_call":
            continue
        previous = kept[j - 1] if j else {}
        if previous.get("type") != "function_call":
            texts.append(previous["content"][0]["text"] if previous.get("role") == "assistant" else None)
        groups.append(len(texts) - 1)
    return groups, texts


@given(st.lists(_ITEM, max_size=12))
def test_every_function_call_becomes_a_tool_call_with_its_call_id_and_arguments_in_order(
        items: list[dict[str, Any]]) -> None:
    items = [{"role": "user", "content": "start"}, *items]
    messages = responses_to_chat({"input": items}).chat["messages"]
    placed = [(n, c) for n, m in enumerate(messages) for c in m.get("tool_calls", [])]
    calls = [i for i in items if i.get("type") == "function_call"]
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for _, c in placed] == [
        (i["call_id"], i["name"], i["arguments"]) for i in calls]
    assert all(messages[n]["role"] == "assistant" for n, _ in placed)
    outputs = [i for i in items if i.get("type") == "function_call_output"]
    assert [(m["tool_call_id"], m["content"]) for m in messages if m["role"] == "tool"] == [
        (i["call_id"], i["output"]) for i in outputs]
    groups, texts = _groups(items)
    at = [n for n, _ in placed]
    assert [a == b for a, b in pairwise(at)] == [a == b for a, b in pairwise(groups)]
    assert [messages[n]["content"] for n in dict.fromkeys(at)] == texts
    said = [i for i in items if i.get("role") in ("user", "assistant")]
    assert len(messages) == len(said) + texts.count(None) + len(outputs)


# --- non-streamed answers -----------------------------------------------------------------------------------------

def chat_body(content: str | None, calls: list[tuple[str, str, str]] = (), finish: str = "stop") -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [{"id": cid, "type": "function", "function": {"name": n, "arguments": a}}
                                 for cid, n, a in calls]
    return {"id": "chatcmpl-9", "object": "chat.completion", "created": 1700000000, "model": "upstream",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}}


def test_a_text_answer_is_a_response_the_sdk_reads() -> None:
    request = {"model": "tiny", "instructions": "Be brief.", "input": "hi", "tools": [SHELL], "metadata": {"k": "v"}}
    out = Response.model_validate(DIALECT.response(chat_body("Hello!"), request))
    assert (out.id, out.object, out.status, out.model, out.created_at) == (
        "resp_chatcmpl-9", "response", "completed", "tiny", 1700000000)
    assert out.output_text == "Hello!" and [item.type for item in out.output] == ["message"]
    assert out.instructions == "Be brief." and out.tools[0].name == "shell" and out.tool_choice == "auto"
    assert out.metadata == {"k": "v"}
    assert out.usage is not None and (out.usage.input_tokens, out.usage.output_tokens, out.usage.total_tokens) == (
        11, 4, 15)
    assert out.usage.input_tokens_details.cached_tokens == 0 and out.usage.output_tokens_details.reasoning_tokens == 0


def test_tool_calls_are_function_call_items_after_the_text() -> None:
    body = chat_body("Let me look.", [("chatcmpl-tool-1", "shell", '{"command":["ls"]}'), ("t2", "shell", "{}")],
                     "tool_calls")
    out = Response.model_validate(DIALECT.response(body, CODEX))
    assert [item.type for item in out.output] == ["message", "function_call", "function_call"]
    first = out.output[1]
    assert (first.call_id, first.name, first.arguments, first.status) == (
        "chatcmpl-tool-1", "shell", '{"command":["ls"]}', "completed")
    assert out.output[1].id != out.output[2].id and out.status == "completed"
    assert out.parallel_tool_calls is False and len(out.tools) == 4  # the Codex tools echoed, hosted ones included


def test_a_call_without_text_has_no_message_item() -> None:
    out = Response.model_validate(DIALECT.response(chat_body(None, [("c", "shell", "{}")], "tool_calls"), {}))
    assert [item.type for item in out.output] == ["function_call"] and out.output_text == ""


@pytest.mark.parametrize(("finish", "reason"), [("length", "max_output_tokens"), ("content_filter", "content_filter")])
def test_a_cut_off_answer_is_incomplete(finish: str, reason: str) -> None:
    out = Response.model_validate(DIALECT.response(chat_body("Hel", finish=finish), {}))
    assert out.status == "incomplete" and out.incomplete_details is not None
    assert out.incomplete_details.reason == reason and out.output[-1].status == "incomplete"


def test_error_body_is_the_openai_error_format() -> None:
    body = json.loads(DIALECT.error_body(upstream_error(502, "upstream down")))
    assert body == {"error": {"message": "upstream down", "type": "upstream_error", "code": 502}}


# --- streamed answers ---------------------------------------------------------------------------------------------

def chunk(delta: dict[str, Any] | None, finish: str | None = None, **top: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-7", "object": "chat.completion.chunk", "created": 1700000001, "model": "upstream",
            "choices": [{"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}], **top}


def chat_chunks(texts: list[str], calls: list[tuple[str, list[str]]] = (), finish: str = "stop",
                late_text: str = "") -> list[dict[str, Any]]:
    """A vLLM-like chat stream: text deltas, tool calls (name first, then argument pieces), a usage chunk."""
    out = [chunk({"role": "assistant", "content": ""}, prompt_token_ids=[1, 2, 3])]
    out += [chunk({"content": t}) for t in texts]
    for i, (name, pieces) in enumerate(calls):
        out.append(chunk({"tool_calls": [{"index": i, "id": f"chatcmpl-tool-{i}", "type": "function",
                                          "function": {"name": name, "arguments": ""}}]}))
        out += [chunk({"tool_calls": [{"index": i, "function": {"arguments": p}}]}) for p in pieces]
    if late_text:
        out.append(chunk({"content": late_text}))
    out.append(chunk({}, finish))
    usage = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    return [*out, {**chunk(None), "choices": [], "usage": usage}]


def recorded(chunks: list[dict[str, Any]]) -> CallRecord:
    """The call as the forwarder records a stream (assemble.StreamAccumulator)."""
    acc = StreamAccumulator()
    acc.feed(b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n")
    call = CallRecord(rollout_id="r", seq=0, endpoint="responses", status="ok", streamed=True)
    acc.fill(call)
    return call


def parse(sse: bytes) -> list[dict[str, Any]]:
    """The data objects of SSE bytes, each checked against its ``event:`` line and the SDK's event types."""
    events = []
    for block in sse.decode().split("\n\n")[:-1]:
        head, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert head == f"event: {event['type']}"
        EVENT.validate_python(event)
        events.append(event)
    return events


def streamed(request: dict[str, Any], chunks: list[dict[str, Any]]) -> tuple[bytes, bytes]:
    """What the translator sends while the chunks arrive, and after the commit."""
    translator = DIALECT.stream(request)
    return b"".join(translator.events(c) for c in chunks), translator.finish(recorded(chunks))


def test_a_streamed_text_and_tool_call_in_the_order_the_sdk_reads() -> None:
    during, after = streamed(CODEX, chat_chunks(["Let ", "me look."], [("shell", ['{"command"', ':["ls"]}'])],
                                                "tool_calls"))
    events = parse(during + after)
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[2]["item"]["content"] == [] and events[3]["part"] == {"type": "output_text", "text": "",
                                                                         "annotations": []}
    assert events[9]["item"]["arguments"] == "" and events[12]["arguments"] == '{"command":["ls"]}'
    final = Response.model_validate(events[-1]["response"])
    assert final.output_text == "Let me look." and final.output[1].call_id == "chatcmpl-tool-0"
    assert final.usage is not None and (final.usage.input_tokens, final.usage.output_tokens) == (3, 5)


def test_only_finish_ends_the_response() -> None:
    during, after = streamed({}, chat_chunks(["a"], [("shell", ["{}"])], "tool_calls"))
    kinds = [e["type"] for e in parse(during + after)]
    ends = {"response.completed", "response.incomplete", "response.failed"}
    assert not ends & set(kinds[:len(parse(during))]) and kinds[-1] == "response.completed"


def test_a_stream_cut_at_the_length_limit_ends_incomplete() -> None:
    events = parse(b"".join(streamed({}, chat_chunks(["Hel"], finish="length"))))
    assert events[-1]["type"] == "response.incomplete"
    final = Response.model_validate(events[-1]["response"])
    assert final.incomplete_details is not None and final.incomplete_details.reason == "max_output_tokens"
    assert events[-2]["item"]["status"] == "incomplete" and final.output[0].status == "incomplete"


def test_text_after_a_tool_call_is_a_second_message() -> None:
    during, after = streamed({}, chat_chunks(["a"], [("shell", ["{}"])], "tool_calls", late_text="b"))
    final = parse(during + after)[-1]["response"]
    assert [item["type"] for item in final["output"]] == ["message", "function_call", "message"]
    assert final["output"][0]["id"] != final["output"][2]["id"]
    assert final["output"][2]["content"][0]["text"] == "b"


def test_a_tool_name_sent_in_pieces_is_whole_in_the_done_item() -> None:
    chunks = chat_chunks([], [("sh", [])], "tool_calls")
    chunks.insert(2, chunk({"tool_calls": [{"index": 0, "function": {"name": "ell", "arguments": "{}"}}]}))
    events = parse(b"".join(streamed({}, chunks)))
    assert events[-2]["item"]["name"] == "shell" and events[-1]["response"]["output"][0]["name"] == "shell"
    assert events[-1]["response"] == chat_to_response(recorded(chunks).response or {}, {})


def test_a_stream_without_chunks_still_opens_and_completes() -> None:
    events = parse(DIALECT.stream({}).finish(CallRecord(rollout_id="r", seq=0, endpoint="responses", status="ok")))
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "response.completed"]
    assert events[0]["response"]["id"] == events[-1]["response"]["id"]


def test_usage_falls_back_to_the_recorded_token_ids() -> None:
    call = CallRecord(rollout_id="r", seq=0, endpoint="responses", status="ok", prompt_ids=[1, 2, 3, 4],
                      completion_ids=[5, 6])
    usage = parse(DIALECT.stream({}).finish(call))[-1]["response"]["usage"]
    assert (usage["input_tokens"], usage["output_tokens"], usage["total_tokens"]) == (4, 2, 6)


@pytest.mark.parametrize("chunks", [[], chat_chunks(["partial"])[:2]])
def test_an_error_ends_the_stream_with_an_error_event_and_a_failed_response(chunks: list[dict[str, Any]]) -> None:
    translator = DIALECT.stream({})
    during = b"".join(translator.events(c) for c in chunks)
    events = parse(during + translator.error(upstream_error(502, "upstream reported an error mid-stream: boom")))
    assert events[0]["type"] == "response.created"
    assert events[-2] == {"type": "error", "code": "upstream_error", "param": None,
                          "message": "upstream reported an error mid-stream: boom",
                          "sequence_number": events[-2]["sequence_number"]}
    failed = Response.model_validate(events[-1]["response"])
    assert events[-1]["type"] == "response.failed" and failed.status == "failed"
    assert failed.error is not None and failed.error.message.endswith("boom")
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


_PIECES = st.lists(st.text(min_size=1, max_size=6), max_size=6)


@settings(max_examples=60, deadline=None)
@given(_PIECES, st.lists(st.tuples(st.sampled_from(["shell", "read"]), _PIECES), max_size=3),
       st.sampled_from(["stop", "length", "tool_calls"]))
def test_a_stream_adds_up_to_the_response_of_its_recorded_body(texts: list[str], calls: list[tuple[str, list[str]]],
                                                               finish: str) -> None:
    chunks = chat_chunks(texts, calls, finish)
    during, after = streamed(CODEX, chunks)
    events = parse(during + after)
    final = events[-1]["response"]
    assert final == chat_to_response(recorded(chunks).response or {}, CODEX)
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == "".join(texts) == Response.model_validate(final).output_text
    assert [e["text"] for e in events if e["type"] == "response.output_text.done"] == ([deltas] if texts else [])
    for index, (name, pieces) in enumerate(calls, start=1 if texts else 0):
        args = "".join(e["delta"] for e in events
                       if e["type"] == "response.function_call_arguments.delta" and e["output_index"] == index)
        assert args == "".join(pieces) == final["output"][index]["arguments"]
        assert final["output"][index]["name"] == name


# --- through the official SDK's client ----------------------------------------------------------------------------

def sdk_client(chunks: list[dict[str, Any]], seen: list[dict[str, Any]],
               fail: ProxyError | None = None) -> openai.OpenAI:
    """An ``openai`` client whose HTTP calls are answered by the dialect (as the proxy would) from ``chunks``; a
    stream ends with ``fail`` instead of the commit when given."""
    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(DIALECT.to_chat(body).chat)
        if body.get("stream"):
            during, after = streamed(body, chunks)
            if fail is not None:
                translator = DIALECT.stream(body)
                during, after = b"".join(translator.events(c) for c in chunks), translator.error(fail)
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=during + after)
        return httpx.Response(200, json=DIALECT.response(recorded(chunks).response or {}, body))
    return openai.OpenAI(api_key="dummy", base_url="http://proxy.test/v1", max_retries=0,
                         http_client=httpx.Client(transport=httpx.MockTransport(answer)))


def test_the_sdk_stream_helper_assembles_the_streamed_response() -> None:
    seen: list[dict[str, Any]] = []
    client = sdk_client(chat_chunks(["I will ", "list."], [("shell", ['{"command":', '["ls"]}'])], "tool_calls"), seen)
    with client.responses.stream(model="tiny", instructions="Be brief.", input="list files",
                                 tools=[SHELL]) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == "I will list."
    call = final.output[1]
    assert call.type == "function_call" and (call.name, call.arguments) == ("shell", '{"command":["ls"]}')
    assert seen[0]["messages"] == [{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": "list files"}]


def test_the_sdk_reads_a_non_streamed_response_and_sends_back_the_tool_output() -> None:
    seen: list[dict[str, Any]] = []
    client = sdk_client(chat_chunks([], [("shell", ['{"command":["ls"]}'])], "tool_calls"), seen)
    first = client.responses.create(model="tiny", input="list files", tools=[SHELL])
    call = first.output[0]
    assert call.type == "function_call"
    history = [{"role": "user", "content": "list files"}, call.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": call.call_id, "output": "a.py"}]
    client.responses.create(model="tiny", input=history, tools=[SHELL])
    assert seen[1]["messages"][1:] == [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "chatcmpl-tool-0", "type": "function",
             "function": {"name": "shell", "arguments": '{"command":["ls"]}'}}]},
        {"role": "tool", "tool_call_id": "chatcmpl-tool-0", "content": "a.py"}]


def test_the_sdk_stream_helper_sees_a_mid_stream_error_and_no_final_response() -> None:
    client = sdk_client(chat_chunks(["par", "tial"])[:3], [], fail=upstream_error(502, "upstream stream failed"))
    with client.responses.stream(model="tiny", input="hi") as stream:
        events = list(stream)
        with pytest.raises(RuntimeError, match=r"response\.completed"):
            stream.get_final_response()
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2].message == "upstream stream failed" and events[-1].response.error.message == events[-2].message
