"""Request parsing and response building for vLLM's OpenAI dialect (no I/O here).

Parsing turns a JSON body into typed requests and raises :class:`BadRequestError` (HTTP 400) on
malformed input; building turns generated tokens into ``chat.completion`` / ``text_completion``
objects. Sampling defaults follow vLLM: temperature and top_p from the model's generation config,
``max_tokens`` unset (engine default) for chat and 16 for completions, n = 1.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from repro.serving.engine import SamplingParams
from repro.serving.tool_parser import parse_tool_calls

MAX_N = 64
LEGACY_COMPLETIONS_MAX_TOKENS = 16
NO_LOGPROB = -9999.0  # vLLM's stand-in for -inf


class BadRequestError(ValueError):
    """The request is malformed (HTTP 400, ``invalid_request_error``)."""


class ModelNotFoundError(LookupError):
    """The request names a model this server does not serve (HTTP 404)."""


@dataclass
class CommonParams:
    """Fields shared by chat and legacy completions."""

    model: str | None
    sampling: SamplingParams
    n: int
    stream: bool
    include_usage: bool
    return_token_ids: bool
    logprobs: bool
    top_logprobs: int

    def row_params(self, index: int) -> SamplingParams:
        """Sampling parameters of the ``index``-th row (a seed is offset by the row index)."""
        seed = None if self.sampling.seed is None else self.sampling.seed + index
        p = self.sampling
        return SamplingParams(
            p.temperature,
            p.top_p,
            p.max_tokens,
            seed,
            list(p.stop),
            list(p.stop_token_ids),
            self.top_logprobs if self.logprobs else 0,
        )


@dataclass
class ChatRequest:
    """A parsed ``/v1/chat/completions`` body."""

    common: CommonParams
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    parse_tools: bool
    add_generation_prompt: bool
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class CompletionRequest:
    """A parsed ``/v1/completions`` body: one or more prompts (text or token ids)."""

    common: CommonParams
    prompts: list[str | list[int]]


def _field(body: dict[str, Any], key: str, kinds: tuple[type, ...], what: str) -> Any:
    """``body[key]`` if present and not null, checked against ``kinds`` (bool is never an int here)."""
    value = body.get(key)
    if value is None:
        return None
    is_bool = isinstance(value, bool)
    if not isinstance(value, kinds) or (is_bool and bool not in kinds):
        raise BadRequestError(f"'{key}' must be {what}")
    return value


def _number(body: dict[str, Any], key: str, low: float, high: float) -> float | None:
    value = _field(body, key, (int, float), "a number")
    if value is not None and not (low <= value <= high and math.isfinite(value)):
        raise BadRequestError(f"'{key}' must be between {low} and {high}")
    return None if value is None else float(value)


def _integer(body: dict[str, Any], key: str, low: int, high: int | None = None) -> int | None:
    value = _field(body, key, (int,), "an integer")
    if value is not None and (value < low or (high is not None and value > high)):
        raise BadRequestError(f"'{key}' must be between {low} and {high}" if high else f"'{key}' must be >= {low}")
    return value


def _stop(body: dict[str, Any]) -> list[str]:
    value = _field(body, "stop", (str, list), "a string or a list of strings")
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not all(isinstance(s, str) for s in stops):
        raise BadRequestError("'stop' must be a string or a list of strings")
    return [s for s in stops if s]


def _int_list(value: Any, key: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise BadRequestError(f"'{key}' must be a list of integers")
    return value


def parse_common(body: dict[str, Any], defaults: SamplingParams, max_logprobs: int, chat: bool) -> CommonParams:
    """Parse the sampling and output options shared by both endpoints."""
    max_tokens = _integer(body, "max_completion_tokens", 1) if chat else None
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", 1)
    if max_tokens is None and not chat:
        max_tokens = LEGACY_COMPLETIONS_MAX_TOKENS
    temperature = _number(body, "temperature", 0.0, 100.0)
    top_p = _number(body, "top_p", 1e-9, 1.0)
    sampling = SamplingParams(
        temperature=defaults.temperature if temperature is None else temperature,
        top_p=defaults.top_p if top_p is None else top_p,
        max_tokens=max_tokens,
        seed=_integer(body, "seed", -(2**63)),
        stop=_stop(body),
        stop_token_ids=_int_list(body.get("stop_token_ids") or [], "stop_token_ids"),
    )
    options = _field(body, "stream_options", (dict,), "an object") or {}
    include_usage = _field(options, "include_usage", (bool,), "a boolean") or False
    if chat:
        logprobs = _field(body, "logprobs", (bool,), "a boolean") or False
        top = _integer(body, "top_logprobs", 0, max_logprobs)
        if top and not logprobs:
            raise BadRequestError("when using 'top_logprobs', 'logprobs' must be set to true")
    else:
        top = _integer(body, "logprobs", 0, max_logprobs)
        logprobs = top is not None
    return CommonParams(
        model=_field(body, "model", (str,), "a string"),
        sampling=sampling,
        n=_integer(body, "n", 1, MAX_N) or 1,
        stream=_field(body, "stream", (bool,), "a boolean") or False,
        include_usage=include_usage,
        return_token_ids=_field(body, "return_token_ids", (bool,), "a boolean") or False,
        logprobs=logprobs,
        top_logprobs=top or 0,
    )


def parse_chat_request(body: Any, defaults: SamplingParams, max_logprobs: int) -> ChatRequest:
    """Parse a chat completions body."""
    if not isinstance(body, dict):
        raise BadRequestError("the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequestError("'messages' must be a non-empty list")
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequestError("each message must be an object with a string 'role'")
    tools = _field(body, "tools", (list,), "a list")
    if tools is not None and not all(isinstance(t, dict) for t in tools):
        raise BadRequestError("'tools' must be a list of objects")
    tool_choice = _field(body, "tool_choice", (str, dict), "a string or an object")
    return ChatRequest(
        common=parse_common(body, defaults, max_logprobs, chat=True),
        messages=messages,
        tools=tools or None,
        parse_tools=bool(tools) and tool_choice != "none",
        add_generation_prompt=body.get("add_generation_prompt", True) is not False,
        chat_template_kwargs=_field(body, "chat_template_kwargs", (dict,), "an object") or {},
    )


def parse_completion_request(body: Any, defaults: SamplingParams, max_logprobs: int) -> CompletionRequest:
    """Parse a legacy completions body (``prompt``: string, token ids, or a list of either)."""
    if not isinstance(body, dict):
        raise BadRequestError("the request body must be a JSON object")
    if body.get("echo"):
        raise BadRequestError("'echo' is not supported by this server")
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        prompts: list[str | list[int]] = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
        prompts = [_int_list(prompt, "prompt")]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        prompts = [p if isinstance(p, str) else _int_list(p, "prompt") for p in prompt]
    else:
        raise BadRequestError("'prompt' must be a string, a list of token ids, or a non-empty list of those")
    return CompletionRequest(common=parse_common(body, defaults, max_logprobs, chat=False), prompts=prompts)


def check_model(requested: str | None, served: str) -> None:
    """Raise :class:`ModelNotFoundError` when the request names another model (vLLM answers 404)."""
    if requested is not None and requested != served:
        raise ModelNotFoundError(f"The model `{requested}` does not exist.")


def error_body(message: str, kind: str, code: int) -> dict[str, Any]:
    """An OpenAI-style error object."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def new_id(prefix: str) -> str:
    """A response id such as ``chatcmpl-<hex>``."""
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    """Unix time in seconds (the ``created`` field)."""
    return int(time.time())


