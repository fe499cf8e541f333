"""Proxy configuration (one dataclass; Hydra group ``proxy/`` mirrors it)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any

UPSTREAM_API_KEY_ENV = "REPRO_UPSTREAM_API_KEY"


@dataclass
class ProxyConfig:
    """Where the proxy listens, where it forwards, and what it records.

    ``sampling_overrides`` maps a rollout mode (``train``/``eval``) to request fields that replace the
    harness's own (e.g. ``{"train": {"temperature": 1.0}}``); what was applied is stored with each call.
    ``upstream_model``, when set, replaces the ``model`` field the harness sends.
    ``upstream_api_key`` (else the ``REPRO_UPSTREAM_API_KEY`` environment variable) is sent upstream as a bearer
    token; it is never stored, logged, shown in ``repr`` or passed on a command line.
    ``upstream_replicas``: further URLs serving the same weights (verl's vLLM replicas, one a GPU or TP group): a
    rollout's calls all go to one of ``[upstream_url, *upstream_replicas]``, the one :func:`replica_index` picks from
    its id, so its growing prompt meets its own prefix cache.
    ``control_token`` (else ``REPRO_PROXY_CONTROL_TOKEN``; else one made when the app starts) opens the control
    routes and derives each rollout's capability (:mod:`repro.proxy.auth`); like the upstream key it is never
    stored, logged, shown in ``repr`` or passed on a command line.
    ``vocab_size``, when set, bounds the token ids the upstream may return (else the int32 range).
    ``write_timeout_s`` bounds the wait for the trace writer; ``shutdown_timeout_s`` how long a stopping proxy
    lets calls in flight finish before it cancels them.
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
    upstream_api_key: str | None = field(default=None, repr=False)
    vocab_size: int | None = None
    write_timeout_s: float = 30.0
    shutdown_timeout_s: float = 3.0
    upstream_replicas: list[str] = field(default_factory=list)
    control_token: str | None = field(default=None, repr=False)

    @property
    def upstream_urls(self) -> list[str]:
        """Every upstream the proxy forwards to (index 0: ``upstream_url``)."""
        return [self.upstream_url, *self.upstream_replicas]

    def resolved_upstream_api_key(self) -> str | None:
        """The key sent upstream: the config's, else the environment's (None: send no Authorization header)."""
        return self.upstream_api_key or os.environ.get(UPSTREAM_API_KEY_ENV) or None

    def resolved_control_token(self) -> str | None:
        """The control token: the config's, else the environment's (None: the app makes one)."""
        from repro.proxy.auth import CONTROL_TOKEN_ENV

        return self.control_token or os.environ.get(CONTROL_TOKEN_ENV) or None

    def public_dict(self) -> dict[str, Any]:
        """The config without its secrets (what may be written to a command line or a file)."""
        return {**self.__dict__, "upstream_api_key": None, "control_token": None}


def replica_index(rollout_id: str, n_replicas: int) -> int:
    """The replica a rollout's calls go to: sha256 of its id modulo ``n_replicas`` (stable across processes and
    restarts, unlike ``hash``; spread evenly over rollouts)."""
    if n_replicas <= 1:
        return 0
    return int.from_bytes(hashlib.sha256(rollout_id.encode()).digest()[:8], "big") % n_replicas
