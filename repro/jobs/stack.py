"""The live stack a job needs: a model checkpoint, a model server process, and the recording proxy process."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from repro.net import free_port
from repro.proxy import ProxyConfig
from repro.proxy.server import start_proxy_process
from repro.serving.commands import start_cpu_server_process, stop_process


@dataclass
class CpuServingConfig:
    """The CPU model server a job starts (``port: 0`` picks a free port)."""

    port: int = 0
    served_model_name: str = "tiny"
    max_batch_size: int = 8
    torch_threads: int = 1
    default_max_tokens: int = 128
    max_model_len: int | None = None  # context limit (None: the model's max_position_embeddings), as vLLM's flag
    expert_tasks: Path | None = None  # a tasks JSONL: serve the scripted expert (gold fixes) instead of the model


@dataclass
class EndpointServingConfig:
    """A model server that already runs (a vLLM server, any OpenAI-compatible endpoint): the job starts only the
    proxy in front of it. Token ids and logprobs are recorded when the endpoint returns them (vLLM:
    ``return_token_ids``)."""

    url: str = "???"  # e.g. http://127.0.0.1:8000 (no /v1)
    served_model_name: str = "???"
    vocab_size: int | None = None  # the proxy's token-id bound; None: not checked


@dataclass
class Stack:
    model_dir: Path
    server_url: str
    proxy_url: str
    proxy: ProxyConfig
    served_model_name: str


def model_vocab_size(model_dir: Path) -> int | None:
    """The number of token ids the checkpoint can emit (its ``config.json`` ``vocab_size``), if recorded."""
    try:
        size = json.loads((Path(model_dir) / "config.json").read_text()).get("vocab_size")
    except (OSError, ValueError):
        return None
    return size if isinstance(size, int) and size > 0 else None


@contextlib.contextmanager
def running_stack(model_dir: Path, serving: CpuServingConfig, proxy: ProxyConfig, run_dir: Path,
                  expert_tasks: Path | None = None, server_args: tuple[str, ...] = ()) -> Iterator[Stack]:
    """Start the CPU server and the proxy (logs in ``run_dir``); stop both on exit.

    ``expert_tasks`` (else ``serving.expert_tasks``), a tasks JSONL, makes the server the scripted expert;
    ``server_args``: extra server flags (``--expert-slip-rate``...). With ``EndpointServingConfig`` no server is
    started: the proxy forwards to the endpoint."""
    if isinstance(serving, EndpointServingConfig):
        with _proxy_only(serving, proxy, run_dir) as stack:
            yield stack
        return
    server_port = serving.port or free_port()
    expert = expert_tasks or serving.expert_tasks
    server = start_cpu_server_process(
        model_dir, server_port, served_model_name=serving.served_model_name, max_batch_size=serving.max_batch_size,
        torch_threads=serving.torch_threads, default_max_tokens=serving.default_max_tokens,
        expert_tasks=Path(expert) if expert else None,
        extra_args=(*server_args, *(("--max-model-len", str(serving.max_model_len)) if serving.max_model_len else ())),
        log_path=run_dir / "model_server.log",
    )
    procs: list[subprocess.Popen] = [server]
    try:
        proxy_cfg = _proxy_config(proxy, f"http://127.0.0.1:{server_port}", run_dir, serving.served_model_name,
                                  model_vocab_size(model_dir))
        procs.append(start_proxy_process(proxy_cfg, log_path=run_dir / "proxy.log"))
        yield Stack(model_dir, f"http://127.0.0.1:{server_port}", f"http://127.0.0.1:{proxy_cfg.port}", proxy_cfg,
                    serving.served_model_name)
    finally:
        for proc in reversed(procs):
            stop_process(proc)


def _proxy_config(proxy: ProxyConfig, upstream_url: str, run_dir: Path, model_name: str,
                  vocab_size: int | None) -> ProxyConfig:
    """The proxy of a job's stack: a free port unless set, the run's trace store, the upstream and its model."""
    return ProxyConfig(**{**asdict(proxy), "port": proxy.port or free_port(), "upstream_url": upstream_url,
                          "store_path": str(run_dir / "traces.sqlite"), "upstream_model": model_name,
                          "vocab_size": proxy.vocab_size or vocab_size})


@contextlib.contextmanager
def _proxy_only(serving: EndpointServingConfig, proxy: ProxyConfig, run_dir: Path) -> Iterator[Stack]:
    url = serving.url.rstrip("/").removesuffix("/v1")
    proxy_cfg = _proxy_config(proxy, url, run_dir, serving.served_model_name, serving.vocab_size)
    proc = start_proxy_process(proxy_cfg, log_path=run_dir / "proxy.log")
    try:
        yield Stack(Path(), url, f"http://127.0.0.1:{proxy_cfg.port}", proxy_cfg, serving.served_model_name)
    finally:
        stop_process(proc)
