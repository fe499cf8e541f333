"""Checks a request body before anything is forwarded or written; raises a 400 ProxyError."""

from __future__ import annotations

import re
from typing import Any

import orjson

from repro.common.secrets import without_secrets
from repro.proxy.errors import bad_request

ROLLOUT_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
_NUMBER_FIELDS = ("temperature", "top_p", "frequency_penalty", "presence_penalty")
_INT_FIELDS = ("max_tokens", "max_completion_tokens", "n", "seed", "top_logprobs")


def check_rollout_id(rollout_id: str) -> None:
    if not ROLLOUT_ID.fullmatch(rollout_id):
        raise bad_request("rollout id must match [A-Za-z0-9_-]{1,128}")


def parse_json_object(body: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise bad_request("request body must be a JSON object")
    return value


def _check_common(req: dict[str, Any]) -> None:
    if not isinstance(req.get("model", ""), str):
        raise bad_request("'model' must be a string")
    for name in _NUMBER_FIELDS:
        value = req.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise bad_request(f"'{name}' must be a number")
    for name in _INT_FIELDS:
        value = req.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise bad_request(f"'{name}' must be an integer")
    stream = req.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean")
    stop = req.get("stop")
    if stop is not None and not isinstance(stop, str) and not (
        isinstance(stop, list) and all(isinstance(s, str) for s in stop)
    ):
        raise bad_request("'stop' must be a string or a list of strings")


def check_chat(req: dict[str, Any]) -> None:
    """A chat completion request: ``messages`` is a non-empty list of objects with a string role."""
    messages = req.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad_request(f"messages[{i}] must be an object with a string 'role'")
    tools = req.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise bad_request("'tools' must be a list")
    _check_common(req)


def check_completion(req: dict[str, Any]) -> None:
    """A text completion request: ``prompt`` is a string or a list of token ids."""
    prompt = req.get("prompt")
    is_ids = isinstance(prompt, list) and bool(prompt) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt
    )
    if not isinstance(prompt, str) and not is_ids:
        raise bad_request("'prompt' must be a string or a non-empty list of token ids")
    _check_common(req)


def storable_request(req: dict[str, Any]) -> dict[str, Any]:
    """The request as it may be stored: credential-keyed entries and header maps removed at any depth."""
    return without_secrets(req)
