"""Weight sync: tell the running model server to load a new checkpoint (the CPU server's reload route)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx


def push_weights(server_url: str, model_dir: Path, timeout_s: float = 120.0) -> float:
    """Ask the CPU model server at ``server_url`` to load ``model_dir``; returns the seconds it took."""
    started = time.perf_counter()
    response = httpx.post(f"{server_url}/v1/load_weights", json={"model_dir": str(Path(model_dir).resolve())},
                          timeout=timeout_s)
    if response.status_code != 200:
        raise RuntimeError(f"the model server refused the new weights ({response.status_code}): {response.text}")
    return time.perf_counter() - started
