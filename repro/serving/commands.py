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
from typing import Any

from repro.common.net import free_port, wait_for_http
from repro.serving.cpu_server_args import CpuServerArgs

CPU_SERVER_MODULE = "repro.serving.cpu_server"
__all__ = [
    "CPU_SERVER_MODULE",
    "add_build_model_parser",
    "add_serve_parser",
    "build_model_command",
    "free_port",
    "serve_command",
    "start_cpu_server_process",
    "stop_process",
]


def add_build_model_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``build-model`` on an argparse subparsers object."""
    p = subparsers.add_parser("build-model", help="build the tiny offline model (tokenizer + random Qwen3)")
    p.add_argument("--out", type=Path, default=None,
                   help="checkpoint directory to write (required with --tokenizer bpe; with --tokenizer qwen3 and no "
                        "--out, only the tokenizer is built into the cache and its folder printed)")
    p.add_argument("--tokenizer", choices=["bpe", "qwen3"], default="bpe",
                   help="bpe: a byte-level BPE trained on --corpus (--vocab-size); qwen3: Qwen3's exact tokenizer and "
                        "chat template, built offline from the quicktok-v1 package (extra qwen3-tokenizer)")
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
    """Run ``build-model``: write the checkpoint and print its manifest path (or, for ``--tokenizer qwen3`` without
    ``--out``, build the cached tokenizer and print its folder)."""
    from repro.tinymodel.qwen3_tokenizer import MissingExtraError

    try:
        return _build_model(args)
    except MissingExtraError as exc:  # one line naming the extra
        raise SystemExit(f"repro build-model: {exc}") from None


def _build_model(args: argparse.Namespace) -> int:
    if args.out is None:
        if args.tokenizer != "qwen3":
            raise SystemExit("repro build-model: --out is required (except with --tokenizer qwen3)")
        from repro.tinymodel.qwen3_tokenizer import qwen3_tokenizer_dir

        print(qwen3_tokenizer_dir())
        return 0
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
        tokenizer=args.tokenizer,
    )
    corpus = [path.read_text(encoding="utf-8") for path in args.corpus]
    out = build_tiny_model(args.out, config, corpus)
    print(out / MANIFEST_NAME)
    return 0


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``serve`` (the CPU server) on an argparse subparsers object."""
    p = subparsers.add_parser("serve", help="serve a checkpoint on CPU with vLLM's OpenAI dialect")
    CpuServerArgs.add_arguments(p)
    p.set_defaults(func=serve_command)
    return p


def serve_command(args: argparse.Namespace) -> int:
    """Run ``serve`` in the foreground until interrupted."""
    from repro.serving.cpu_server import run_server

    run_server(CpuServerArgs.from_args(args).server_config())
    return 0


def start_cpu_server_process(args: CpuServerArgs, *, log_path: Path | None = None,
                             timeout_s: float = 120.0) -> subprocess.Popen:
    """Launch ``python -m repro.serving.cpu_server`` with ``args`` and wait for ``/health``; stop it with
    :func:`stop_process`. Output goes to ``log_path`` (appended) when given, else to this process's stdout/stderr."""
    cmd = [sys.executable, "-m", CPU_SERVER_MODULE, *args.to_argv()]
    proc = _popen(cmd, log_path, {**os.environ, **args.env()})
    try:
        wait_for_http(f"http://{args.host}:{args.port}/health", timeout_s, proc)
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


def _popen(cmd: list[str], log_path: Path | None, env: dict[str, str]) -> subprocess.Popen:
    """Start ``cmd`` in ``env`` with its output appended to ``log_path`` (or inherited)."""
    if log_path is None:
        return subprocess.Popen(cmd, env=env)
    with open(log_path, "ab") as log_file:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env)
