"""Shared fixtures: a fake vLLM-dialect upstream, the real proxy, a tiny checkpoint and the real CPU server; and how
the suite is split over pytest-xdist workers (``-n 2 --dist loadgroup``, pyproject.toml's addopts)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from repro.common.net import free_port
from repro.serving.commands import start_cpu_server_process, stop_process
from repro.serving.cpu_server_args import CpuServerArgs
from repro.testing import FakeVllmUpstream, ServerThread
from repro.tinymodel.model import TinyModelConfig, build_tiny_model
from tests.support import RunningProxy, start_proxy

# -- xdist: what runs where ---------------------------------------------------------------------------------------
# A work unit is one test file (its module fixtures set up once, its tests in file order on one worker), except that
# all of tests/docker is one unit: those tests share one Docker engine and the base image's lock, so they run one
# after another on one worker. The units are scheduled here, from the node ids, not from xdist_group marks: with
# pytest >= 9.2, xdist 3.8's loadgroup no longer sees the marks (it appends "@group" to a node id attribute pytest
# stopped reading: pytest-dev/pytest-xdist#1386) and would silently spread a group over both workers. A node id that
# does carry "@group" (an xdist_group mark, once xdist is fixed) keeps that group. Session fixtures below are per
# worker: each worker has its own tmp_path_factory base (popen-gwN), so they share no path.
DOCKER_UNIT = "tests/docker"
VLLM_UNIT = "tests/vllm_engine"  # the real vLLM's tests: one unit too, so that one server runs at a time
VERL_UNIT = "tests/verl_engine"  # verl's actor on CPU: after the unit tests, while .ci/verl-env has had its minute


def work_unit(nodeid: str) -> str:
    """The unit of a test: its xdist_group where the node id names one, ``tests/docker``, ``tests/vllm_engine``,
    ``tests/verl_engine``, or its file."""
    if nodeid.rfind("@") > nodeid.rfind("]"):
        return nodeid.rsplit("@", 1)[1]
    path = _file(nodeid)
    for unit in (DOCKER_UNIT, VLLM_UNIT, VERL_UNIT):
        if path.startswith(unit + "/"):
            return unit
    return path


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup``: units as :func:`work_unit` draws them, handed out in collection order (which
    :func:`pytest_collection_modifyitems` arranges), not largest-first."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False
    return WorkUnitScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker (each sorts alike, so their collections agree): the unit tests, then the docker and vLLM
    units, then the integration files with an e2e test (the long ones), then the other integration files, each group
    in testpaths' order. The docker and vLLM units go to a worker each (or one after the other) while the e2e files
    wait (not last, where one worker would run them alone); the base image and the harness and vLLM envs .ci/run
    builds meanwhile are ready by then; short files end the run, so neither worker idles long while the other
    finishes. A serial run (``-n 0``) keeps testpaths' order."""
    if not hasattr(config, "workerinput"):
        return
    e2e_files = {_file(item.nodeid) for item in items if item.get_closest_marker("e2e") is not None}

    def stage(item: pytest.Item) -> int:
        path = _file(item.nodeid)
        if path.startswith("tests/unit/"):
            return 0
        if work_unit(item.nodeid) in (DOCKER_UNIT, VLLM_UNIT, VERL_UNIT):
            return 1
        return 2 if path in e2e_files else 3

    items.sort(key=stage)


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


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
