"""Group commit: calls from many concurrent requests share one SQLite transaction.

Each submitter gets told (through an asyncio future or a callback) only after the transaction holding
its call has committed, so an acknowledged call is durable; the commit cost is shared by the batch.

The writer thread does not die on a bad record: a call it cannot store is stored as a failed call with the
reason (:class:`CallNotStored` tells the submitter), and the thread goes on. Should the thread end anyway,
``failure`` says why, every waiting and later submitter gets :class:`WriterStopped` at once, and every wait
is bounded (:class:`WriterTimeout`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass

from repro.store.codec import Previous
from repro.store.encoder import CallEncoder, Key, TokenRangeError, failed_versions
from repro.store.schema import CALL_COLUMNS
from repro.store.sqlite_store import TraceStoreConfig, connect
from repro.store.trace_records import CallRecord

_INSERT = f"INSERT INTO calls ({', '.join(CALL_COLUMNS)}) VALUES ({', '.join('?' * len(CALL_COLUMNS))})"
Done = Callable[[BaseException | None], None]
_STOP = object()
log = logging.getLogger(__name__)


class TraceWriteError(RuntimeError):
    """A call was not acknowledged as written."""


class CallNotStored(TraceWriteError):
    """The call could not be stored as received; ``recorded`` says whether a failed-call record took its place,
    ``upstream_fault`` whether the cause is a value the upstream returned (a token id outside the vocabulary)."""

    def __init__(self, reason: str, recorded: bool, upstream_fault: bool = False) -> None:
        super().__init__(reason)
        self.reason, self.recorded, self.upstream_fault = reason, recorded, upstream_fault


class WriterStopped(TraceWriteError):
    """The writer thread has ended; nothing more can be written."""


class WriterTimeout(TraceWriteError):
    """The writer did not commit the call within the bound."""


@dataclass(eq=False, slots=True)
class _Item:
    call: CallRecord
    done: Done | None = None
    waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future] | None = None


class GroupCommitWriter:
    """A writer thread that batches call inserts into one transaction per drain of its queue."""

    def __init__(self, config: TraceStoreConfig, max_batch: int = 1024, cache_rollouts: int = 4096,
                 write_timeout_s: float = 30.0, vocab_size: int | None = None) -> None:
        self._config = config
        self._max_batch = max_batch
        self.write_timeout_s = write_timeout_s
        self._encoder = CallEncoder(cache_rollouts, vocab_size)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.failure: str | None = None  # why the writer thread ended, if it did
        self.commits = 0
        self.written = 0
        self.stored_as_failed = 0
        self._thread = threading.Thread(target=self._run, name="trace-writer", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    @property
    def healthy(self) -> bool:
        return self.failure is None and self._thread.is_alive()

    # submitting -----------------------------------------------------------------------------------
    def submit(self, call: CallRecord, done: Done) -> None:
        """Queue ``call``; ``done(None)`` runs in the writer thread after commit (``done(exc)`` on failure)."""
        self._enqueue(_Item(call, done=done))

    async def write(self, call: CallRecord, timeout_s: float | None = None) -> None:
        """Queue ``call`` and wait until it is committed (at most ``timeout_s``, default ``write_timeout_s``)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        limit = self.write_timeout_s if timeout_s is None else timeout_s
        timer = loop.call_later(limit, _expire, future, limit)  # cheaper than wait_for: no task per call
        self._enqueue(_Item(call, waiter=(loop, future)))
        try:
            await future
        finally:
            timer.cancel()

    def write_sync(self, call: CallRecord, timeout_s: float | None = None) -> None:
        """Blocking variant for threads without an event loop."""
        finished = threading.Event()
        errors: list[BaseException] = []

        def done(exc: BaseException | None) -> None:
            if exc is not None:
                errors.append(exc)
            finished.set()

        self.submit(call, done)
        limit = self.write_timeout_s if timeout_s is None else timeout_s
        if not finished.wait(limit):
            raise WriterTimeout(f"the trace writer did not commit the call within {limit}s")
        if errors:
            raise errors[0]

    def close(self, timeout_s: float = 10.0) -> bool:
        """Flush what is queued and stop the thread; False when it did not stop within ``timeout_s``."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _enqueue(self, item: _Item) -> None:
        if self.failure is not None:
            _notify([item], [WriterStopped(self.failure)])
            return
        self._queue.put(item)
        if self.failure is not None:  # the thread ended while we queued: nobody else will answer
            self._fail_queued()

    # the writer thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            conn = connect(self._config)
        except BaseException as exc:  # reported to the constructor
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        batch: list[_Item] = []
        try:
            stopping = False
            while not stopping:
                batch, stopping = self._next_batch()
                if batch:
                    self._commit(conn, batch)
                batch = []
        except BaseException as exc:  # anything that escapes: fail everyone now instead of hanging them
            self.failure = f"trace writer stopped: {type(exc).__name__}: {exc}"
            log.error("%s", self.failure)
            _notify(batch, [WriterStopped(self.failure)] * len(batch))
            self._fail_queued()
        finally:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def _next_batch(self) -> tuple[list[_Item], bool]:
        batch = [self._queue.get()]
        while len(batch) < self._max_batch:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        if _STOP not in batch:  # identity comparisons (_Item has no __eq__)
            return batch, False
        return [item for item in batch if item is not _STOP], True

    def _fail_queued(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not _STOP:
                _notify([item], [WriterStopped(self.failure or "trace writer stopped")])

    def _commit(self, conn: sqlite3.Connection, batch: list[_Item]) -> None:
        try:
            self._commit_together(conn, batch)
            errors: list[BaseException | None] = [None] * len(batch)
        except Exception:  # a record that cannot be encoded or inserted: roll back, then one call at a time
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            self._encoder.forget([(item.call.rollout_id, item.call.purpose) for item in batch])
            errors = [self._commit_alone(conn, item.call) for item in batch]
        self.commits += 1
        self.written += sum(1 for e in errors if e is None or (isinstance(e, CallNotStored) and e.recorded))
        _notify(batch, errors)

    def _commit_together(self, conn: sqlite3.Connection, batch: list[_Item]) -> None:
        pending: dict[Key, Previous] = {}
        rows = []
        for item in batch:
            row, key, previous = self._encoder.encode(conn, item.call, pending)
            pending[key] = previous
            rows.append(row)
        conn.execute("BEGIN")
        conn.executemany(_INSERT, rows)
        conn.execute("COMMIT")
        for key, previous in pending.items():
            self._encoder.committed(key, previous)

    def _commit_alone(self, conn: sqlite3.Connection, call: CallRecord) -> BaseException | None:
        """Insert one call (autocommit); if it cannot be stored, store it as a failed call with the reason."""
        try:
            self._insert(conn, call)
            return None
        except TokenRangeError as exc:
            reason, upstream_fault = str(exc), True
        except Exception as exc:
            reason, upstream_fault = f"{type(exc).__name__}: {exc}", False
        for failed in failed_versions(call, reason, upstream_fault):
            try:
                self._insert(conn, failed)
            except Exception:
                continue
            self.stored_as_failed += 1
            log.warning("call %s#%d stored as failed: %s", call.rollout_id, call.seq, reason)
            return CallNotStored(reason, recorded=True, upstream_fault=upstream_fault)
        log.error("call %s#%d could not be stored at all: %s", call.rollout_id, call.seq, reason)
        return CallNotStored(reason, recorded=False, upstream_fault=upstream_fault)

    def _insert(self, conn: sqlite3.Connection, call: CallRecord) -> None:
        row, key, previous = self._encoder.encode(conn, call)
        conn.execute(_INSERT, row)
        self._encoder.committed(key, previous)


def _notify(batch: list[_Item], errors: list[BaseException | None]) -> None:
    by_loop: dict[asyncio.AbstractEventLoop, list] = {}
    for item, error in zip(batch, errors, strict=True):
        if item.done is not None:
            try:
                item.done(error)
            except Exception:  # a submitter's callback must not take the writer down
                log.exception("trace writer callback failed")
        elif item.waiter is not None:
            loop, future = item.waiter
            by_loop.setdefault(loop, []).append((future, error))
    for loop, futures in by_loop.items():
        with contextlib.suppress(RuntimeError):  # loop already closed: nobody is waiting
            loop.call_soon_threadsafe(_resolve, futures)


def _expire(future: asyncio.Future, limit: float) -> None:
    if not future.done():  # the writer's late answer then finds the future done and is dropped
        future.set_exception(WriterTimeout(f"the trace writer did not commit the call within {limit}s"))


def _resolve(futures: list) -> None:
    for future, error in futures:
        if future.done():
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)
