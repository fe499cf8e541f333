"""CLI commands for serving (``repro build-model``, ``repro serve``) and a server-process helper.

This module stays light: torch / transformers are imported only when a command runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from repro.net import free_port, wait_for_http

if TYPE_CHECKING:
    from repro.serving.cpu_server import ServerConfig

CPU_SERVER_MODULE = "repro.serving.cpu_server"
SERVER_API_KEY_ENV = "REPRO_SERVER_API_KEY"
__all__ = [
    "CPU_SERVER_MODULE",
    "add_build_model_parser",
    "add_serve_args",
    "add_serve_parser",
    "build_model_command",
    "free_port",
    "serve_command",
    "server_config_from_args",
    "start_cpu_server_process",
    "stop_process",
]


def add_build_model_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``build-model`` on an argparse subparsers object."""
    p = subparsers.add_parser("build-model", help="build the tiny offline model (tokenizer + random Qwen3)")
    p.add_argument("--out", type=Path, required=True, help="checkpoint directory to write")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--corpus",
        type=Path,
        nargs="+",
        action="extend",
        default=[],
        help="text files to train the tokenizer on (each file is one text)",
    )
    p.add_argument(
        "--added-tokens", type=Path, default=None, help="JSON file with a list of strings to add as single tokens"
    )
    p.add_argument("--vocab-size", type=int, default=2048)
    p.add_argument("--hidden-size", type=int, default=128)
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--num-kv-heads", type=int, default=2)
    p.add_argument("--intermediate-size", type=int, default=384)
    p.set_defaults(func=build_model_command)
    return p


def build_model_command(args: argparse.Namespace) -> int:
    """Run ``build-model``: write the checkpoint and print its manifest path."""
    from repro.tinymodel.model import MANIFEST_NAME, TinyModelConfig, build_tiny_model

    extra = json.loads(args.added_tokens.read_text()) if args.added_tokens else []
    if not isinstance(extra, list) or not all(isinstance(t, str) for t in extra):
        raise SystemExit(f"{args.added_tokens}: expected a JSON list of strings")
    config = TinyModelConfig(
        seed=args.seed,
        vocab_size=args.vocab_size,
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        num_kv_heads=args.num_kv_heads,
        intermediate_size=args.intermediate_size,
        extra_added_tokens=extra,
    )
    corpus = [path.read_text(encoding="utf-8") for path in args.corpus]
    out = build_tiny_model(args.out, config, corpus)
    print(out / MANIFEST_NAME)
    return 0


def add_serve_args(parser: argparse.ArgumentParser) -> None:
    """The CPU server's flags (shared by ``repro serve`` and ``python -m repro.serving.cpu_server``)."""
    parser.add_argument("--model", type=Path, required=True, help="checkpoint directory")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default=None, help="default: the checkpoint directory's name")
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--batch-window-ms", type=float, default=5.0, help="how long to collect a batch")
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--default-max-tokens", type=int, default=256, help="chat max_tokens when a request sets none")
    parser.add_argument("--max-model-len", type=int, default=None, help="default: max_position_embeddings")
    parser.add_argument("--max-logprobs", type=int, default=20)
    parser.add_argument("--log-level", default="warning")
    parser.add_argument("--expert-tasks", type=Path, default=None,
                        help="tasks JSONL: serve the scripted expert (gold one-line fix as a sed command)")
    parser.add_argument("--expert-slip-rate", type=float, default=0.0,
                        help="share of tasks on which the expert types sed -n for sed -i (a seeded draw per task)")
    parser.add_argument("--expert-slip-seed", type=int, default=0)
    parser.add_argument("--expert-slip-operators", default="",
                        help="comma-separated mutation operators: only their tasks can slip (default: any)")
    parser.add_argument("--scenarios", type=Path, default=None, help=argparse.SUPPRESS)  # tests: ScenarioEngine
    parser.add_argument("--api-key", default=None,
                        help=f"require this bearer token on /v1 routes (default: ${SERVER_API_KEY_ENV}; the variable "
                             "keeps the key out of the process list)")


def server_config_from_args(args: argparse.Namespace) -> ServerConfig:
    """Build the server config from parsed :func:`add_serve_args` flags."""
    from repro.serving.cpu_server import ServerConfig
    from repro.serving.engine import EngineConfig

    engine = EngineConfig(
        model_dir=args.model,
        max_batch_size=args.max_batch_size,
        batch_window_s=args.batch_window_ms / 1000,
        torch_threads=args.torch_threads,
        default_max_tokens=args.default_max_tokens,
        max_model_len=args.max_model_len,
    )
    return ServerConfig(
        engine=engine,
        host=args.host,
        port=args.port,
        served_model_name=args.served_model_name,
        max_logprobs=args.max_logprobs,
        log_level=args.log_level,
        expert_tasks=args.expert_tasks,
        expert_slip_rate=args.expert_slip_rate,
        expert_slip_seed=args.expert_slip_seed,
        expert_slip_operators=tuple(op for op in args.expert_slip_operators.split(",") if op),
        scenarios=args.scenarios,
        api_key=args.api_key or os.environ.get(SERVER_API_KEY_ENV) or None,
    )


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``serve`` (the CPU server) on an argparse subparsers object."""
    p = subparsers.add_parser("serve", help="serve a checkpoint on CPU with vLLM's OpenAI dialect")
    add_serve_args(p)
    p.set_defaults(func=serve_command)
    return p


def serve_command(args: argparse.Namespace) -> int:
    """Run ``serve`` in the foreground until interrupted."""
    from repro.serving.cpu_server import run_server

    run_server(server_config_from_args(args))
    return 0


def start_cpu_server_process(
    model_dir: Path,
    port: int,
    *,
    host: str = "127.0.0.1",
    served_model_name: str | None = None,
    max_batch_size: int = 8,
    torch_threads: int = 1,
    default_max_tokens: int = 256,
    expert_tasks: Path | None = None,
    extra_args: tuple[str, ...] = (),
    log_path: Path | None = None,
    timeout_s: float = 120.0,
) -> subprocess.Popen:
    """Launch ``python -m repro.serving.cpu_server`` and wait for ``/health``; stop it with :func:`stop_process`.

    ``expert_tasks`` (a tasks JSONL) serves the scripted expert instead of the model. Output goes to
    ``log_path`` (appended) when given, else to this process's stdout/stderr.
    """
    cmd = [
        sys.executable,
        "-m",
        CPU_SERVER_MODULE,
        "--model",
        str(model_dir),
        "--host",
        host,
        "--port",
        str(port),
        "--max-batch-size",
        str(max_batch_size),
        "--torch-threads",
        str(torch_threads),
        "--default-max-tokens",
        str(default_max_tokens),
    ]
    if served_model_name:
        cmd += ["--served-model-name", served_model_name]
    if expert_tasks is not None:
        cmd += ["--expert-tasks", str(expert_tasks)]
    cmd += list(extra_args)
    proc = _popen(cmd, log_path)
    try:
        wait_for_http(f"http://{host}:{port}/health", timeout_s, proc)
    except BaseException:
        stop_process(proc)
        raise
    return proc


def stop_process(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """Terminate a server process (SIGTERM, then SIGKILL after ``timeout_s``)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _popen(cmd: list[str], log_path: Path | None) -> subprocess.Popen:
    """Start ``cmd`` with its output appended to ``log_path`` (or inherited)."""
    if log_path is None:
        return subprocess.Popen(cmd)
    with open(log_path, "ab") as log_file:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT)
