"""Shared fixtures: a fake vLLM-dialect upstream and the real proxy, both real HTTP servers on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from repro.net import free_port
from repro.proxy import ProxyApp, ProxyConfig
from repro.store import SqliteTraceStore, open_store
from repro.testing import FakeVllmUpstream, ServerThread


@dataclass
class RunningProxy:
    url: str
    config: ProxyConfig

    def store(self) -> SqliteTraceStore:
        return open_store(self.config.store_path)

    def new_rollout(self, rollout_id: str, **fields: str) -> str:
        resp = httpx.post(f"{self.url}/rollouts", json={"rollout_id": rollout_id, **fields})
        assert resp.status_code == 201, resp.text
        return f"{self.url}/rollouts/{rollout_id}/v1"


@pytest.fixture(scope="module")
def fake_upstream() -> Iterator[tuple[FakeVllmUpstream, str]]:
    app = FakeVllmUpstream(completion_tokens=16)
    with ServerThread(app, free_port()) as server:
        yield app, server.url


def start_proxy(tmp_path: Path, upstream_url: str, **overrides) -> ServerThread:
    config = ProxyConfig(upstream_url=upstream_url, port=free_port(), store_path=str(tmp_path / "traces.sqlite"),
                         **overrides)
    return ServerThread(ProxyApp(config), config.port), config


@pytest.fixture
def proxy(tmp_path: Path, fake_upstream) -> Iterator[RunningProxy]:
    server, config = start_proxy(tmp_path, fake_upstream[1], read_timeout_s=2.0)
    with server:
        yield RunningProxy(server.url, config)