@dataclass
class ChoiceOutput:
    """Everything generated for one choice."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    stop_reason: str | int | None = None


TokenText = Callable[[int], str]


def chat_logprob_entries(
    token_ids: list[int], logprobs: list[float], tops: list[list[tuple[int, float]]], token_text: TokenText
) -> list[dict[str, Any]]:
    """``logprobs.content`` entries of a chat choice (one per token id, the eos token included)."""
    entries = []
    for i, (token_id, logprob) in enumerate(zip(token_ids, logprobs, strict=True)):
        text = token_text(token_id)
        top = [
            {"token": token_text(t), "logprob": max(lp, NO_LOGPROB), "bytes": list(token_text(t).encode())}
            for t, lp in (tops[i] if i < len(tops) else [])
        ]
        entries.append(
            {"token": text, "logprob": max(logprob, NO_LOGPROB), "bytes": list(text.encode()), "top_logprobs": top}
        )
    return entries


def build_chat_choice(
    index: int,
    out: ChoiceOutput,
    *,
    parse_tools: bool,
    logprobs: bool,
    return_token_ids: bool,
    token_text: TokenText,
) -> dict[str, Any]:
    """One non-streaming chat choice; tool calls are parsed from ``out.text`` when ``parse_tools``."""
    message: dict[str, Any] = {"role": "assistant", "content": out.text}
    finish_reason = out.finish_reason
    if parse_tools:
        content, tool_calls = parse_tool_calls(out.text)
        message["content"] = content
        if tool_calls:
            message["tool_calls"] = tool_calls
            finish_reason = "tool_calls"
    choice: dict[str, Any] = {
        "index": index,
        "message": message,
        "logprobs": {"content": chat_logprob_entries(out.token_ids, out.logprobs, out.top_logprobs, token_text)}
        if logprobs
        else None,
        "finish_reason": finish_reason,
        "stop_reason": out.stop_reason,
    }
    if return_token_ids:
        choice["token_ids"] = out.token_ids
    return choice


def completion_logprobs(
    token_ids: list[int],
    logprobs: list[float],
    tops: list[list[tuple[int, float]]],
    token_text: TokenText,
    offset: int = 0,
) -> dict[str, Any]:
    """Legacy ``logprobs`` object (tokens, token_logprobs, top_logprobs, text_offset)."""
    tokens = [token_text(t) for t in token_ids]
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    top = []
    for i, (token, logprob) in enumerate(zip(tokens, logprobs, strict=True)):
        entry = {token_text(t): max(lp, NO_LOGPROB) for t, lp in (tops[i] if i < len(tops) else [])}
        entry[token] = max(logprob, NO_LOGPROB)  # the chosen token is always listed, as OpenAI does
        top.append(entry)
    return {
        "tokens": tokens,
        "token_logprobs": [max(lp, NO_LOGPROB) for lp in logprobs],
        "top_logprobs": top,
        "text_offset": offsets,
    }


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """The ``usage`` object."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
