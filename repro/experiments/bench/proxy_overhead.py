"""Benchmark: the proxy's added latency, throughput and CPU per call against going direct to the upstream.

Three processes: a fast fake upstream in the vLLM dialect (so the proxy's own cost is not hidden behind
a model), the real proxy (recording durably to SQLite), and this process generating load. Direct and
proxied phases are interleaved, for each API, concurrency and streaming mode, ``repeats`` times; the proxy's CPU
is read from /proc for its process (user + system seconds) around each proxied phase. For the translated APIs
(Anthropic Messages, OpenAI Responses) the direct phase sends the same conversation as chat completions, what the
upstream gets either way: their added cost includes the translation.
"""

from __future__ import annotations

import asyncio
import importlib.util
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import psutil

from repro.common.net import free_port, wait_for_http
from repro.proxy import ProxyConfig
from repro.proxy.auth import new_control_token
from repro.proxy.client import ProxyClient
from repro.proxy.server import start_proxy_process

if TYPE_CHECKING:
    from repro.experiments.bench.loadgen import PhaseResult


@dataclass
class ProxyBenchConfig:
    """Knobs of the proxy benchmark (Hydra: ``experiment=bench_proxy``)."""

    concurrencies: list[int] = field(default_factory=lambda: [1, 16, 64])
    streaming: list[bool] = field(default_factory=lambda: [False, True])
    calls_per_phase: int = 1024
    repeats: int = 3
    completion_tokens: int = 32
    system_chars: int = 4000
    synchronous: str = "NORMAL"
    apis: list[str] = field(default_factory=lambda: ["chat"])  # chat, messages, responses: the route proxied to


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def _register_rollouts(proxy: ProxyClient, count: int, prefix: str) -> list[str]:
    """``count`` rollouts registered; their base URLs without the trailing ``/v1``."""
    with httpx.Client() as http:
        return [proxy.register(http, rollout_id=f"{prefix}-{i}", task_id="bench").removesuffix("/v1")
                for i in range(count)]


async def _measure(cfg: ProxyBenchConfig, upstream: str, proxy: ProxyClient, proxy_proc: psutil.Process
                   ) -> list[dict]:
    from repro.experiments.bench.loadgen import new_session  # aiohttp: the `bench` extra

    rows: list[dict[str, Any]] = []
    session = new_session(limit=max(cfg.concurrencies) * 2)
    try:
        for api in cfg.apis:
            for stream in cfg.streaming:
                for conc in cfg.concurrencies:
                    rows += await _measure_cell(cfg, session, upstream, proxy, proxy_proc, api, stream, conc)
    finally:
        await session.close()
    return rows


