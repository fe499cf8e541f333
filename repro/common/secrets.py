"""What counts as a credential in a JSON-like value, and removing it at any depth.

Used by the proxy (request bodies are stored without credentials) and by the runner (a run directory's
``config.yaml`` never holds a key read from the environment).
"""

from __future__ import annotations

from typing import Any

_CREDENTIAL_NAMES = frozenset({
    "api_key", "apikey", "x_api_key", "authorization", "proxy_authorization", "access_token", "refresh_token",
    "id_token", "auth_token", "session_token", "bearer_token", "token", "secret", "client_secret", "secret_key",
    "password", "passwd", "cookie", "set_cookie", "credential", "credentials", "private_key",
})
_CREDENTIAL_SUFFIXES = ("_api_key", "_apikey", "_secret", "_password", "_access_token", "_auth_token")
_HEADER_MAP_NAMES = frozenset({"headers", "extra_headers", "default_headers", "http_headers"})
_SCHEMA_NAME_MAPS = frozenset({"properties", "patternProperties"})  # JSON-schema maps keyed by parameter names
# keys of a chat request that are never credentials: looked up first, so a request is walked cheaply
_PLAIN_NAMES = frozenset({"role", "content", "name", "type", "text", "messages", "model", "tools", "function",
                          "tool_calls", "tool_call_id", "arguments", "parameters", "description", "properties",
                          "required", "stream", "temperature", "top_p", "max_tokens", "id", "index"})
_CONTAINERS = frozenset({dict, list})  # JSON from a parser: exact types, so a type() lookup suffices
REDACTED = "<redacted>"
_DROP = object()


def _normal(name: str) -> str:
    return name.lower().replace("-", "_")


def is_secret_key(name: str) -> bool:
    """True for a key whose value is a credential or a map of HTTP headers (any case, ``-`` or ``_``)."""
    key = _normal(name)
    return key in _CREDENTIAL_NAMES or key in _HEADER_MAP_NAMES or key.endswith(_CREDENTIAL_SUFFIXES)


def without_secrets(value: Any, replacement: Any = _DROP) -> Any:
    """``value`` with every secret-keyed entry, at any depth, dropped (or set to ``replacement``).

    Keys of a JSON-schema ``properties`` map (in an object with ``"type": "object"``) are parameter names, so a
    tool that takes a ``token`` keeps that parameter's schema (a dict); a string under such a key is still dropped.
    Returns ``value`` itself when nothing had to change.
    """
    return _scrub(value, replacement, names_are_parameters=False)


def _scrub(value: Any, replacement: Any, names_are_parameters: bool) -> Any:
    kind = type(value)
    if kind is list:
        out_list: list | None = None
        for i, item in enumerate(value):
            if type(item) in _CONTAINERS:
                cleaned = _scrub(item, replacement, False)
                if cleaned is not item:
                    out_list = list(value) if out_list is None else out_list
                    out_list[i] = cleaned
        return value if out_list is None else out_list
    if kind is not dict:
        return value
    out: dict[str, Any] | None = None
    for key, item in value.items():
        if key in _PLAIN_NAMES:
            if type(item) not in _CONTAINERS:
                continue
        elif not (names_are_parameters and type(item) is dict) and isinstance(key, str) and is_secret_key(key):
            out = dict(value) if out is None else out
            if replacement is _DROP:
                del out[key]
            else:
                out[key] = replacement if item is not None else None
            continue
        if type(item) in _CONTAINERS:
            schema_names = key in _SCHEMA_NAME_MAPS and value.get("type") == "object"
            cleaned = _scrub(item, replacement, schema_names)
            if cleaned is not item:
                out = dict(value) if out is None else out
                out[key] = cleaned
    return value if out is None else out
