"""OpenAI Responses -> chat completions, for the proxy's ``/v1/responses`` route (issue 35: the only wire API Codex
CLI 0.169 speaks); the answer side is :mod:`repro.proxy.openai_responses_stream`.

The model servers return the sampled token ids and logprobs on chat completions only, so a Responses request is
translated to a chat request for the upstream, and the chat answer back to a ``response`` object or its SSE events.
Rules, for what a local model cannot honour:

- ``instructions`` becomes the first system message; ``input`` as a string is one user message.
- ``input`` items: a ``message`` (``type`` may be left out when there is a ``role``) keeps its role, except
  ``developer``, which becomes ``system`` where it stands; its content is a string or parts whose texts
  (``input_text`` / ``output_text`` / ``refusal``) are joined with a newline. ``function_call`` items become the
  assistant's ``tool_calls`` (``call_id`` as the call's id, ``arguments`` unchanged): consecutive calls share one
  assistant message, which is the directly preceding assistant message when there is one. ``function_call_output``
  items become ``role: "tool"`` messages (an ``output`` of parts is joined like a message's content).
- Dropped, and named in the result's ``ignored``: ``reasoning`` items and any other item type (hosted tool calls,
  ``custom_tool_call``...), image / file / audio parts (replaced by ``[image omitted]`` / ``[file omitted]`` /
  ``[audio omitted]`` so the turn keeps its place), tools other than ``function`` (``web_search``, ``namespace``,
  ``custom``, ``local_shell``, ``file_search``...), a ``tool_choice`` naming no function (``auto`` is sent), and
  every request field not carried: ``reasoning``, ``store``, ``include``, ``parallel_tool_calls``,
  ``prompt_cache_key``, ``service_tier``, ``metadata``, ``text``, ``truncation``, ``user``, ``background``...
- Carried: ``model``, ``temperature``, ``top_p``, ``stream`` (a streamed request also asks the upstream for
  ``stream_options.include_usage``: a Responses answer always reports usage), ``max_output_tokens`` as
  ``max_tokens``, ``tool_choice`` (``auto`` / ``required`` / ``none`` / a named function).
- A 400: ``previous_response_id``, ``conversation``, ``prompt`` and ``item_reference`` items, which point at state
  kept by a server (the proxy keeps none: the client must send the whole conversation, as Codex does with
  ``store: false``), and malformed input, naming the field.
"""

from __future__ import annotations

from typing import Any

from repro.proxy.dialects import Translated, text_or_blocks
from repro.proxy.errors import ProxyError, bad_request
from repro.proxy.openai_responses_stream import ResponsesStream, chat_to_response
from repro.proxy.overflow import ContextExceeded

CARRIED_FIELDS = ("model", "temperature", "top_p", "stream")
READ_FIELDS = ("input", "instructions", "tools", "tool_choice", "max_output_tokens")
STATEFUL_FIELDS = ("previous_response_id", "conversation", "prompt")
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}  # part type: its key
_PLACEHOLDERS = {"input_image": "[image omitted]", "input_file": "[file omitted]", "input_audio": "[audio omitted]"}
_TOOL_CHOICES = ("auto", "required", "none")


def stateless(what: str) -> ProxyError:
    """The 400 for a reference to server-side state."""
    return bad_request(f"{what} is not supported: the proxy keeps no server-side state (responses are not stored); "
                       "send the whole conversation in 'input'")


def responses_to_chat(req: dict[str, Any]) -> Translated:
    """The chat completions request for the Responses request ``req`` (a 400 for a malformed one)."""
    for name in STATEFUL_FIELDS:
        if req.get(name) is not None:
            raise stateless(f"'{name}'")
    ignored = [name for name, value in req.items()
               if name not in (*CARRIED_FIELDS, *READ_FIELDS) and value is not None]
    messages = _instructions(req.get("instructions")) + _input(req.get("input"), ignored)
    if not messages:
        raise bad_request("'input' has no message to send")
    chat: dict[str, Any] = {"model": req.get("model", ""), "messages": messages}
    for name in CARRIED_FIELDS[1:]:
        if req.get(name) is not None:
            chat[name] = req[name]
    if req.get("stream") is True:
        chat["stream_options"] = {"include_usage": True}
    if req.get("max_output_tokens") is not None:
        chat["max_tokens"] = _max_tokens(req["max_output_tokens"])
    tools = _tools(req.get("tools"), ignored)
    if tools:
        chat["tools"] = tools
        if req.get("tool_choice") is not None:
            chat["tool_choice"] = _tool_choice(req["tool_choice"], ignored)
    elif req.get("tool_choice") is not None:
        ignored.append("tool_choice (no function tools)")
    return Translated(chat, list(dict.fromkeys(ignored)))


