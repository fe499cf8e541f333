"""Push a new checkpoint into a running ``vllm serve`` without restarting it.

The route is vLLM's documented in-place reload (docs/features/sleep_mode.md, "Online Serving"): start the
server with ``VLLM_SERVER_DEV_MODE=1`` (development endpoints; never expose them), then

    POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": "<checkpoint dir>"}}

which runs ``reload_weights`` on every worker: the model runner reads the checkpoint's safetensors and
loads them into the existing parameters (same addresses, so CUDA graphs stay valid). ``weights_path`` is
an argument of ``GPUModelRunner.reload_weights`` in recent vLLM; older releases reload only from the
directory the server was started from, so there the new ``*.safetensors`` are first copied over the
served directory's (the launcher serves a private copy for this reason) and ``reload_weights`` is called
without arguments. Afterwards ``POST /reset_prefix_cache`` drops KV blocks computed with the old weights.
Large models would ``POST /sleep?level=2`` and ``/wake_up?tags=weights`` around the reload to free the KV
cache first (same document); the caller must make sure no request is in flight (``/pause`` where present).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

DEV_MODE_ENV = {"VLLM_SERVER_DEV_MODE": "1"}
WEIGHT_FILE_GLOBS = ("*.safetensors", "model.safetensors.index.json")
_RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"


class WeightSyncError(RuntimeError):
    """vLLM refused or failed the reload."""


@dataclass
class WeightSyncResult:
    """How the weights got in: the route taken, how long it took, and the responses seen."""

    route: str
    seconds: float
    prefix_cache_reset: bool
    responses: list[dict[str, Any]] = field(default_factory=list)


def reload_supports_weights_path() -> bool | None:
    """Whether the installed vLLM's ``reload_weights`` takes ``weights_path`` (read from source, not imported);
    None when vLLM or the module is not found."""
    try:
        spec = importlib.util.find_spec(_RUNNER_MODULE)
    except ModuleNotFoundError:
        return None
    if spec is None or not spec.origin:
        return None
    text = Path(spec.origin).read_text(encoding="utf-8", errors="replace")
    start = text.find("def reload_weights(")
    if start < 0:
        return None
    header = text[start : start + 1000]
    end = header.find(") ->")
    return "weights_path" in header[: end if end >= 0 else len(header)]


def install_weights(src_dir: Path, served_dir: Path) -> list[str]:
    """Copy the checkpoint's weight files over the served directory's (each replaced atomically)."""
    names = sorted({p.name for g in WEIGHT_FILE_GLOBS for p in Path(src_dir).glob(g)})
    if not names:
        raise WeightSyncError(f"{src_dir} holds no *.safetensors")
    for stale in Path(served_dir).glob("*.safetensors"):
        if stale.name not in names:
            stale.unlink()
    for name in names:
        tmp = Path(served_dir) / f".{name}.tmp{os.getpid()}"
        shutil.copyfile(Path(src_dir) / name, tmp)
        os.replace(tmp, Path(served_dir) / name)
    return names


def _rpc_body(weights_path: Path | None, timeout_s: float) -> dict[str, Any]:
    body: dict[str, Any] = {"method": "reload_weights", "timeout": timeout_s}
    if weights_path is not None:
        body["kwargs"] = {"weights_path": str(weights_path)}
    return body


def _post(client: httpx.Client, path: str, body: dict[str, Any] | None, timeout_s: float) -> dict[str, Any]:
    resp = client.post(path, json=body, timeout=timeout_s)
    record = {"path": path, "status": resp.status_code, "body": resp.text[:500]}
    if resp.status_code == 404 and path == "/collective_rpc":
        raise WeightSyncError("vLLM has no /collective_rpc: start it with VLLM_SERVER_DEV_MODE=1")
    return record


def reload_weights(base_url: str, weights_dir: Path, served_dir: Path, *, timeout_s: float = 300.0,
                   with_path: bool | None = None, client: httpx.Client | None = None) -> WeightSyncResult:
    """Load ``weights_dir`` into the vLLM server at ``base_url`` (served from ``served_dir``); see module doc.

    ``with_path``: use the ``weights_path`` argument (True), the overwrite-then-reload route (False), or decide
    from the installed vLLM and fall back to the overwrite route if the server refuses the argument (None).
    """
    own = client is None
    client = client or httpx.Client(base_url=base_url)
    started, responses = time.monotonic(), []
    try:
        if with_path is None:
            with_path = reload_supports_weights_path() is not False
        route = "collective_rpc reload_weights(weights_path)"
        if with_path:
            responses.append(_post(client, "/collective_rpc", _rpc_body(Path(weights_dir), timeout_s), timeout_s))
        if not with_path or responses[-1]["status"] != 200:
            install_weights(Path(weights_dir), Path(served_dir))
            route = "collective_rpc reload_weights() after overwriting the served weights"
            responses.append(_post(client, "/collective_rpc", _rpc_body(None, timeout_s), timeout_s))
        if responses[-1]["status"] != 200:
            raise WeightSyncError(f"reload_weights failed: {responses[-1]}")
        reset = _post(client, "/reset_prefix_cache", None, 60.0)
        responses.append(reset)
        return WeightSyncResult(route, round(time.monotonic() - started, 3), reset["status"] == 200, responses)
    finally:
        if own:
            client.close()
