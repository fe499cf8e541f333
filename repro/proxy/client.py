"""The job's side of the proxy's control plane (:mod:`repro.proxy.auth`): register, finish and read rollouts, set
the policy version, each with the control token; a rollout's base URL (what its harness, and so its agent, is
given: the rollout's capability, never the token)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from repro.proxy.auth import capability, control_header
from repro.proxy.routes import rollout_base_path


@dataclass
class ProxyClient:
    """The control plane of the proxy at ``url`` (``http://host:port``)."""

    url: str
    control_token: str = field(repr=False)
    timeout_s: float = 30.0

    @property
    def headers(self) -> dict[str, str]:
        return control_header(self.control_token)

    def base_url(self, rollout_id: str, proxy_url: str = "") -> str:
        """The OpenAI-style base URL of ``rollout_id``'s model routes (``proxy_url``: the proxy as the harness
        reaches it, default :attr:`url`)."""
        root = (proxy_url or self.url).rstrip("/")
        return root + rollout_base_path(rollout_id, capability(self.control_token, rollout_id))

    def register(self, http: httpx.Client | None = None, **fields: Any) -> str:
        """Register a rollout (``fields``: rollout_id, task_id, mode, metadata...); returns its base URL."""
        response = (http or httpx).post(f"{self.url}/rollouts", json=fields, headers=self.headers,
                                        timeout=self.timeout_s)
        response.raise_for_status()
        return self.url.rstrip("/") + response.json()["base_url_path"]

    def finish(self, rollout_id: str, **fields: Any) -> dict[str, Any]:
        """Set a rollout's status / reward / failure_reason; its record."""
        response = httpx.post(f"{self.url}/rollouts/{rollout_id}/finish", json=fields, headers=self.headers,
                              timeout=self.timeout_s)
        response.raise_for_status()
        return response.json()

    def info(self, rollout_id: str) -> dict[str, Any]:
        response = httpx.get(f"{self.url}/rollouts/{rollout_id}", headers=self.headers, timeout=self.timeout_s)
        response.raise_for_status()
        return response.json()

    def set_policy_version(self, version: int) -> None:
        httpx.post(f"{self.url}/policy_version", json={"version": version}, headers=self.headers,
                   timeout=self.timeout_s).raise_for_status()
