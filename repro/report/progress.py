"""Progress for long runs: a live rich bar in a terminal, a plain line every 10% when piped (logs, CI)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class ProgressHandle:
    """What :func:`progress` yields: call :meth:`advance` as items finish (from any thread)."""

    def __init__(self, total: int, description: str, console: Console, bar: Progress | None) -> None:
        self.total, self.description, self.console, self.bar = total, description, console, bar
        self.done = 0
        self._task = bar.add_task(description, total=total) if bar is not None else None
        self._next_tenth = 1  # print when done reaches this tenth of total (integer arithmetic: no drift)
        self._lock = threading.Lock()

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
            self.console.print(f"{self.description}: {self.done}/{self.total} {note}".rstrip())
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
