"""The base of the adapters that start one harness process per rollout (mini-SWE-agent 1.x, OpenCode, OpenHands):
rollouts on threads, an optional temporary state dir, the context manager, and the adapter's record of a rollout."""

from __future__ import annotations

import json
import shutil
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar, Self

from harness_adapters.processes import run_in_threads, stream_in_threads
from repro.protocols import HarnessLimits, HarnessResult, HarnessRollout


class PerRolloutHarness(ABC):
    """A harness run as one process per rollout, up to ``concurrency`` at once (threads, :func:`run_in_threads`).

    Subclasses set ``name``, ``thread_prefix``, ``cfg`` and ``version`` and implement :meth:`identity` and
    :meth:`run_one`. The ``workers`` argument of their constructors is accepted for the registry's common
    signature and unused: there are no long-lived workers, and no process outlives :meth:`run`."""

    name: ClassVar[str]
    thread_prefix: ClassVar[str]
    loop_kind: ClassVar[str] = "proxy"
    cfg: Any
    version: str
    _state: Path | None = None
    _own_state: bool = False

    def use_state_dir(self, state_dir: Path | None, prefix: str) -> Path:
        """``state_dir`` (kept), or a new temporary dir named ``prefix...`` that :meth:`close` removes; made and
        resolved."""
        self._own_state = state_dir is None
        self._state = Path(state_dir or tempfile.mkdtemp(prefix=prefix)).resolve()
        self._state.mkdir(parents=True, exist_ok=True)
        return self._state

    @property
    def limits(self) -> HarnessLimits:
        """The step and wall-time limits of its config (recorded in the frozen spec)."""
        return HarnessLimits.of(self.cfg)

    @abstractmethod
    def identity(self) -> dict[str, Any]:
        """Name, version, hashes of what the model sees, wire-relevant package versions, settings."""

    @abstractmethod
    def run_one(self, rollout: HarnessRollout) -> HarnessResult:
        """Run one rollout's harness process to its end (on a worker thread of :meth:`run`)."""

    def run(self, rollouts: list[HarnessRollout], concurrency: int) -> list[HarnessResult]:
        """Run ``rollouts`` with at most ``concurrency`` harness processes at once; results in order."""
        return run_in_threads(rollouts, concurrency, self.run_one, self.thread_prefix)

    def run_each(self, rollouts: Iterable[HarnessRollout], concurrency: int,
                 on_result: Callable[[HarnessRollout, HarnessResult], None]) -> int:
        """Streaming :meth:`run` (``repro.protocols.StreamingHarness``): rollouts taken as slots free up, each
        result handed to ``on_result`` as it ends; returns how many ran."""
        return stream_in_threads(rollouts, concurrency, self.run_one, on_result, self.thread_prefix)

    def write_record(self, path: Path, result: HarnessResult, command: list[str]) -> None:
        """The adapter's record of one rollout at ``path``: its result, the harness identity and the command."""
        record = asdict(result) | {"identity": self.identity(), "command": command}
        path.write_text(json.dumps(record, indent=2, default=str) + "\n")

    def close(self) -> None:
        """Drop the state dir if it was temporary."""
        if self._own_state and self._state is not None:
            shutil.rmtree(self._state, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
