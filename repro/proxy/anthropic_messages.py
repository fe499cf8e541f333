"""Anthropic Messages <-> chat completions, for the proxy's ``/v1/messages`` route (streaming:
:mod:`repro.proxy.anthropic_stream`).

The model servers return the sampled token ids and logprobs on chat completions only (vLLM 0.32's own
``/v1/messages`` has no ``return_token_ids``), so a Messages request is translated to a chat request for the
upstream and the chat answer back to a Message. Rules, for what a local model cannot honour:

- ``system`` (a string or text blocks) becomes the first system message, its blocks joined with a blank line;
  a ``role: "system"`` message inside ``messages`` (Claude Code sends one) stays a system message where it is.
- ``tool_use`` blocks become the assistant's ``tool_calls`` (``input`` as JSON ``arguments``); ``tool_result``
  blocks become ``role: "tool"`` messages, in order, before the user's other content.
- Dropped, and named in the result's ``ignored``: ``thinking`` / ``redacted_thinking`` blocks, image and
  document blocks (replaced by ``[image omitted]`` / ``[document omitted]`` so the turn keeps its place),
  ``cache_control``, and the request fields ``thinking``, ``context_management``, ``metadata``, ``service_tier``,
  ``top_k``, ``container``, ``mcp_servers``.
- A tool without ``input_schema`` (a hosted tool: ``web_search``...) is dropped and named in ``ignored``.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from repro.proxy.dialects import Translated, text_or_blocks
from repro.proxy.errors import bad_request

DROPPED_FIELDS = ("thinking", "context_management", "metadata", "service_tier", "top_k", "container", "mcp_servers")
_PLACEHOLDERS = {"image": "[image omitted]", "document": "[document omitted]"}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal"}


def messages_to_chat(req: dict[str, Any]) -> Translated:
    """The chat completions request for the Messages request ``req`` (a 400 for a malformed one)."""
    if not isinstance(req.get("messages"), list) or not req["messages"]:
        raise bad_request("'messages' must be a non-empty list")
    if not isinstance(req.get("max_tokens"), int) or isinstance(req.get("max_tokens"), bool):
        raise bad_request("'max_tokens' must be an integer")
    ignored = [name for name in DROPPED_FIELDS if name in req]
    messages = _system(req.get("system"), ignored)
    for i, message in enumerate(req["messages"]):
        messages += _message(message, i, ignored)
    chat: dict[str, Any] = {"model": req.get("model", ""), "messages": messages, "max_tokens": req["max_tokens"]}
    for name in ("temperature", "top_p", "stream"):
        if name in req:
            chat[name] = req[name]
    if req.get("stream") is True:  # message_delta reports the usage at the end of the stream
        chat["stream_options"] = {"include_usage": True}
    if req.get("stop_sequences"):
        chat["stop"] = list(req["stop_sequences"])
    tools = [_tool(tool, ignored) for tool in req.get("tools") or []]
    if any(tools):
        chat["tools"] = [t for t in tools if t]
        if "tool_choice" in req:
            chat["tool_choice"] = _tool_choice(req["tool_choice"])
    return Translated(chat, ignored)


def _text_of(content: Any, ignored: list[str], where: str) -> str:
    """A string, or text blocks joined (other blocks named in ``ignored``)."""
    content = text_or_blocks(content, where, "content blocks")
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append(str(block.get("text", "")))
        elif kind in _PLACEHOLDERS:
            parts.append(_PLACEHOLDERS[kind])
            ignored.append(f"{kind} block")
        else:
            ignored.append(f"{kind} block in {where}")
        if isinstance(block, dict) and "cache_control" in block:
            ignored.append("cache_control")
    return "\n\n".join(parts) if where == "system" else "".join(parts)


def _system(system: Any, ignored: list[str]) -> list[dict[str, Any]]:
    if system is None or system == "" or system == []:
        return []
    return [{"role": "system", "content": _text_of(system, ignored, "system")}]


def _message(message: Any, i: int, ignored: list[str]) -> list[dict[str, Any]]:
    """One Messages message as chat messages (a user turn with tool results becomes several)."""
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant", "system"):
        raise bad_request(f"messages[{i}] must be an object with role user, assistant or system")
    role, content = message["role"], message.get("content", "")
    if isinstance(content, str) or role == "system":
        return [{"role": role, "content": _text_of(content, ignored, f"messages[{i}]")}]
    if not isinstance(content, list):
        raise bad_request(f"messages[{i}].content must be a string or a list of content blocks")
    if role == "assistant":
        return [_assistant(content, i, ignored)]
    tool_results = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
    rest = [b for b in content if not (isinstance(b, dict) and b.get("type") == "tool_result")]
    out = [{"role": "tool", "tool_call_id": str(b.get("tool_use_id", "")),
            "content": _text_of(b.get("content", ""), ignored, f"messages[{i}] tool_result")} for b in tool_results]
    if rest or not tool_results:
        out.append({"role": "user", "content": _text_of(rest, ignored, f"messages[{i}]")})
    return out


def _assistant(content: list[Any], i: int, ignored: list[str]) -> dict[str, Any]:
    calls = [{"id": str(b.get("id", "")), "type": "function",
              "function": {"name": str(b.get("name", "")), "arguments": json.dumps(b.get("input", {}))}}
             for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]
    text = _text_of([b for b in content if not (isinstance(b, dict) and b.get("type") == "tool_use")], ignored,
                    f"messages[{i}]")
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _tool(tool: Any, ignored: list[str]) -> dict[str, Any] | None:
    if not isinstance(tool, dict) or "input_schema" not in tool:
        ignored.append(f"tool {tool.get('name', '?') if isinstance(tool, dict) else '?'} (no input_schema)")
        return None
    function = {"name": tool.get("name", ""), "parameters": tool["input_schema"]}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name", "")}}
    return {"auto": "auto", "any": "required", "none": "none"}.get(kind or "", "auto")


def chat_to_message(body: dict[str, Any], model: str) -> dict[str, Any]:
    """The Message for a (non-streamed) chat completion ``body``: text and ``tool_use`` blocks, the stop reason,
    the usage."""
    choice = (body.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except json.JSONDecodeError:
            arguments = {"_unparsed_arguments": function.get("arguments")}
        content.append({"type": "tool_use", "id": call.get("id", ""), "name": function.get("name", ""),
                        "input": arguments})
    usage = body.get("usage") or {}
    tokens = {"input_tokens": usage.get("prompt_tokens", 0), "output_tokens": usage.get("completion_tokens", 0)}
    return {"id": message_id(body.get("id")), "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": STOP_REASONS.get(choice.get("finish_reason") or "stop", "end_turn"),
            "stop_sequence": None, "usage": tokens}


def message_id(chat_id: Any) -> str:
    """A Message id for the upstream's chat completion id (a random one when it has none)."""
    return f"msg_{chat_id}" if chat_id else f"msg_{uuid.uuid4().hex[:24]}"
