"""Compute accounting: CPU of live and reaped children counted once, phases accumulate, GPU fields."""

from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from repro.common.accounting import Accountant, hours_cell, hours_header, hours_row, tree_cpu_seconds

BURN_S = 0.3
# Burns BURN_S of CPU, says so, then waits for a line on stdin before burning BURN_S again and exiting.
_CHILD = f"""
import sys, time
def burn():
    t = time.process_time()
    while time.process_time() - t < {BURN_S}:
        pass
burn()
print("burned", flush=True)
if sys.stdin.readline().strip() == "again":
    burn()
    print("burned", flush=True)
    sys.stdin.readline()
"""


def _spawn() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _wait_burned(proc: subprocess.Popen) -> None:
    assert proc.stdout is not None and proc.stdout.readline().strip() == "burned"


def _send(proc: subprocess.Popen, line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


def _cpu_s(acct: Accountant, name: str) -> float:
    return acct.to_dict()["phases"][name]["cpu_core_h"] * 3600


@pytest.fixture
def acct() -> Accountant:
    with Accountant(nvml=None, gpu_devices=0) as accountant:
        yield accountant


def test_live_child_cpu_is_counted(acct: Accountant) -> None:
    proc = _spawn()
    try:
        with acct.phase("serve"):
            _wait_burned(proc)
            assert proc.poll() is None  # still alive at the phase end
        assert BURN_S <= _cpu_s(acct, "serve") < BURN_S + 0.5
    finally:
        _send(proc, "stop")
        proc.wait(timeout=30)


def test_child_reaped_between_snapshots_counted_once(acct: Accountant) -> None:
    proc = _spawn()
    with acct.phase("a"):
        _wait_burned(proc)  # alive at the end of "a": its first burn is counted here
    with acct.phase("b"):
        _send(proc, "again")
        _wait_burned(proc)
        _send(proc, "exit")
        proc.wait(timeout=30)  # reaped inside "b": its CPU moves into RUSAGE_CHILDREN
    a, b = _cpu_s(acct, "a"), _cpu_s(acct, "b")
    assert a >= BURN_S
    assert BURN_S <= b < 2 * BURN_S  # double counting would give >= 2 * BURN_S
    assert a + b < 2 * BURN_S + 0.5


def test_tree_cpu_is_monotonic_across_a_reap() -> None:
    proc = _spawn()
    _wait_burned(proc)
    before = tree_cpu_seconds()
    _send(proc, "stop")
    proc.wait(timeout=30)
    after = tree_cpu_seconds()
    assert 0 <= after - before < 0.2


def test_grandchild_alive_is_counted(acct: Accountant) -> None:
    code = (f"import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', {_CHILD!r}], stdin=sys.stdin); "
            "p.wait()")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        with acct.phase("tree"):
            _wait_burned(proc)
        assert _cpu_s(acct, "tree") >= BURN_S
    finally:
        _send(proc, "stop")
        proc.wait(timeout=30)


def test_repeated_and_nested_phases_accumulate(acct: Accountant) -> None:
    for _ in range(2):
        with acct.phase("eval"):
            time.sleep(0.05)
    with acct.phase("rl"):
        time.sleep(0.05)
        with acct.phase("eval"), acct.phase("eval"):  # re-entrant: counted once
            time.sleep(0.05)
    out = acct.to_dict()
    assert out["phases"]["eval"]["n"] == 3
    assert 0.15 <= out["phases"]["eval"]["wall_s"] < 0.5
    assert out["phases"]["rl"]["n"] == 1 and out["phases"]["rl"]["wall_s"] >= 0.1
    assert out["total"]["n"] == 3  # two "eval" blocks and the outer "rl"; the nested ones are inside it
    assert out["total"]["wall_s"] == pytest.approx(out["phases"]["rl"]["wall_s"] + 0.1, abs=0.1)


def test_no_gpu_fields_are_zero_or_none(acct: Accountant) -> None:
    with acct.phase("sft"):
        pass
    entry = acct.to_dict()["phases"]["sft"]
    assert entry["gpu_devices"] == 0 and entry["gpu_h_allocated"] == 0.0 and entry["gpu_busy_h"] is None
    hardware = acct.to_dict()["hardware"]
    assert hardware["gpus"] == [] and hardware["gpu_busy_source"] is None and hardware["cpu_cores"] >= 1
    assert hours_cell(entry).endswith("CPU-h") and "GPU" not in hours_cell(entry)


class FakeNvml:
    """Two GPUs, each 50% busy."""

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return b"Fake H200"

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=50, memory=0)


def test_gpu_allocated_and_busy_hours(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with Accountant(nvml=FakeNvml(), sample_interval_s=0.02) as acct:
        with acct.phase("rl"):
            time.sleep(0.3)
        out = acct.to_dict()
    entry = out["phases"]["rl"]
    assert entry["gpu_devices"] == 2 and out["hardware"]["gpus"] == ["Fake H200", "Fake H200"]
    assert entry["gpu_h_allocated"] * 3600 == pytest.approx(2 * entry["wall_s"], rel=0.01)
    assert entry["gpu_busy_h"] * 3600 == pytest.approx(0.5 * 2 * entry["wall_s"], rel=0.05)
    assert "GPU-h" in hours_cell(entry) and "busy" in hours_cell(entry)


def test_cuda_visible_devices_limits_the_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with Accountant(nvml=FakeNvml()) as acct:
        assert acct.gpu_devices == 1


def test_markdown_row() -> None:
    compute = {"phases": {"sft": {"cpu_core_h": 0.5, "gpu_devices": 1, "gpu_h_allocated": 0.25, "gpu_busy_h": 0.1}},
               "total": {"cpu_core_h": 0.5, "gpu_devices": 1, "gpu_h_allocated": 0.25, "gpu_busy_h": None}}
    row = hours_row("run-1", compute, ["sft", "rl"])
    assert row == "| run-1 | 0.25 GPU-h (0.1 busy), 0.5 CPU-h | - | 0.25 GPU-h, 0.5 CPU-h |"
    assert hours_header(["sft", "rl"]).splitlines()[0] == "| run | sft | rl | total |"
