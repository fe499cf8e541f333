"""The official ``anthropic`` and ``openai`` SDKs on the proxy's translated routes (``/v1/messages``,
``/v1/responses``), through the real proxy to the real CPU model server (scripted replies, so tool calls are
certain): stream and not, a tool round trip, errors; each call stored with the token ids the server sampled, in the
chat shape the model saw, and no API key stored."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from transformers import AutoTokenizer

from repro.proxy import ProxyConfig
from repro.serving.stack import CpuServingConfig, Stack, running_stack
from repro.store import open_store
from repro.tinymodel.model import TinyModelConfig, build_tiny_model

SECRET = "sk-ant-SECRET-never-stored-42"
BASH = {"name": "Bash", "description": "Run a shell command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
TOOL_REPLY = '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls -la"}}\n</tool_call>'
SCENARIOS = {"tool": [TOOL_REPLY, "The directory holds calc.py."], "text": ["Hello from the tiny model."]}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("dialects")
    (root / "scenarios.json").write_text(json.dumps(SCENARIOS))
    model_dir = build_tiny_model(root / "model", TinyModelConfig(vocab_size=1024), [])
    with running_stack(model_dir, CpuServingConfig(), ProxyConfig(port=0), root,
                       server_overrides={"scenarios": root / "scenarios.json"}) as running:
        yield running


@pytest.fixture(scope="module")
def tokenizer(stack: Stack):
    return AutoTokenizer.from_pretrained(stack.model_dir)


def _rollout(stack: Stack, rollout_id: str) -> str:
    return stack.client.register(rollout_id=rollout_id, harness="sdk").removesuffix("/v1")


def _claude(stack: Stack, rollout_id: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=_rollout(stack, rollout_id), api_key=SECRET, max_retries=0)


def _template_ids(tokenizer, chat: dict[str, Any]) -> list[int]:
    rendered = tokenizer.apply_chat_template(chat["messages"], tools=chat.get("tools"), add_generation_prompt=True,
                                             tokenize=True, return_dict=False)
    return list(rendered)


def _first_turn(scenario: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"SCENARIO {scenario}. What is in this directory?"}]


def _assert_recorded(stack: Stack, rollout_id: str, tokenizer, api: str, replies: list[str]) -> list:
    calls = open_store(stack.proxy.store_path).calls(rollout_id)
    assert [c.seq for c in calls] == list(range(len(replies)))
    for call, reply in zip(calls, replies, strict=True):
        assert call.endpoint == api and call.status == "ok"
        assert call.request["translated_from"]["api"] == api
        assert call.prompt_ids == _template_ids(tokenizer, call.request)
        assert len(call.completion_ids) == len(call.logprobs) > 0
        assert tokenizer.decode(call.completion_ids, skip_special_tokens=True) == reply
    return calls


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_anthropic_sdk_tool_round_trip_is_recorded(stack: Stack, tokenizer, stream: bool) -> None:
    rollout_id = f"claude-{'s' if stream else 'u'}"
    client = _claude(stack, rollout_id)
    messages = _first_turn("tool")
    kwargs = {"model": "claude-anything", "max_tokens": 64, "system": [{"type": "text", "text": "Be brief."}],
              "tools": [BASH], "thinking": {"type": "adaptive"}, "metadata": {"user_id": "u1"}}

    def ask() -> anthropic.types.Message:
        if not stream:
            return client.messages.create(messages=messages, **kwargs)
        with client.messages.stream(messages=messages, **kwargs) as events:
            return events.get_final_message()

    first = ask()
    assert first.stop_reason == "tool_use" and first.model == "claude-anything"
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "Bash" and use.input == {"command": "ls -la"}
    assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "calc.py"}]}]
    second = ask()
    assert second.stop_reason == "end_turn"
    assert [b.text for b in second.content if b.type == "text"] == ["The directory holds calc.py."]
    calls = _assert_recorded(stack, rollout_id, tokenizer, "messages", [TOOL_REPLY, "The directory holds calc.py."])
    assert calls[0].streamed is stream
    assert set(calls[0].request["translated_from"]["ignored"]) == {"metadata", "thinking"}
    assert calls[1].request["messages"][-1] == {"role": "tool", "tool_call_id": use.id, "content": "calc.py"}
    assert calls[0].prompt_tokens == first.usage.input_tokens
    assert calls[0].client_headers["anthropic-version"]


def test_anthropic_stream_events_in_order(stack: Stack) -> None:
    client = _claude(stack, "claude-events")
    with client.messages.stream(model="m", max_tokens=64, messages=_first_turn("text")) as events:
        kinds = [event.type for event in events]
        final = events.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert kinds.index("content_block_start") < kinds.index("content_block_stop") < kinds.index("message_delta")
    assert final.content[0].text == "Hello from the tiny model."


def test_count_tokens_is_the_recorded_prompt_length(stack: Stack) -> None:
    client = _claude(stack, "claude-count")
    messages = _first_turn("text")
    counted = client.messages.count_tokens(model="m", messages=messages, tools=[BASH], system="Be brief.")
    client.messages.create(model="m", max_tokens=16, messages=messages, tools=[BASH], system="Be brief.")
    (call,) = open_store(stack.proxy.store_path).calls("claude-count")
    assert counted.input_tokens == len(call.prompt_ids) > 0


def test_anthropic_errors_are_typed_and_write_nothing(stack: Stack) -> None:
    client = _claude(stack, "claude-bad")
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model="m", max_tokens=16, messages=[])
    assert bad.value.body["error"]["type"] == "invalid_request_error"
    assert "'messages' must be a non-empty list" in bad.value.body["error"]["message"]
    never_made = stack.client.base_url("never-made").removesuffix("/v1")  # the right capability, nothing registered
    missing = anthropic.Anthropic(base_url=never_made, api_key="k", max_retries=0)
    with pytest.raises(anthropic.NotFoundError):
        missing.messages.create(model="m", max_tokens=16, messages=_first_turn("text"))
    assert open_store(stack.proxy.store_path).calls("claude-bad") == []


def test_api_key_is_never_stored(stack: Stack) -> None:
    client = _claude(stack, "claude-secret")
    client.messages.create(model="m", max_tokens=16, messages=_first_turn("text"))
    for path in Path(stack.proxy.store_path).parent.glob("*.sqlite*"):
        assert SECRET.encode() not in path.read_bytes()


# OpenAI Responses (what Codex CLI speaks) ----------------------------------------------------------------------

RESPONSES_BASH = {"type": "function", "name": "Bash", "description": "Run a shell command",
                  "parameters": BASH["input_schema"]}


def _codex(stack: Stack, rollout_id: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=_rollout(stack, rollout_id) + "/v1", api_key=SECRET, max_retries=0)


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_openai_responses_tool_round_trip_is_recorded(stack: Stack, tokenizer, stream: bool) -> None:
    rollout_id = f"codex-{'s' if stream else 'u'}"
    client = _codex(stack, rollout_id)
    items: list[dict[str, Any]] = [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "SCENARIO tool. List."}]}]
    kwargs = {"model": "codex-anything", "max_output_tokens": 64, "tools": [RESPONSES_BASH, {"type": "web_search"}],
              "reasoning": {"effort": "low"}, "store": False, "include": ["reasoning.encrypted_content"]}

    def ask():
        if not stream:
            return client.responses.create(input=items, **kwargs)
        with client.responses.stream(input=items, **kwargs) as events:
            return events.get_final_response()

    first = ask()
    assert first.status == "completed" and first.model == "codex-anything"
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "Bash" and json.loads(call.arguments) == {"command": "ls -la"}
    items += [call.model_dump(exclude_none=True),
              {"type": "function_call_output", "call_id": call.call_id, "output": "calc.py"}]
    second = ask()
    assert second.output_text == "The directory holds calc.py."
    calls = _assert_recorded(stack, rollout_id, tokenizer, "responses", [TOOL_REPLY, "The directory holds calc.py."])
    assert calls[0].streamed is stream
    assert {"include", "reasoning", "store", "web_search tool"} <= set(calls[0].request["translated_from"]["ignored"])
    assert calls[1].request["messages"][-1] == {"role": "tool", "tool_call_id": call.call_id, "content": "calc.py"}
    assert first.usage.input_tokens == len(calls[0].prompt_ids)


def test_openai_responses_errors_are_typed_and_write_nothing(stack: Stack) -> None:
    client = _codex(stack, "codex-bad")
    with pytest.raises(openai.BadRequestError, match="keeps no server-side state"):
        client.responses.create(model="m", input="x", previous_response_id="resp_1")
    with pytest.raises(openai.BadRequestError, match="input"):
        client.responses.create(model="m", input=[{"type": "message", "role": "user", "content": 3}])
    assert open_store(stack.proxy.store_path).calls("codex-bad") == []
