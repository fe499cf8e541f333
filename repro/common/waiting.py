"""Waiting on a file descriptor without ``select.select``, whose descriptors must be below 1024: a long run (thousands
of rollouts, each with its pipes, sockets and pidfds) can hold more, and select then raises."""

from __future__ import annotations

import select
from typing import IO, Any


def readable(source: int | IO[Any], timeout_s: float | None) -> bool:
    """Whether ``source`` (a descriptor or a file) is readable, or has hung up, within ``timeout_s`` (None: wait)."""
    fd = source if isinstance(source, int) else source.fileno()
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(None if timeout_s is None else max(timeout_s, 0.0) * 1000))
