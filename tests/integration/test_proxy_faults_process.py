"""The real proxy process (``python -m repro.proxy``) against a misbehaving upstream: every fault is survived,
and SIGTERM ends the process within seconds even with calls stuck upstream, keeping what it acknowledged."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from repro.common.net import free_port
from repro.proxy import ProxyConfig
from repro.proxy.auth import new_control_token
from repro.proxy.client import ProxyClient
from repro.proxy.server import start_proxy_process
from repro.store import open_store
from repro.testing import UPSTREAM_FAULTS

pytestmark = pytest.mark.timeout(180)
_STREAM_ONLY = {"sse-array", "sse-truncated", "sse-truncated-end", "error-event"}


def _succeeds(url: str, model: str, content: str, stream: bool, timeout: float = 10.0) -> bool:
    """True when the call got a whole answer (unary: 200; stream: ends with [DONE], no error event)."""
    body = {"model": model, "messages": [{"role": "user", "content": content}], "stream": stream}
    with httpx.stream("POST", f"{url}/chat/completions", json=body, timeout=timeout) as resp:
        text = resp.read().decode()
    if not stream:
        return resp.status_code == 200
    return resp.status_code == 200 and text.rstrip().endswith("data: [DONE]") and '"error"' not in text


def test_proxy_process_survives_every_fault_and_stops_on_sigterm(tmp_path: Path, fake_upstream) -> None:
    config = ProxyConfig(upstream_url=fake_upstream[1], port=free_port(), store_path=str(tmp_path / "t.sqlite"),
                         read_timeout_s=300.0, shutdown_timeout_s=2.0, control_token=new_control_token())
    proc = start_proxy_process(config, log_path=tmp_path / "proxy.log")
    base = f"http://127.0.0.1:{config.port}"
    client = ProxyClient(base, config.control_token)
    acknowledged: list[str] = []
    try:
        for fault in UPSTREAM_FAULTS:
            rollout = fault.replace("-", "_")
            url = client.register(rollout_id=rollout)
            for stream in ([True] if fault in _STREAM_ONLY else [False, True]):
                assert not _succeeds(url, fault, f"{rollout}:bad", stream), fault
            for i in range(10):
                marker = f"{rollout}:{i}"
                assert _succeeds(url, "m", marker, stream=i % 2 == 1), (fault, i)
                acknowledged.append(marker)
        assert httpx.get(f"{base}/health", timeout=10).json()["status"] == "ok"

        stuck_url = client.register(rollout_id="stuck")
        stuck_results: list[str] = []

        def stuck_call(stream: bool) -> None:
            try:
                _succeeds(stuck_url, "silent", "never answered", stream, timeout=60)
                stuck_results.append("answered")
            except httpx.HTTPError as exc:
                stuck_results.append(type(exc).__name__)

        threads = [threading.Thread(target=stuck_call, args=(s,)) for s in (False, True)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)  # both calls are now waiting on the silent upstream
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
        stopped_after = time.monotonic() - started
        for thread in threads:
            thread.join(timeout=15)
            assert not thread.is_alive()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert stopped_after < 10, f"SIGTERM took {stopped_after:.1f}s"
    assert len(stuck_results) == 2  # the stuck clients were released, not left hanging
    store = open_store(config.store_path)
    assert store.integrity_check() == "ok"
    rollouts = [*(f.replace("-", "_") for f in UPSTREAM_FAULTS), "stuck"]
    stored = {c.request["messages"][0]["content"]: c.status for r in rollouts for c in store.calls(r)}
    assert all(stored.get(m) == "ok" for m in acknowledged), "an acknowledged call is missing"
    bad = [k for k, v in stored.items() if k.endswith(":bad")]
    assert bad and all(stored[k] == "error" for k in bad)
    assert len(acknowledged) == 10 * len(UPSTREAM_FAULTS)
    assert [c.status for c in store.calls("stuck")] == ["aborted", "aborted"]  # recorded, not a sequence gap
