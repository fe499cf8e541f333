"""Shared fixtures: a fake vLLM-dialect upstream, the real proxy, a tiny checkpoint and the real CPU server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from repro.net import free_port
from repro.serving.commands import start_cpu_server_process, stop_process
from repro.serving.cpu_server_args import CpuServerArgs
from repro.testing import FakeVllmUpstream, ServerThread
from repro.tinymodel.model import TinyModelConfig, build_tiny_model
from tests.support import RunningProxy, start_proxy


@pytest.fixture(scope="module")
def fake_upstream() -> Iterator[tuple[FakeVllmUpstream, str]]:
    app = FakeVllmUpstream(completion_tokens=16)
    with ServerThread(app, free_port()) as server:
        yield app, server.url


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
    proc = start_cpu_server_process(CpuServerArgs(tiny_model_dir, port=port, max_batch_size=8), log_path=log_path)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)