async def _measure_cell(cfg: ProxyBenchConfig, session: Any, upstream: str, proxy: ProxyClient,
                        proxy_proc: psutil.Process,
                        api: str, stream: bool, conc: int) -> list[dict]:
    """Direct and proxied phases of one (API, streaming, concurrency) cell, interleaved, ``repeats`` times."""
    from repro.experiments.bench.loadgen import API_PATHS, run_phase

    rows = []
    per_worker = max(1, cfg.calls_per_phase // conc)
    direct_urls = [f"{upstream}/v1/chat/completions"] * conc
    await run_phase(session, direct_urls[:1], 8, stream, cfg.system_chars)  # warm connections
    for rep in range(cfg.repeats):
        roots = _register_rollouts(proxy, conc, f"{api}s{int(stream)}c{conc}r{rep}")
        proxy_urls = [f"{root}{API_PATHS[api]}" for root in roots]
        order = ("direct", "proxy") if rep % 2 == 0 else ("proxy", "direct")
        for target in order:
            cpu0 = _cpu_seconds(proxy_proc)
            urls, sent = (direct_urls, "chat") if target == "direct" else (proxy_urls, api)
            result = await run_phase(session, urls, per_worker, stream, cfg.system_chars, sent)
            cpu = _cpu_seconds(proxy_proc) - cpu0
            rows.append(_row(target, api, stream, conc, rep, result, cpu))
    return rows


def _row(target: str, api: str, stream: bool, conc: int, rep: int, result: PhaseResult, proxy_cpu_s: float) -> dict:
    return {
        "target": target, "api": api, "stream": stream, "concurrency": conc, "repeat": rep, "calls": result.calls,
        "errors": result.errors, "wall_s": result.wall_s, "throughput": result.throughput,
        "p50_ms": 1000 * statistics.median(result.latencies_s),
        "p99_ms": 1000 * _percentile(result.latencies_s, 0.99),
        "proxy_cpu_ms_per_call": 1000 * proxy_cpu_s / result.calls if target == "proxy" else None,
    }


def summarise(rows: list[dict]) -> list[dict]:
    """One line per (API, stream, concurrency): medians over repeats, proxy vs direct."""
    out = []
    order = {"chat": 0, "messages": 1, "responses": 2}
    keys = sorted({(r.get("api", "chat"), r["stream"], r["concurrency"]) for r in rows},
                  key=lambda k: (order.get(k[0], 9), k[0], k[1], k[2]))
    for api, stream, conc in keys:
        cell = [r for r in rows if r.get("api", "chat") == api and r["stream"] == stream and r["concurrency"] == conc]

        def med(target: str, metric: str, cell: list[dict] = cell) -> float:
            return statistics.median(r[metric] for r in cell if r["target"] == target)
        out.append({
            "api": api, "stream": stream, "concurrency": conc,
            "direct_p50_ms": med("direct", "p50_ms"), "proxy_p50_ms": med("proxy", "p50_ms"),
            "added_p50_ms": med("proxy", "p50_ms") - med("direct", "p50_ms"),
            "direct_p99_ms": med("direct", "p99_ms"), "proxy_p99_ms": med("proxy", "p99_ms"),
            "added_p99_ms": med("proxy", "p99_ms") - med("direct", "p99_ms"),
            "direct_rps": med("direct", "throughput"), "proxy_rps": med("proxy", "throughput"),
            "throughput_ratio": med("proxy", "throughput") / med("direct", "throughput"),
            "proxy_cpu_ms_per_call": med("proxy", "proxy_cpu_ms_per_call"),
            "errors": sum(r["errors"] for r in cell),
        })
    return out


def run_proxy_benchmark(cfg: ProxyBenchConfig, run_dir: Path) -> dict[str, Any]:
    """Start fake upstream + proxy, measure, and return the metrics (also the rows, for the table)."""
    if importlib.util.find_spec("aiohttp") is None:
        raise SystemExit("the proxy benchmark's load generator needs aiohttp: pip install 'repro[bench]'")
    up_port, proxy_port = free_port(), free_port()
    upstream_cmd = [sys.executable, "-m", "repro.testing", "--port", str(up_port),
                    "--completion-tokens", str(cfg.completion_tokens)]
    upstream = subprocess.Popen(upstream_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    proxy = None
    try:
        wait_for_http(f"http://127.0.0.1:{up_port}/health", 30, upstream)
        pcfg = ProxyConfig(upstream_url=f"http://127.0.0.1:{up_port}", port=proxy_port,
                           store_path=str(run_dir / "traces.sqlite"), synchronous=cfg.synchronous,
                           control_token=new_control_token())
        proxy = start_proxy_process(pcfg, log_path=run_dir / "proxy.log")
        started = time.time()
        client = ProxyClient(f"http://127.0.0.1:{proxy_port}", pcfg.control_token or "")
        rows = asyncio.run(_measure(cfg, f"http://127.0.0.1:{up_port}", client, psutil.Process(proxy.pid)))
    finally:
        for proc in (proxy, upstream):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=30)
    return {"kind": "proxy_overhead", "config": asdict(cfg), "started_at": started,
            "duration_s": time.time() - started, "rows": rows, "summary": summarise(rows)}
