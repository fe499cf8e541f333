"""Proxy configuration (one dataclass; Hydra group ``proxy/`` mirrors it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ProxyConfig:
    """Where the proxy listens, where it forwards, and what it records.

    ``sampling_overrides`` maps a rollout mode (``train``/``eval``) to request fields that replace the
    harness's own (e.g. ``{"train": {"temperature": 1.0}}``); what was applied is stored with each call.
    ``upstream_model``, when set, replaces the ``model`` field the harness sends.
    """

    upstream_url: str = "http://127.0.0.1:8000"
    host: str = "127.0.0.1"
    port: int = 8100
    store_path: str = "traces.sqlite"
    synchronous: str = "NORMAL"
    upstream_model: str | None = None
    sampling_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    max_body_bytes: int = 32 * 1024 * 1024
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 600.0
    max_upstream_connections: int = 1024
