"""Shared fixtures: a fake vLLM-dialect upstream, the real proxy, a tiny checkpoint and the real CPU server."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from repro.net import free_port
from repro.proxy import ProxyApp, ProxyConfig
from repro.serving.commands import start_cpu_server_process, stop_process
from repro.store import SqliteTraceStore, open_store
from repro.testing import FakeVllmUpstream, ServerThread
from repro.tinymodel.model import TinyModelConfig, build_tiny_model


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


TINY_VOCAB = 512


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen3 checkpoint (small vocabulary, so it builds in well under a second)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-qwen", TinyModelConfig(vocab_size=TINY_VOCAB), [])


@pytest.fixture(scope="session")
def cpu_server_url(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL (``http://127.0.0.1:PORT``) of a real ``python -m repro.serving.cpu_server`` process."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("server") / "cpu_server.log"
    proc = start_cpu_server_process(tiny_model_dir, port, max_batch_size=8, log_path=log_path, timeout_s=120)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)
