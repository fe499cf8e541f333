"""Run the proxy: in this process (uvicorn, uvloop + httptools when present) or as a child process."""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import orjson

from repro.common.net import wait_for_http
from repro.proxy.auth import CONTROL_TOKEN_ENV
from repro.proxy.config import UPSTREAM_API_KEY_ENV, ProxyConfig


def serve(config: ProxyConfig) -> None:
    """Serve until interrupted (blocking). SIGTERM/SIGINT: calls in flight get ``shutdown_timeout_s`` to finish,
    then are cancelled; the writer flushes what it holds (bounded) and the process exits."""
    import uvicorn

    from repro.proxy.app import ProxyApp

    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    uvicorn.run(
        ProxyApp(config), host=config.host, port=config.port, loop=loop, http=http, lifespan="on",
        log_level="warning", access_log=False, proxy_headers=False, timeout_keep_alive=75, backlog=4096,
        timeout_graceful_shutdown=config.shutdown_timeout_s,
    )


def start_proxy_process(config: ProxyConfig, log_path: Path | None = None, timeout_s: float = 30.0
                        ) -> subprocess.Popen:
    """Start ``python -m repro.proxy`` with ``config`` and wait until /health answers (the upstream key travels
    in the child's environment, never on its command line)."""
    cmd = [sys.executable, "-m", "repro.proxy", "--config-json", orjson.dumps(config.public_dict()).decode()]
    env = os.environ.copy()
    key = config.resolved_upstream_api_key()
    if key:
        env[UPSTREAM_API_KEY_ENV] = key
    token = config.resolved_control_token()
    if token:
        env[CONTROL_TOKEN_ENV] = token
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_for_http(f"http://{config.host}:{config.port}/health", timeout_s, proc)
    except Exception:
        proc.kill()
        raise
    return proc


def parse_args(argv: list[str] | None = None) -> ProxyConfig:
    parser = argparse.ArgumentParser(prog="repro proxy", description="Run the recording proxy.")
    add_proxy_arguments(parser)
    return config_from_args(parser.parse_args(argv))


def add_proxy_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = ProxyConfig()
    parser.add_argument("--config-json", help="a whole ProxyConfig as JSON (overrides the flags)")
    parser.add_argument("--upstream-url", default=defaults.upstream_url)
    parser.add_argument("--upstream-replica", dest="upstream_replicas", action="append", default=[],
                        help="another URL serving the same model (repeatable); each rollout stays on one replica")
    parser.add_argument("--host", default=defaults.host, help="bind address (default loopback only)")
    parser.add_argument("--port", type=int, default=defaults.port)
    parser.add_argument("--store", dest="store_path", default=defaults.store_path)
    parser.add_argument("--upstream-model", default=None)
    parser.add_argument("--read-timeout-s", type=float, default=defaults.read_timeout_s)
    parser.add_argument("--vocab-size", type=int, default=None,
                        help="refuse token ids outside [0, N) from the upstream (default: the int32 range)")
    parser.add_argument("--upstream-api-key", default=None,
                        help=f"bearer token for the upstream (prefer the {UPSTREAM_API_KEY_ENV} environment variable: "
                             "a flag is visible to other users in the process list)")


def config_from_args(args: argparse.Namespace) -> ProxyConfig:
    if args.config_json:
        config = ProxyConfig(**orjson.loads(args.config_json))
    else:
        config = ProxyConfig(upstream_url=args.upstream_url, host=args.host, port=args.port,
                             store_path=args.store_path, upstream_model=args.upstream_model,
                             read_timeout_s=args.read_timeout_s, vocab_size=args.vocab_size,
                             upstream_api_key=args.upstream_api_key, upstream_replicas=list(args.upstream_replicas))
    if config.resolved_control_token() is None:
        raise SystemExit(f"error: set {CONTROL_TOKEN_ENV} to a secret of your own before starting the proxy (e.g. "
                         f"export {CONTROL_TOKEN_ENV}=$(python -c 'import secrets; print(secrets.token_urlsafe(32))'));"
                         " registering, finishing and versioning rollouts need it, and an agent must never see it")
    return config
