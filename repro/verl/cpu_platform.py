"""A CPU platform for verl, registered through verl's own platform-plugin API (``PlatformRegistry``,
``set_platform``), so that verl's real actor code (``ActorRolloutRefWorker``, the FSDP2 engine, ``compute_log_prob``,
``update_actor``) runs on a machine without an accelerator: device ``cpu``, collectives over ``gloo``, a device module
whose memory and stream calls are no-ops. This is the CPU mode of ``trainer=verl`` (CI and the miniature); on GPUs
verl's own ``nvidia`` platform is used and nothing here is imported.

What else verl needs on CPU, and why (verl 0.9.1):

* ``VERL_ENGINE_DEVICE=cuda``: the FSDP engines are registered for ``cuda`` / ``npu`` only; the engine code itself
  is device-agnostic (it asks the platform for the device), so the ``cuda`` registration serves.
* the current device is ``"cpu"``, not an index: verl moves modules and tensors with ``.to(get_device_id())``.
* the global process group over plain ``gloo``: verl initialises ``cpu:gloo,<device>:<nccl backend>``, which names
  the device twice when the device is ``cpu``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from types import ModuleType, SimpleNamespace
from typing import Any

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry, get_platform, set_platform

NAME = "repro_cpu"
ENV = {"VERL_PLATFORM": NAME, "VERL_ENGINE_DEVICE": "cuda", "CUDA_VISIBLE_DEVICES": ""}


def _device_module() -> ModuleType:
    """``torch.cpu`` with the calls verl makes of a CUDA-like device module (memory statistics, caches, streams,
    RNG state) answered as a host without device memory would."""
    module = ModuleType("repro_cpu_device")
    for name in dir(torch.cpu):
        if not name.startswith("_"):
            setattr(module, name, getattr(torch.cpu, name))
    zero = lambda *a, **k: 0  # noqa: E731
    none = lambda *a, **k: None  # noqa: E731
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
        setattr(module, name, zero)
    for name in ("empty_cache", "reset_peak_memory_stats", "synchronize", "set_device", "manual_seed",
                 "manual_seed_all", "ipc_collect", "set_per_process_memory_fraction"):
        setattr(module, name, none)
    module.mem_get_info = lambda *a, **k: (0, 0)
    module.get_rng_state = torch.get_rng_state
    module.set_rng_state = torch.set_rng_state
    module.get_device_name = lambda *a, **k: "CPU"  # verl's flops counter: no peak flops known, MFU 0
    module.is_available = lambda: True
    module.device_count = lambda: 1
    module.current_device = lambda: 0
    module.memory = SimpleNamespace(_set_allocator_settings=none)
    return module


_DEVICE = _device_module()


class PlatformCPU(PlatformBase):
    """verl's platform interface on the host CPU (gloo collectives, no device memory)."""

    device_name = "cpu"
    vendor_name = "cpu"

    @property
    def device_module(self) -> ModuleType:
        return _DEVICE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return True

    def current_device(self) -> str:  # type: ignore[override]
        return "cpu"  # verl moves tensors with .to(current_device()): an index would name an accelerator

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"  # logical GPUs (ray.init(num_gpus=N)): verl places one worker per "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def register() -> Any:
    """Register the CPU platform under :data:`NAME` and make it verl's current platform; returns it. Idempotent."""
    os.environ.update(ENV)
    PlatformRegistry.register(platform=NAME)(PlatformCPU)
    if get_platform().device_name != "cpu":
        set_platform(PlatformCPU())
    _plain_gloo_process_group()
    return get_platform()


def _plain_gloo_process_group() -> None:
    """verl's Ray workers initialise ``cpu:gloo,<device>:<backend>``; on CPU that names ``cpu`` twice: use gloo."""
    import verl.utils.distributed as distributed

    if getattr(distributed.initialize_global_process_group_ray, "_repro_cpu", False):
        return
    original = distributed.initialize_global_process_group_ray

    def gloo_only(timeout_second: int | None = None, backend: str | None = None) -> Any:
        return original(timeout_second=timeout_second, backend=backend or "gloo")

    gloo_only._repro_cpu = True  # type: ignore[attr-defined]
    distributed.initialize_global_process_group_ray = gloo_only
