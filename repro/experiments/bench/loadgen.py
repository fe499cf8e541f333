"""Load generator for the proxy benchmark: concurrent agent-like rollouts over one pooled aiohttp client."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp
import orjson


@dataclass
class PhaseResult:
    """What one phase (one target, one concurrency, one streaming mode) measured."""

    calls: int
    errors: int
    wall_s: float
    latencies_s: list[float]

    @property
    def throughput(self) -> float:
        return self.calls / self.wall_s if self.wall_s else 0.0


API_PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}


def request_body(system_chars: int, turn: int, stream: bool, api: str = "chat") -> bytes:
    """A request shaped like an agent's (a long system prompt and a growing history) in ``api``'s format: chat
    completions, Anthropic Messages or OpenAI Responses (the same conversation in each)."""
    system = "s" * system_chars
    turns = [{"role": "user", "content": "Fix the bug."}]
    for i in range(turn):
        turns.append({"role": "assistant", "content": f"step {i}: ls -la && cat file.py"})
        turns.append({"role": "user", "content": f"<output>{'o' * 200}</output>"})
    body: dict = {"model": "fake", "temperature": 1.0, "stream": stream}
    if api == "messages":
        body.update(system=system, messages=turns, max_tokens=1024)
    elif api == "responses":
        body.update(instructions=system, input=turns, max_output_tokens=1024)
    else:
        body.update(messages=[{"role": "system", "content": system}, *turns], max_tokens=1024)
        if stream:
            body["stream_options"] = {"include_usage": True}
    return orjson.dumps(body)


async def _one_call(session: aiohttp.ClientSession, url: str, body: bytes, stream: bool) -> bool:
    async with session.post(url, data=body, headers={"content-type": "application/json"}) as resp:
        if stream:
            async for _ in resp.content.iter_any():
                pass
        else:
            await resp.read()
        return resp.status == 200


async def _worker(session: aiohttp.ClientSession, url: str, calls: int, stream: bool, system_chars: int,
                  latencies: list[float], api: str) -> int:
    errors = 0
    for turn in range(calls):
        body = request_body(system_chars, turn % 8, stream, api)
        t0 = time.perf_counter()
        ok = await _one_call(session, url, body, stream)
        latencies.append(time.perf_counter() - t0)
        errors += not ok
    return errors


async def run_phase(session: aiohttp.ClientSession, urls: list[str], calls_per_worker: int, stream: bool,
                    system_chars: int, api: str = "chat") -> PhaseResult:
    """``len(urls)`` concurrent workers (one rollout each), each making ``calls_per_worker`` sequential calls in
    ``api``'s format."""
    latencies: list[float] = []
    t0 = time.perf_counter()
    errors = await asyncio.gather(*(_worker(session, url, calls_per_worker, stream, system_chars, latencies, api)
                                    for url in urls))
    wall = time.perf_counter() - t0
    return PhaseResult(calls=len(latencies), errors=sum(errors), wall_s=wall, latencies_s=latencies)


def new_session(limit: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit, keepalive_timeout=60),
                                 timeout=aiohttp.ClientTimeout(total=120))
