"""The proxy under load: attribution with many concurrent rollouts, and durability across a SIGKILL."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
import orjson

from repro.common.net import free_port
from repro.proxy import ProxyConfig
from repro.proxy.auth import new_control_token
from repro.proxy.client import ProxyClient
from repro.proxy.server import start_proxy_process
from repro.store import open_store
from repro.testing import fake_completion_text
from tests.support import RunningProxy

ROLLOUTS, CALLS = 32, 10


async def _call(client: httpx.AsyncClient, url: str, marker: str, stream: bool) -> str:
    body = {"model": "m", "messages": [{"role": "user", "content": marker}], "stream": stream}
    if not stream:
        resp = await client.post(url, json=body)
        resp.raise_for_status()
        return resp.json()["choices"][0]["message"]["content"]
    text = []
    async with client.stream("POST", url, json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in orjson.loads(line[6:])["choices"]:
                    text.append(choice["delta"].get("content") or "")
            elif line == "data: [DONE]":
                return "".join(text)
    raise AssertionError("stream ended without [DONE]")


async def _rollout(client: httpx.AsyncClient, base_url: str, rollout_id: str, stream: bool) -> list[str]:
    url = f"{base_url}/chat/completions"
    return [await _call(client, url, f"{rollout_id}:{i}", stream) for i in range(CALLS)]


def test_concurrent_rollouts_are_attributed_exactly(proxy: RunningProxy) -> None:
    ids = [f"c{i}" for i in range(ROLLOUTS)]
    bases = [proxy.new_rollout(rollout_id) for rollout_id in ids]

    async def main() -> list[list[str]]:
        limits = httpx.Limits(max_connections=ROLLOUTS * 2)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            return await asyncio.gather(*(_rollout(client, bases[i], r, i % 2 == 0) for i, r in enumerate(ids)))

    answers = asyncio.run(main())
    store = proxy.store()
    assert store.count_calls() == ROLLOUTS * CALLS
    for i, rollout_id in enumerate(ids):
        calls = store.calls(rollout_id)
        assert [c.seq for c in calls] == list(range(CALLS))  # none missing, none duplicated
        for seq, call in enumerate(calls):
            marker = f"{rollout_id}:{seq}"
            assert call.request["messages"][0]["content"] == marker  # 0 misattributed
            assert call.streamed == (i % 2 == 0) and call.status == "ok"
            expected = fake_completion_text(call.request, 16)
            assert bytes(call.completion_ids).decode() == expected == answers[i][seq]


async def _hammer(bases: list[str], completed: list[str], stop_at: float) -> None:
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(timeout=10, limits=limits) as client:
        async def worker(w: int) -> None:
            i = 0
            while time.monotonic() < stop_at:
                marker = f"w{w}-{i}"
                try:
                    await _call(client, f"{bases[w]}/chat/completions", marker, stream=w % 2 == 1)
                except (httpx.HTTPError, AssertionError):
                    return  # the proxy died under us
                completed.append(marker)
                i += 1
        await asyncio.gather(*(worker(w) for w in range(32)))


def test_sigkill_under_load_loses_no_acknowledged_call(tmp_path: Path, fake_upstream) -> None:
    config = ProxyConfig(upstream_url=fake_upstream[1], port=free_port(), store_path=str(tmp_path / "t.sqlite"),
                         control_token=new_control_token())
    proc = start_proxy_process(config, log_path=tmp_path / "proxy.log")
    client = ProxyClient(f"http://127.0.0.1:{config.port}", config.control_token)
    bases = [client.register(rollout_id=f"k{w}") for w in range(32)]
    completed: list[str] = []

    async def main() -> None:
        load = asyncio.ensure_future(_hammer(bases, completed, time.monotonic() + 30))
        await asyncio.sleep(2.0)
        os.kill(proc.pid, signal.SIGKILL)
        await load

    asyncio.run(main())
    proc.wait(timeout=10)
    assert len(completed) > 50, "the load never got going"
    store = open_store(config.store_path)
    assert store.integrity_check() == "ok"
    stored = {c.request["messages"][0]["content"] for w in range(32) for c in store.calls(f"k{w}")}
    missing = [m for m in completed if m not in stored]
    assert not missing, f"{len(missing)} acknowledged calls lost, e.g. {missing[:5]}"