def _max_tokens(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request("'max_output_tokens' must be an integer")
    return value


def _instructions(instructions: Any) -> list[dict[str, Any]]:
    if instructions is None or instructions == "":
        return []
    if not isinstance(instructions, str):
        raise bad_request("'instructions' must be a string")
    return [{"role": "system", "content": instructions}]


def _input(items: Any, ignored: list[str]) -> list[dict[str, Any]]:
    """The chat messages for ``input``: a string, or a list of items."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise bad_request("'input' must be a string or a list of items")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        kind = _item_type(item, i)
        if kind == "message":
            messages.append(_message(item, i, ignored))
        elif kind == "function_call":
            _add_call(messages, _function_call(item, i))
        elif kind == "function_call_output":
            messages.append(_tool_output(item, i, ignored))
        elif kind == "item_reference":
            raise stateless(f"input[{i}] (an item_reference)")
        else:
            ignored.append(f"{kind} item")
    return messages


def _item_type(item: Any, i: int) -> str:
    kind = item.get("type", "message" if "role" in item else None) if isinstance(item, dict) else None
    if not isinstance(kind, str):
        raise bad_request(f"input[{i}] must be an object with a type or role")
    return kind


def _message(item: dict[str, Any], i: int, ignored: list[str]) -> dict[str, Any]:
    role = item.get("role")
    role = _ROLES.get(role) if isinstance(role, str) else None
    if role is None:
        raise bad_request(f"input[{i}].role must be one of user, assistant, system, developer")
    return {"role": role, "content": _text_of(item.get("content"), ignored, f"input[{i}].content")}


def _text_of(content: Any, ignored: list[str], where: str) -> str:
    """A string, or content parts' texts joined with a newline (placeholders for images, files and audio)."""
    content = text_or_blocks(content, where, "content parts")
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str):
            raise bad_request(f"{where}[{j}] must be an object with a type")
        if kind in _TEXT_PARTS:
            key = _TEXT_PARTS[kind]
            if not isinstance(part.get(key), str):
                raise bad_request(f"{where}[{j}].{key} must be a string")
            texts.append(part[key])
        elif kind in _PLACEHOLDERS:
            texts.append(_PLACEHOLDERS[kind])
            ignored.append(f"{kind} part")
        else:
            ignored.append(f"{kind} part")
    return "\n".join(texts)


def _function_call(item: dict[str, Any], i: int) -> dict[str, Any]:
    for name in ("call_id", "name", "arguments"):
        if not isinstance(item.get(name), str):
            raise bad_request(f"input[{i}].{name} must be a string")
    return {"id": item["call_id"], "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]}}


def _add_call(messages: list[dict[str, Any]], call: dict[str, Any]) -> None:
    """Append ``call`` to the directly preceding assistant message, or to a new one."""
    if messages and messages[-1]["role"] == "assistant":
        messages[-1].setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _tool_output(item: dict[str, Any], i: int, ignored: list[str]) -> dict[str, Any]:
    if not isinstance(item.get("call_id"), str):
        raise bad_request(f"input[{i}].call_id must be a string")
    return {"role": "tool", "tool_call_id": item["call_id"],
            "content": _text_of(item.get("output"), ignored, f"input[{i}].output")}


def _tools(tools: Any, ignored: list[str]) -> list[dict[str, Any]]:
    """The chat function tools for ``tools`` (other tool types named in ``ignored``)."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise bad_request("'tools' must be a list")
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if not isinstance(kind, str):
            raise bad_request(f"tools[{i}] must be an object with a type")
        if kind != "function":
            name = tool.get("name")
            ignored.append(f"{kind} tool {name}" if isinstance(name, str) and name else f"{kind} tool")
            continue
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise bad_request(f"tools[{i}].name must be a non-empty string")
        function = {"name": tool["name"]}
        for key in ("description", "parameters", "strict"):
            if tool.get(key) is not None:
                function[key] = tool[key]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any, ignored: list[str]) -> Any:
    if choice in _TOOL_CHOICES:
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    ignored.append("tool_choice")
    return "auto"


class ResponsesDialect:
    """``/v1/responses``: OpenAI Responses served by the upstream's chat completions (``request`` in the answer
    directions is the harness's Responses request, echoed where the ``response`` object repeats it)."""

    api = "responses"
    overflow_in_stream = True  # `response.failed` with code context_length_exceeded (repro.proxy.overflow)

    def to_chat(self, request: dict[str, Any]) -> Translated:
        return responses_to_chat(request)

    def response(self, body: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
        return chat_to_response(body, request)

    def stream(self, request: dict[str, Any]) -> ResponsesStream:
        return ResponsesStream(request)

    def error_body(self, error: ProxyError) -> bytes:
        return error.responses_body() if isinstance(error, ContextExceeded) else error.body()
