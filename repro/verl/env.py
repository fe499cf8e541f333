"""verl in an environment of its own, built on first use and cached like vLLM's (:mod:`repro.serving.vllm_env`).

``verl==0.9.1`` pins ``transformers>=5.5.3,<5.11`` (the package's environment has a newer one; vLLM 0.32 pins
``<5.20``), so it cannot share an environment with either. Its environment gets the CPU ``torch==2.13.0`` first (a
bare ``torch`` requirement would pull a CUDA build; on a GPU machine use verl's own CUDA stack: ``docs/gpu.md``),
then verl, then what verl imports without declaring it (``cachetools``, ``uvicorn``, ``fastapi``). The package runs
there from its source root on ``PYTHONPATH`` (:func:`verl_command`), first on the path: verl's wheel installs
top-level ``tests`` and ``scripts`` packages into site-packages, which would otherwise shadow a checkout's own.

On a machine with an NVIDIA device the environment is ``verl-vllm``: ``verl[vllm]`` with the CUDA torch and the vLLM
that verl's extra pins (its rollout replicas), never the CPU build's torch.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

VERL_VERSION = "0.9.1"
NAME = "verl"
PACKAGES = ["torch==2.13.0", f"verl=={VERL_VERSION}", "cachetools", "uvicorn", "fastapi"]
GPU_NAME = "verl-vllm"
GPU_PACKAGES = [f"verl[vllm]=={VERL_VERSION}", "cachetools", "uvicorn", "fastapi"]
SOURCE_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds the `repro` package


class VerlEnvError(RuntimeError):
    """verl's environment could not be found or built."""


def flavour() -> tuple[str, list[str]]:
    """(name, packages) of this machine's verl environment: with vLLM on an NVIDIA machine, else the CPU build."""
    from repro.serving.vllm_env import has_nvidia_device

    return (GPU_NAME, GPU_PACKAGES) if has_nvidia_device() else (NAME, PACKAGES)


def ensure_verl_env() -> Path:
    """The interpreter of the cached verl environment, building it first when missing (~1 min of pip here);
    raises :class:`VerlEnvError` with the environment's path and what to retry."""
    from repro.common.venvs import HarnessEnvError, ensure_harness_env, env_root

    name, packages = flavour()
    try:
        return Path(ensure_harness_env(name, VERL_VERSION, packages, timeout_s=3600.0).python)
    except HarnessEnvError as exc:
        raise VerlEnvError(f"could not build verl's environment {env_root(name, VERL_VERSION)} (pip install "
                           f"{' '.join(packages)}): {exc}; retry with `python -m repro.verl.env`") from exc


def cached_verl_python() -> Path | None:
    """The cached environment's interpreter when it is built (valid marker), else None; builds nothing."""
    from repro.common.venvs import build_hash, env_root, is_valid

    name, packages = flavour()
    root = env_root(name, VERL_VERSION)
    return root / "bin" / "python" if is_valid(root, build_hash(packages, sys.executable)) else None


def verl_env_vars(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a command in verl's environment runs with: the package's source root first on
    ``PYTHONPATH`` (before verl's top-level ``tests``/``scripts``), nothing of this interpreter's site."""
    env = dict(os.environ if base is None else base)
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != SOURCE_ROOT]
    env["PYTHONPATH"] = os.pathsep.join([str(SOURCE_ROOT), *rest])
    env.pop("PYTHONHOME", None)
    return env


def verl_command(python: Path, module: str, *args: str, nproc: int = 1, master_port: int = 0) -> list[str]:
    """``python -m module args`` in verl's environment, or under ``torchrun --nproc_per_node nproc`` (one host)."""
    if nproc <= 1:
        return [str(python), "-m", module, *args]
    port = [f"--master_port={master_port}"] if master_port else []
    return [str(python), "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", *port, "-m", module, *args]


def main() -> None:
    """``python -m repro.verl.env``: build (or find) the cached environment and print its interpreter."""
    print(ensure_verl_env())


if __name__ == "__main__":
    main()
