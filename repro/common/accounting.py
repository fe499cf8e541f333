"""Compute accounting per phase of a job: wall-clock, CPU core-hours, GPU hours allocated and busy.

``Accountant.phase(name)`` measures a block; phases may repeat (their numbers add up) and nest (a nested
phase is also counted in its own row, but the ``total`` row counts only outermost blocks, so nothing is
counted twice). ``to_dict()`` is what goes into ``metrics.json`` under ``"compute"``.

**CPU time** is that of the whole process tree, read at the start and end of each block:

    tree CPU = this process (``RUSAGE_SELF``) + every child it has reaped (``RUSAGE_CHILDREN``)
               + for each live descendant: user + system + children_user + children_system (psutil)

A process is counted either while it is alive (psutil, its own CPU plus that of the children *it* reaped)
or, once its parent has reaped it, inside that parent's children totals, never both: reaping moves its
CPU from one term to the other, so a long-lived model server, proxy or harness worker is counted while it
runs, and a child reaped between two snapshots is counted once. The one race (a child reaped between
reading it alive and reading ``RUSAGE_CHILDREN``) is closed by dropping, after the ``RUSAGE_CHILDREN``
read, every direct child that is no longer running. What is *not* counted: a descendant that outlives
its parent and gets re-parented to init (its CPU after that, or all of it if it is never reaped by us).

**GPU**: ``gpu_devices`` is the number of GPUs this job holds (``CUDA_VISIBLE_DEVICES`` or NVML's count;
0 without a GPU); ``gpu_h_allocated`` = wall-clock x devices. ``gpu_busy_h`` is NVML's utilization
(share of time a kernel was running) sampled by a background thread and integrated over time, summed over
devices; it is ``None`` when not measured (no GPU, or ``nvidia-ml-py`` not installed).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import platform
import resource
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

SECONDS_PER_HOUR = 3600.0


# -- CPU ---------------------------------------------------------------------------------------------------


def _own_and_reaped_cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _live_cpu_s(proc: psutil.Process) -> float:
    """A live process's CPU plus what its reaped children used; 0 when it is already gone."""
    try:
        t = proc.cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0.0
    return t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)


def process_tree(pid: int | None) -> list[psutil.Process]:
    """``pid`` and its live descendants (empty when it is gone or None)."""
    if pid is None:
        return []
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def process_tree_cpu_s(pid: int | None) -> float:
    """CPU seconds of another process ``pid`` and its live descendants, each with its reaped children (0 when
    gone): a server this process started, read around the work it did."""
    return sum(_live_cpu_s(proc) for proc in process_tree(pid))


def tree_cpu_seconds() -> float:
    """CPU seconds used so far by this process, its reaped children and its live descendants (see module doc)."""
    me = psutil.Process()
    try:
        direct = {p.pid for p in me.children(recursive=False)}
        descendants = me.children(recursive=True)
    except psutil.NoSuchProcess:  # pragma: no cover - this process exists
        direct, descendants = set(), []
    live = [(p, _live_cpu_s(p)) for p in descendants]
    total = _own_and_reaped_cpu_s()  # read after the live ones: a child reaped in between is in here now
    for proc, cpu_s in live:
        if proc.pid in direct and not proc.is_running():
            continue  # reaped by us after we read it: already inside RUSAGE_CHILDREN
        total += cpu_s
    return total


# -- GPU ---------------------------------------------------------------------------------------------------


def load_nvml() -> Any | None:
    """The initialised ``pynvml`` module (from ``nvidia-ml-py``), or None when not installed or no driver."""
    if importlib.util.find_spec("pynvml") is None:
        return None
    import pynvml

    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError: no driver / no device
        return None
    return pynvml


