"""Anthropic Messages -> chat completions and back (the proxy's future /v1/messages route): the shapes Claude Code
sends (system blocks, a system message inside messages, tool_use / tool_result turns, thinking, hosted tools)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from repro.proxy.anthropic_messages import chat_to_message, messages_to_chat
from repro.proxy.errors import ProxyError

BASH = {"name": "Bash", "description": "Run a command", "input_schema": {"type": "object", "properties": {
    "command": {"type": "string"}}, "required": ["command"]}}


def test_a_claude_code_turn_with_a_tool_round_trip() -> None:
    req = {"model": "tiny", "max_tokens": 32000, "stream": True, "thinking": {"type": "adaptive"},
           "metadata": {"user_id": "u"}, "context_management": {},
           "system": [{"type": "text", "text": "You are Claude Code."},
                      {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
           "tools": [BASH, {"type": "web_search_20250305", "name": "web_search"}],
           "tool_choice": {"type": "auto"},
           "messages": [
               {"role": "system", "content": "Environment: linux"},
               {"role": "user", "content": [{"type": "text", "text": "Fix the bug."}]},
               {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                                 {"type": "text", "text": "Looking."},
                                                 {"type": "tool_use", "id": "t1", "name": "Bash",
                                                  "input": {"command": "ls"}}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                             "content": [{"type": "text", "text": "a.py"}]},
                                            {"type": "text", "text": "Go on."}]}]}
    out = messages_to_chat(req)
    assert out.chat["messages"] == [
        {"role": "system", "content": "You are Claude Code.\n\nBe brief."},
        {"role": "system", "content": "Environment: linux"},
        {"role": "user", "content": "Fix the bug."},
        {"role": "assistant", "content": "Looking.", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "a.py"},
        {"role": "user", "content": "Go on."}]
    assert out.chat["tools"] == [{"type": "function", "function": {
        "name": "Bash", "parameters": BASH["input_schema"], "description": "Run a command"}}]
    assert (out.chat["max_tokens"], out.chat["stream"], out.chat["tool_choice"]) == (32000, True, "auto")
    assert out.chat["stream_options"] == {"include_usage": True}  # message_delta's usage
    assert {"thinking", "metadata", "context_management", "cache_control", "thinking block in messages[2]",
            "tool web_search (no input_schema)"} <= set(out.ignored)


@pytest.mark.parametrize("bad", [{"messages": [], "max_tokens": 5}, {"messages": [{"role": "user"}]},
                                 {"messages": [{"role": "robot", "content": "x"}], "max_tokens": 5},
                                 {"messages": [{"role": "user", "content": 3}], "max_tokens": 5}])
def test_a_malformed_request_is_a_400(bad: dict) -> None:
    with pytest.raises(ProxyError) as refused:
        messages_to_chat(bad)
    assert refused.value.status == 400


def test_a_chat_answer_becomes_a_message_with_its_tool_use() -> None:
    body = {"id": "c1", "choices": [{"finish_reason": "tool_calls", "message": {"content": "Running.", "tool_calls": [
        {"id": "t2", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "pytest"}'}}]}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 5}}
    message = chat_to_message(body, "tiny")
    assert message["content"] == [{"type": "text", "text": "Running."},
                                  {"type": "tool_use", "id": "t2", "name": "Bash", "input": {"command": "pytest"}}]
    assert (message["stop_reason"], message["usage"]) == ("tool_use", {"input_tokens": 12, "output_tokens": 5})
    cut = chat_to_message({"choices": [{"finish_reason": "length", "message": {"content": "x"}}]}, "tiny")
    assert cut["stop_reason"] == "max_tokens"


@given(st.lists(st.text(max_size=20), min_size=1, max_size=6))
def test_text_turns_keep_their_order_and_text(texts: list[str]) -> None:
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(texts)]
    chat = messages_to_chat({"messages": turns, "max_tokens": 8}).chat
    assert [(m["role"], m["content"]) for m in chat["messages"]] == [(t["role"], t["content"]) for t in turns]
    json.dumps(chat)  # what goes upstream is JSON
