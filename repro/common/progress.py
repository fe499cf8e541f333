"""Progress for long runs: a live rich bar in a terminal, a plain line every 10% when piped (logs, CI)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def duration(seconds: float) -> str:
    """``45s``, ``3m 05s``, ``1h 02m``."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


class ProgressHandle:
    """What :func:`progress` yields: call :meth:`advance` as items finish (from any thread)."""

    def __init__(self, total: int, description: str, console: Console, bar: Progress | None) -> None:
        self.total, self.description, self.console, self.bar = total, description, console, bar
        self.done = 0
        self._task = bar.add_task(description, total=total) if bar is not None else None
        self._next_tenth = 1  # print when done reaches this tenth of total (integer arithmetic: no drift)
        self._lock = threading.Lock()
        self._started = time.monotonic()

    def _timing(self) -> str:
        """`` (1m 12s, ~2m 30s left)``: elapsed, and the rest at the rate so far."""
        elapsed = time.monotonic() - self._started
        left = elapsed * (self.total - self.done) / self.done if self.done else 0.0
        return f" ({duration(elapsed)}, ~{duration(left)} left)" if self.done < self.total else \
            f" ({duration(elapsed)})"

    def advance(self, n: int = 1, note: str = "") -> None:
        """``n`` more items done; ``note`` (e.g. the last outcome) shows next to the bar."""
        with self._lock:
            self._advance(n, note)

    def _advance(self, n: int, note: str) -> None:
        self.done += n
        if self.bar is not None:
            text = f"{self.description} {note}".rstrip()
            self.bar.update(self._task, advance=n, description=text)
            return
        if 10 * self.done >= self._next_tenth * self.total or self.done == self.total:
            self.console.print(f"{self.description}: {self.done}/{self.total} {note}{self._timing()}".rstrip())
            while self._next_tenth * self.total <= 10 * self.done and self._next_tenth <= 10:
                self._next_tenth += 1


@contextmanager
def progress(total: int, description: str, console: Console | None = None) -> Iterator[ProgressHandle]:
    """``with progress(len(pending), "rollouts") as bar: ... bar.advance(note=outcome)``."""
    console = console or Console()
    if not console.is_terminal:
        yield ProgressHandle(total, description, console, None)
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        yield ProgressHandle(total, description, console, bar)