def _visible_handles(nvml: Any) -> list[Any]:
    """NVML handles of the GPUs this process may use (``CUDA_VISIBLE_DEVICES`` by index or UUID)."""
    count = nvml.nvmlDeviceGetCount()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    handles = []
    for item in (v.strip() for v in visible.split(",") if v.strip()):
        if item.isdigit() and int(item) < count:
            handles.append(nvml.nvmlDeviceGetHandleByIndex(int(item)))
        elif item.startswith("GPU-"):
            with contextlib.suppress(Exception):
                handles.append(nvml.nvmlDeviceGetHandleByUUID(item))
    return handles


def _device_files() -> int:
    """GPUs visible as ``/dev/nvidiaN`` (a fallback when NVML is not installed)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([v for v in visible.split(",") if v.strip() and v.strip() != "-1"])
    return sum(1 for p in Path("/dev").glob("nvidia[0-9]*"))


def _gpu_name(nvml: Any, handle: Any) -> str:
    name = nvml.nvmlDeviceGetName(handle)
    return name.decode() if isinstance(name, bytes) else str(name)


class GpuSampler:
    """Integrates NVML utilization over time: ``busy_s`` = sum over devices of utilization x elapsed time."""

    def __init__(self, nvml: Any, handles: list[Any], interval_s: float = 0.5) -> None:
        self._nvml, self._handles, self._interval_s = nvml, handles, interval_s
        self._lock = threading.Lock()
        self._last = time.monotonic()
        self._busy_s = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._last = time.monotonic()
            self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def busy_s(self) -> float:
        """Busy GPU-seconds so far (takes a fresh sample first)."""
        self.tick()
        return self._busy_s

    def tick(self) -> None:
        """Add utilization x time since the last sample."""
        util = sum(self._utilization(h) for h in self._handles) / 100.0
        with self._lock:
            now = time.monotonic()
            self._busy_s += util * (now - self._last)
            self._last = now

    def _utilization(self, handle: Any) -> float:
        try:
            return float(self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except Exception:  # a transient NVML error counts as idle for one sample
            return 0.0

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.tick()


# -- phases ------------------------------------------------------------------------------------------------


@dataclass
class PhaseTotals:
    """What one phase (or the total) used, in seconds."""

    n: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    gpu_alloc_s: float = 0.0
    gpu_busy_s: float = 0.0

    def add(self, wall_s: float, cpu_s: float, devices: int, busy_s: float) -> None:
        self.n += 1
        self.wall_s += wall_s
        self.cpu_s += cpu_s
        self.gpu_alloc_s += wall_s * devices
        self.gpu_busy_s += busy_s

    def to_dict(self, devices: int, busy_measured: bool) -> dict[str, Any]:
        return {
            "n": self.n,
            "wall_s": round(self.wall_s, 3),
            "cpu_core_h": self.cpu_s / SECONDS_PER_HOUR,
            "gpu_devices": devices,
            "gpu_h_allocated": self.gpu_alloc_s / SECONDS_PER_HOUR,
            "gpu_busy_h": self.gpu_busy_s / SECONDS_PER_HOUR if busy_measured else None,
        }


@dataclass
class _Snapshot:
    wall: float
    cpu_s: float
    busy_s: float


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


class Accountant:
    """Measures named phases of a job. Use ``with acct.phase("sft"): ...``; close() stops the GPU sampler.

    ``nvml``: an initialised NVML module, ``None`` for none, or ``"auto"`` to load ``pynvml`` when present.
    ``gpu_devices``: override the number of GPUs held (default: visible NVML devices, else ``/dev/nvidiaN``).
    """

    def __init__(self, *, nvml: Any = "auto", gpu_devices: int | None = None, sample_interval_s: float = 0.5) -> None:
        self._nvml = load_nvml() if nvml == "auto" else nvml
        self._handles = _visible_handles(self._nvml) if self._nvml is not None else []
        self.gpu_names = [_gpu_name(self._nvml, h) for h in self._handles]
        self.gpu_devices = gpu_devices if gpu_devices is not None else (len(self._handles) or _device_files())
        self._sampler = GpuSampler(self._nvml, self._handles, sample_interval_s) if self._handles else None
        self.phases: dict[str, PhaseTotals] = {}
        self.total = PhaseTotals()
        self._active: list[str] = []
        self._lock = threading.Lock()

    @property
    def busy_measured(self) -> bool:
        return self._sampler is not None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Measure the block as phase ``name`` (added to earlier blocks of the same name)."""
        with self._lock:
            outermost, reentrant = not self._active, name in self._active
            self._active.append(name)
            if self._sampler is not None:
                self._sampler.start()
        start = self._snapshot()
        try:
            yield
        finally:
            end = self._snapshot()
            wall, cpu, busy = end.wall - start.wall, end.cpu_s - start.cpu_s, end.busy_s - start.busy_s
            with self._lock:
                self._active.remove(name)
                if not reentrant:  # the same name nested in itself is counted by its outer block
                    self.phases.setdefault(name, PhaseTotals()).add(wall, cpu, self.gpu_devices, busy)
                if outermost:
                    self.total.add(wall, cpu, self.gpu_devices, busy)

    def _snapshot(self) -> _Snapshot:
        busy = self._sampler.busy_s() if self._sampler is not None else 0.0
        return _Snapshot(time.monotonic(), tree_cpu_seconds(), busy)

    def hardware(self) -> dict[str, Any]:
        """CPU model and cores; GPU names (empty without a GPU or NVML)."""
        try:
            usable = len(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover - not Linux
            usable = os.cpu_count() or 0
        return {"cpu_model": cpu_model(), "cpu_cores": os.cpu_count() or 0, "cpu_cores_usable": usable,
                "gpu_count": self.gpu_devices, "gpus": list(self.gpu_names), "gpu_busy_source":
                "nvml utilization" if self.busy_measured else None}

    def to_dict(self) -> dict[str, Any]:
        """``{"phases": {name: {...}}, "total": {...}, "hardware": {...}}`` (hours; see module doc)."""
        with self._lock:
            phases = {name: t.to_dict(self.gpu_devices, self.busy_measured) for name, t in self.phases.items()}
            total = self.total.to_dict(self.gpu_devices, self.busy_measured)
        return {"phases": phases, "total": total, "hardware": self.hardware()}

    def close(self) -> None:
        if self._sampler is not None:
            self._sampler.stop()

    def __enter__(self) -> Accountant:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- formatting --------------------------------------------------------------------------------------------


def _hours(value: float) -> str:
    return f"{value:.3g}" if value >= 0.001 else ("0" if value == 0 else "<0.001")


def hours_cell(entry: dict[str, Any] | None) -> str:
    """One phase's hours for a markdown cell: ``"0.12 GPU-h (0.05 busy), 0.3 CPU-h"`` or ``"0.02 CPU-h"``."""
    if not entry:
        return "-"
    cpu = f"{_hours(entry['cpu_core_h'])} CPU-h"
    if not entry.get("gpu_devices"):
        return cpu
    busy = entry.get("gpu_busy_h")
    gpu = f"{_hours(entry['gpu_h_allocated'])} GPU-h" + (f" ({_hours(busy)} busy)" if busy is not None else "")
    return f"{gpu}, {cpu}"


def hours_header(phases: list[str]) -> str:
    """The markdown header and separator lines for :func:`hours_row`."""
    cells = ["run", *phases, "total"]
    return "| " + " | ".join(cells) + " |\n|" + "---|" * len(cells)


def hours_row(label: str, compute: dict[str, Any], phases: list[str]) -> str:
    """A markdown row of hours per phase (``-`` for a phase the run did not have), then the total."""
    cells = [label, *(hours_cell(compute.get("phases", {}).get(p)) for p in phases), hours_cell(compute.get("total"))]
    return "| " + " | ".join(c.replace("|", "/") for c in cells) + " |"
