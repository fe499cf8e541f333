"""Objects that hold processes, threads or temporary state are context managers: ``with`` closes them."""

from __future__ import annotations

from typing import Self


class Closing:
    """``with obj:`` calls ``obj.close()`` on exit (the subclass implements :meth:`close`, idempotent)."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
